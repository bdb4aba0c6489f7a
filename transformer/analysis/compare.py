"""Compare the runs of one or more sweeps: one row per configuration, mean ± std over seeds.

A *run* is a folder written by ``scripts/train.py`` (``results.json``, ``metrics.jsonl``,
``hyps/{test_split}.txt``, ``config.yaml``). A *configuration* is the set of runs whose resolved
config is the same once the keys in :data:`IGNORED_KEYS` (the seed, paths, logging) are removed,
so a sweep ``ladder=step0,...,step6 seed=1,2,3`` gives seven configurations of three runs each.

Runs without ``results.json`` (crashed, unfinished, still running) and sweep jobs whose folder
was never created are kept in :attr:`Comparison.missing` and listed in every output.

Significance: each configuration's test hypotheses are compared with the baseline's by sacreBLEU's
paired bootstrap resampling (:func:`transformer.evaluation.paired_bootstrap`) on the test split's
references, once per *seed pair*: runs with the same seed are paired (when the two configurations
share no seed, the i-th seeds in sorted order are paired). The reported ``p_value`` is the largest
p-value over the seed pairs, i.e. a configuration is significant at level α only when it is
significant against the baseline in every seed pair; the per-pair values are kept in
``p_value_seeds``. (Concatenating the seeds' outputs into one corpus would count every test
sentence several times and overstate significance.)

    from transformer.analysis import compare_sweeps, write_outputs
    comparison = compare_sweeps(["multirun/ladder/2026-01-01_10-00-00"])
    paths = write_outputs(comparison, "multirun/ladder/2026-01-01_10-00-00/comparison")
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = [
    "IGNORED_KEYS",
    "Comparison",
    "Configuration",
    "Run",
    "compare_sweeps",
    "expected_jobs",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "to_markdown",
    "write_csv",
    "write_outputs",
]

# Resolved-config keys (dotted; a key also covers everything below it) that do not define a
# configuration: the seed, where files live, and how a run reports progress.
IGNORED_KEYS: tuple[str, ...] = (
    "seed",
    "run_dir",
    "data.root",
    "data.cache_dir",
    "data.download",
    "train.device",
    "train.num_threads",
    "train.progress",
    "train.resume",
    "train.log_every",
    "logger",
)

# Choices shown first when they name a configuration.
_LABEL_CHOICES = ("ladder", "experiment", "model")
_RUN_MARKERS = ("results.json", "metrics.jsonl", "config.yaml", ".hydra")

CSV_COLUMNS = (
    "label", "is_baseline", "n_runs", "n_missing", "seeds", "test_split",
    "bleu_mean", "bleu_std", "delta_bleu", "p_value", "p_value_seeds", "chrf_mean", "chrf_std",
    "chrf_p_value", "params", "flops_per_token", "kv_cache_bytes_per_token",
    "train_tokens_per_s", "peak_memory_mb", "best_valid_mean", "updates_mean", "run_dirs",
)


# ----------------------------------------------------------------------------- data classes


@dataclass
class Run:
    """One run folder.

    Attributes:
        run_dir: the folder.
        results: ``results.json`` (None when the run has none).
        config: the resolved config (from ``results.json``, else ``config.yaml``, else Hydra's
            ``.hydra/config.yaml``), None when none is readable.
        choices: Hydra group choices (``{"ladder": "step3_swiglu", "model": ...}``).
        overrides: the command-line overrides of the job (``.hydra/overrides.yaml``).
        metrics: the records of ``metrics.jsonl`` (a torn last line is skipped).
        reason: why the run has no results (None for a finished run).
    """

    run_dir: Path
    results: dict | None = None
    config: dict | None = None
    choices: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the run finished (has ``results.json`` with a BLEU score)."""
        return self.results is not None and self.results.get("bleu") is not None

    @property
    def seed(self) -> int | None:
        if self.config is not None and self.config.get("seed") is not None:
            return int(self.config["seed"])
        for o in self.overrides:
            if o.startswith("seed="):
                try:
                    return int(o.split("=", 1)[1])
                except ValueError:
                    return None
        return None

    @property
    def test_split(self) -> str | None:
        return None if self.results is None else self.results.get("test_split")

    def hyps_path(self) -> Path | None:
        """The test hypotheses file, None when absent."""
        split = self.test_split
        path = self.run_dir / "hyps" / f"{split}.txt"
        return path if split and path.is_file() else None

    def valid_curve(self, metric: str) -> list[tuple[int, float]]:
        """``[(update, value)]`` of the validation records that carry ``metric``."""
        return [
            (int(m["update"]), float(m[metric]))
            for m in self.metrics
            if m.get("split") == "valid" and isinstance(m.get(metric), (int, float)) and "update" in m
        ]


@dataclass
class Configuration:
    """The runs of one configuration (all seeds), finished and missing."""

    key: str
    label: str
    config: dict | None
    choices: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    missing: list[Run] = field(default_factory=list)


@dataclass
class Comparison:
    """The outcome of :func:`compare_sweeps`.

    Attributes:
        sweep_dirs: the folders read.
        configurations: in display order; the baseline is one of them.
        rows: one dict per configuration with the :data:`CSV_COLUMNS` keys.
        baseline: the baseline's label (None when no configuration finished).
        missing: every run without results, and every expected sweep job without a folder.
        notes: sentences about anything that could not be computed.
        signatures: sacreBLEU signatures of the BLEU / chrF scores and of the bootstrap.
    """

    sweep_dirs: list[Path]
    configurations: list[Configuration]
    rows: list[dict]
    baseline: str | None
    missing: list[Run]
    notes: list[str] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)
    n_bootstrap: int = 0


# ----------------------------------------------------------------------------- loading


def _natural_key(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]


def _is_run_dir(path: Path) -> bool:
    return any((path / m).exists() for m in _RUN_MARKERS)


def find_run_dirs(sweep_dir: str | Path) -> list[Path]:
    """Every run folder at or below ``sweep_dir`` (hidden folders skipped), in natural order.

    A run folder holds ``results.json``, ``metrics.jsonl``, ``config.yaml`` or ``.hydra/``; its
    own subfolders are not searched.

    Raises:
        FileNotFoundError: ``sweep_dir`` is not a folder.
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep folder not found: {root}")
    if _is_run_dir(root):
        return [root]
    found: list[Path] = []
    for child in sorted(root.iterdir(), key=lambda p: _natural_key(p.name)):
        if child.is_dir() and not child.name.startswith("."):
            found.extend(find_run_dirs(child))
    return found


def _load_yaml(path: Path, resolve: bool = True) -> Any:
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(node, resolve=resolve)
    except Exception:  # interpolations that need Hydra's resolvers
        return OmegaConf.to_container(node, resolve=False)


def _read_metrics(path: Path) -> list[dict]:
    records = []
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a crash
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _last_log_line(run_dir: Path) -> str | None:
    for log in sorted(run_dir.glob("*.log")):
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1][:200]
    return None


def load_run(run_dir: str | Path) -> Run:
    """Read one run folder; never raises for missing or damaged files (see :attr:`Run.reason`)."""
    run_dir = Path(run_dir)
    run = Run(run_dir=run_dir)
    res_path = run_dir / "results.json"
    problems = []
    if res_path.is_file():
        try:
            run.results = json.loads(res_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.append(f"unreadable results.json ({e})")
    hydra_dir = run_dir / ".hydra"
    if (hydra_dir / "overrides.yaml").is_file():
        try:
            run.overrides = [str(o) for o in (_load_yaml(hydra_dir / "overrides.yaml", resolve=False) or [])]
        except Exception:
            pass
    if run.results is not None and isinstance(run.results.get("config"), dict):
        run.config = run.results["config"]
    else:
        for path in (run_dir / "config.yaml", hydra_dir / "config.yaml"):
            if path.is_file():
                try:
                    run.config = _load_yaml(path)
                    break
                except Exception:
                    continue
    if run.results is not None and isinstance(run.results.get("choices"), dict):
        run.choices = {str(k): str(v) for k, v in run.results["choices"].items()}
    elif (hydra_dir / "hydra.yaml").is_file():
        try:
            hcfg = _load_yaml(hydra_dir / "hydra.yaml", resolve=False)
            choices = hcfg["hydra"]["runtime"]["choices"]
            run.choices = {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra") and v is not None}
        except Exception:
            pass
    run.metrics = _read_metrics(run_dir / "metrics.jsonl")
    if not run.ok:
        if run.results is not None:
            problems.append("results.json has no BLEU")
        elif not problems:
            updates = [m["update"] for m in run.metrics if isinstance(m.get("update"), int)]
            problems.append(
                f"no results.json (last logged update {max(updates)})" if updates else "no results.json, no metrics logged"
            )
        last = _last_log_line(run_dir)
        if last:
            problems.append(f"log ends with: {last}")
        run.reason = "; ".join(problems)
    return run


def expected_jobs(sweep_dir: str | Path) -> list[list[str]] | None:
    """The override lists of the jobs a Hydra basic-sweeper multirun launched (job number = index).

    Rebuilt from ``multirun.yaml`` the way Hydra's ``BasicSweeper`` builds them: its
    ``hydra.sweeper.params`` then the command-line overrides, cartesian product in that key order.

    Returns:
        The jobs' overrides, or None when ``sweep_dir`` has no ``multirun.yaml`` or another
        sweeper ran.
    """
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        hcfg = _load_yaml(path, resolve=False)["hydra"]
        if "BasicSweeper" not in str(hcfg["sweeper"].get("_target_", "")):
            return None
        params = [f"{k}={v}" for k, v in (hcfg["sweeper"].get("params") or {}).items()]
        params += [str(o) for o in hcfg["overrides"]["task"]]
        overrides = OverridesParser.create().parse_overrides(params)
        batches = BasicSweeper.split_arguments(overrides, None)
        return [list(job) for batch in batches for job in batch]
    except Exception:
        return None


def _never_started(sweep_dir: Path, found: set[Path]) -> list[Run]:
    """Expected jobs of a multirun whose ``<sweep>/<job_num>`` folder does not exist."""
    jobs = expected_jobs(sweep_dir)
    if jobs is None:
        return []
    try:
        subdir = str(_load_yaml(sweep_dir / "multirun.yaml", resolve=False)["hydra"]["sweep"]["subdir"])
    except Exception:
        return []
    if subdir.replace(" ", "") != "${hydra.job.num}":
        return []
    out = []
    for num, overrides in enumerate(jobs):
        run_dir = sweep_dir / str(num)
        if run_dir not in found:
            out.append(Run(run_dir=run_dir, overrides=overrides, reason="job folder missing (never started)"))
    return out


# ----------------------------------------------------------------------------- grouping


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _ignored(key: str, ignore: Sequence[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in ignore)


def _config_key(config: dict, ignore: Sequence[str]) -> str:
    flat = {k: v for k, v in _flatten(config).items() if not _ignored(k, ignore)}
    return json.dumps(flat, sort_keys=True, default=str)


def _fmt_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _labels(configs: list[Configuration]) -> None:
    """Name each configuration by the choices (then config values) that differ between them."""
    if len(configs) == 1:
        c = configs[0]
        c.label = next((c.choices[k] for k in _LABEL_CHOICES if k in c.choices), "run")
        return
    keys = sorted({k for c in configs for k in c.choices})
    varying = [k for k in keys if len({c.choices.get(k) for c in configs}) > 1]
    for k in _LABEL_CHOICES:  # a naming choice (a ladder step) that alone tells them apart names them
        if k in varying and len({c.choices.get(k) for c in configs}) == len(configs):
            for c in configs:
                c.label = str(c.choices.get(k, "none"))
            return
    for c in configs:
        parts = [(k, c.choices.get(k, "none")) for k in varying]
        if not parts:  # same choices: name by the main one, config values are added below
            c.label = next((c.choices[k] for k in _LABEL_CHOICES if k in c.choices), "")
        else:
            c.label = parts[0][1] if len(parts) == 1 else ", ".join(f"{k.split('/')[-1]}={v}" for k, v in parts)
    by_label: dict[str, list[Configuration]] = {}
    for c in configs:
        by_label.setdefault(c.label, []).append(c)
    for same in by_label.values():
        if len(same) < 2:
            continue
        flats = [json.loads(c.key) for c in same]
        diff = sorted({k for f in flats for k in f if len({json.dumps(g.get(k), default=str) for g in flats}) > 1})
        for c, f in zip(same, flats):
            extra = ", ".join(f"{k}={_fmt_value(f.get(k))}" for k in diff)
            c.label = f"{c.label}, {extra}" if c.label else extra
    seen: dict[str, int] = {}
    for c in configs:  # last resort: identical labels get a counter
        n = seen.get(c.label, 0)
        seen[c.label] = n + 1
        if n:
            c.label = f"{c.label} #{n + 1}"
    for c in configs:
        c.label = c.label or "run"


def group_runs(runs: Iterable[Run], ignore: Sequence[str] = IGNORED_KEYS) -> tuple[list[Configuration], list[Run]]:
    """Group runs into configurations (config equal up to ``ignore``), labelled and ordered.

    Order: by the ``ladder`` choice (natural order) when every configuration has one, else by first
    appearance. Unfinished runs join the configuration of their config; those without a readable
    config, or whose configuration has no finished run, are returned separately.

    Returns:
        ``(configurations, unmatched_missing_runs)``; configurations without a finished run are
        left out of the first list (their runs are in the second).
    """
    runs = list(runs)
    groups: dict[str, Configuration] = {}
    unmatched: list[Run] = []
    for run in runs:
        if run.config is None:
            unmatched.append(run)
            continue
        key = _config_key(run.config, ignore)
        if key not in groups:
            groups[key] = Configuration(key=key, label="", config=run.config, choices=dict(run.choices))
        c = groups[key]
        if run.ok:
            c.runs.append(run)
            if not c.runs[:-1]:  # the first finished run defines the displayed choices/config
                c.config, c.choices = run.config, dict(run.choices)
        else:
            c.missing.append(run)
    configs = [c for c in groups.values() if c.runs]
    for c in groups.values():
        if not c.runs:
            unmatched.extend(c.missing)
            c.missing = []
    _labels(configs)
    if configs and all("ladder" in c.choices for c in configs):
        configs.sort(key=lambda c: _natural_key(c.choices["ladder"]))
    for c in configs:
        c.runs.sort(key=lambda r: (r.seed is None, r.seed or 0, _natural_key(str(r.run_dir))))
    return configs, unmatched


# ----------------------------------------------------------------------------- statistics


def _mean(values: Sequence[float]) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.fmean(values) if values else None


def _std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1); None for fewer than two values."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.stdev(values) if len(values) >= 2 else None


def _first(runs: Sequence[Run], key: str) -> Any:
    return next((r.results[key] for r in runs if r.results and r.results.get(key) is not None), None)


def _kv_bytes(config: dict | None) -> int | None:
    if not config or "model" not in config:
        return None
    try:
        from omegaconf import OmegaConf

        from transformer.models.flops import kv_cache_bytes_per_token

        return int(kv_cache_bytes_per_token(OmegaConf.create(config["model"])))
    except Exception:
        return None


_REF_CACHE: dict[tuple[str, str], list[str]] = {}


def _references(run: Run) -> list[str]:
    """The raw references of ``run``'s test split, as the trainer scored them (empty pairs dropped)."""
    from omegaconf import OmegaConf

    from transformer.data.corpus import read_parallel, resolve_split_files

    data = run.config["data"]
    cache_key = (json.dumps(data, sort_keys=True, default=str), str(run.test_split))
    if cache_key not in _REF_CACHE:
        src, tgt = resolve_split_files(OmegaConf.create(data), run.test_split, download=False)
        _REF_CACHE[cache_key] = read_parallel(src, tgt)[1]
    return _REF_CACHE[cache_key]


def _same_test_set(a: Run, b: Run) -> bool:
    strip = ("root", "cache_dir", "download")
    da = {k: v for k, v in a.config.get("data", {}).items() if k not in strip}
    db = {k: v for k, v in b.config.get("data", {}).items() if k not in strip}
    return a.test_split == b.test_split and da == db


def _seed_pairs(base: list[Run], other: list[Run]) -> list[tuple[Run, Run]]:
    """Seed-matched pairs; when no seed is shared, the i-th runs in seed order."""
    by_seed = {r.seed: r for r in other}
    pairs = [(b, by_seed[b.seed]) for b in base if b.seed in by_seed]
    return pairs or list(zip(base, other))


def _significance(
    configs: list[Configuration], baseline: Configuration, n_samples: int, seed: int, notes: list[str]
) -> tuple[dict[str, dict], str | None]:
    """Paired bootstrap of every configuration against the baseline, per seed pair.

    Returns:
        ``({label: {"p_value", "chrf_p_value", "p_value_seeds"}}, bootstrap BLEU signature)``.
    """
    from transformer.evaluation.metrics import paired_bootstrap

    out: dict[str, dict] = {}
    # baseline run -> {label: (hyps, system run)}
    systems: dict[Path, dict[str, list[str]]] = {}
    base_runs: dict[Path, Run] = {}
    seed_of_pair: dict[tuple[Path, str], str] = {}
    for c in configs:
        if c is baseline:
            continue
        pairs = _seed_pairs(baseline.runs, c.runs)
        for b, s in pairs:
            if not _same_test_set(b, s):
                notes.append(f"{c.label}: test set differs from the baseline's ({s.test_split} vs {b.test_split}); no p-value")
                break
            if s.hyps_path() is None or b.hyps_path() is None:
                missing = s if s.hyps_path() is None else b
                notes.append(f"{c.label}: no test hypotheses in {missing.run_dir}; seed pair skipped")
                continue
            systems.setdefault(b.run_dir, {})[c.label] = s.hyps_path().read_text(encoding="utf-8").splitlines()
            base_runs[b.run_dir] = b
            seed_of_pair[(b.run_dir, c.label)] = str(b.seed) if b.seed == s.seed else f"{b.seed}/{s.seed}"
    signature = None
    per_label: dict[str, list[tuple[str, float | None, float | None]]] = {}
    for b_dir, sys_hyps in systems.items():
        b = base_runs[b_dir]
        try:
            refs = _references(b)
        except Exception as e:  # references not on this machine
            notes.append(f"references of {b.test_split} not found for {b.run_dir} ({e}); no p-values for seed {b.seed}")
            continue
        base_hyps = b.hyps_path().read_text(encoding="utf-8").splitlines()
        ok = {}
        for label, hyps in sys_hyps.items():
            if len(hyps) != len(refs) or len(base_hyps) != len(refs):
                notes.append(
                    f"{label}: {len(hyps)} hypotheses / {len(base_hyps)} baseline hypotheses but {len(refs)} "
                    f"references in {b.test_split}; seed pair skipped"
                )
            else:
                ok[label] = hyps
        for label in [k for k, v in ok.items() if v == base_hyps]:
            # sacreBLEU counts only strictly larger resampled differences, so identical outputs
            # would get p = 1/(n+1); no difference at all is p = 1.
            notes.append(f"{label}: test hypotheses identical to the baseline's for seed {seed_of_pair[(b_dir, label)]}; p = 1")
            per_label.setdefault(label, []).append((seed_of_pair[(b_dir, label)], 1.0, 1.0))
            del ok[label]
        if not ok:
            continue
        tokenize = str(b.config["data"].get("bleu_tokenize", "13a"))
        lowercase = bool(b.config["data"].get("lowercase", False))
        res = paired_bootstrap(base_hyps, ok, refs, n_samples=n_samples, seed=seed, tokenize=tokenize, lowercase=lowercase)
        signature = signature or res["baseline"]["signatures"]["bleu"]
        for label in ok:
            per_label.setdefault(label, []).append(
                (seed_of_pair[(b_dir, label)], res[label]["bleu_p_value"], res[label]["chrf_p_value"])
            )
    for label, vals in per_label.items():
        bleu_p = [p for _, p, _ in vals if p is not None]
        chrf_p = [p for _, _, p in vals if p is not None]
        out[label] = {
            "p_value": max(bleu_p) if bleu_p else None,
            "chrf_p_value": max(chrf_p) if chrf_p else None,
            "p_value_seeds": " ".join(f"{s}:{p:.4f}" for s, p, _ in vals if p is not None),
        }
    return out, signature


def _pick_baseline(configs: list[Configuration], wanted: str | None) -> Configuration:
    if wanted is None:
        return configs[0]
    labels = [c.label for c in configs]
    exact = [c for c in configs if c.label == wanted]
    if exact:
        return exact[0]
    partial = [c for c in configs if wanted.lower() in c.label.lower()]
    if len(partial) == 1:
        return partial[0]
    what = "matches several configurations" if partial else "matches no configuration"
    raise ValueError(f"baseline {wanted!r} {what}; configurations: {', '.join(labels)}")


def compare_sweeps(
    sweep_dirs: Sequence[str | Path],
    baseline: str | None = None,
    n_bootstrap: int = 1000,
    bootstrap_seed: int = 12345,
    ignore: Sequence[str] = IGNORED_KEYS,
) -> Comparison:
    """Load every run of ``sweep_dirs``, group them into configurations and compute the table.

    Args:
        sweep_dirs: multirun folders (or parents of several, or single run folders).
        baseline: label (exact, or a unique case-insensitive substring) of the baseline
            configuration; default the first configuration (ladder order, else first appearance).
        n_bootstrap: paired-bootstrap resamples; 0 skips significance testing.
        bootstrap_seed: seed of the resampling.
        ignore: config keys that do not define a configuration (default :data:`IGNORED_KEYS`).

    Returns:
        A :class:`Comparison`.

    Raises:
        FileNotFoundError: a sweep folder does not exist.
        ValueError: ``baseline`` names no (or several) configurations.
    """
    sweep_dirs = [Path(d) for d in sweep_dirs]
    runs: list[Run] = []
    never: list[Run] = []
    for d in sweep_dirs:
        dirs = find_run_dirs(d)
        runs.extend(load_run(p) for p in dirs)
        never.extend(_never_started(d, set(dirs)))
    configs, unmatched = group_runs(runs, ignore)
    missing = [r for c in configs for r in c.missing] + unmatched + never
    notes: list[str] = []
    signatures: dict[str, str] = {}
    if not configs:
        return Comparison(sweep_dirs, [], [], None, missing, ["no finished run found"], signatures, n_bootstrap)
    base = _pick_baseline(configs, baseline)
    first = base.runs[0].results
    for key, name in (("sacrebleu_signature", "bleu"), ("chrf_signature", "chrf")):
        if first.get(key):
            signatures[name] = str(first[key])
    sig: dict[str, dict] = {}
    if n_bootstrap > 0 and len(configs) > 1:
        sig, boot_signature = _significance(configs, base, n_bootstrap, bootstrap_seed, notes)
        if boot_signature:
            signatures["bootstrap"] = boot_signature
    base_bleu = _mean([r.results["bleu"] for r in base.runs])
    rows = []
    for c in configs:
        bleus = [r.results["bleu"] for r in c.runs]
        chrfs = [r.results.get("chrf") for r in c.runs]
        bleu_mean = _mean(bleus)
        s = sig.get(c.label, {})
        rows.append(
            {
                "label": c.label,
                "is_baseline": c is base,
                "n_runs": len(c.runs),
                "n_missing": len(c.missing),
                "seeds": " ".join(str(r.seed) for r in c.runs),
                "test_split": c.runs[0].test_split,
                "bleu_mean": bleu_mean,
                "bleu_std": _std(bleus),
                "delta_bleu": None if c is base or bleu_mean is None or base_bleu is None else bleu_mean - base_bleu,
                "p_value": s.get("p_value"),
                "p_value_seeds": s.get("p_value_seeds", ""),
                "chrf_mean": _mean(chrfs),
                "chrf_std": _std(chrfs),
                "chrf_p_value": s.get("chrf_p_value"),
                "params": _first(c.runs, "params"),
                "flops_per_token": _first(c.runs, "flops_per_token"),
                "kv_cache_bytes_per_token": _kv_bytes(c.config),
                "train_tokens_per_s": _mean([r.results.get("train_tokens_per_s") for r in c.runs]),
                "peak_memory_mb": _mean([r.results.get("peak_memory_mb") for r in c.runs]),
                "best_valid_mean": _mean([r.results.get("best_valid") for r in c.runs]),
                "updates_mean": _mean([r.results.get("updates") for r in c.runs]),
                "run_dirs": " ".join(str(r.run_dir) for r in c.runs),
            }
        )
    splits = {r["test_split"] for r in rows}
    if len(splits) > 1:
        notes.append(f"configurations were tested on different splits: {', '.join(sorted(map(str, splits)))}")
    return Comparison(sweep_dirs, configs, rows, base.label, missing, notes, signatures, n_bootstrap)


# ----------------------------------------------------------------------------- writing


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.2f}{suffix}{unit}"
    return f"{value:.0f}{unit}" if float(value).is_integer() else f"{value:.2f}{unit}"


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _p(row: dict) -> str:
    if row["is_baseline"]:
        return "baseline"
    p = row["p_value"]
    if p is None:
        return "n/a"
    return f"{p:.4f}" + ("*" if p < 0.05 else "")


def _missing_line(run: Run) -> str:
    what = " ".join(o for o in run.overrides if not o.startswith(("data.", "model.", "train.", "generation.", "lr_scheduler.", "hydra.")))
    where = f"`{run.run_dir}`"
    return f"- {where}{f' ({what})' if what else ''}: {run.reason}"


def to_markdown(comparison: Comparison, plots: Sequence[str] = ()) -> str:
    """The comparison as a markdown document: table, notes, runs without results, plots."""
    c = comparison
    lines = ["# Comparison", ""]
    lines.append("Sweeps: " + ", ".join(f"`{d}`" for d in c.sweep_dirs))
    if c.rows:
        split = c.rows[0]["test_split"]
        lines.append(f"Test split: `{split}`; baseline: **{c.baseline}**.")
        for name, sig in c.signatures.items():
            lines.append(f"- {name} signature: `{sig}`")
    lines.append("")
    header = (
        "| Configuration | Runs | BLEU | ΔBLEU | p (BLEU) | chrF | Params | FLOPs/token | KV-cache B/token "
        "| Train tok/s | Peak MB |"
    )
    lines += [header, "|" + "|".join(["---"] + ["---:"] * 10) + "|"]
    for r in c.rows:
        runs = f"{r['n_runs']}/{r['n_runs'] + r['n_missing']}"
        mem = "n/a" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f}"
        delta = "" if r["delta_bleu"] is None else f"{r['delta_bleu']:+.2f}"
        lines.append(
            f"| {r['label']}{' (baseline)' if r['is_baseline'] else ''} | {runs} | {_pm(r['bleu_mean'], r['bleu_std'])} "
            f"| {delta} | {_p(r)} | {_pm(r['chrf_mean'], r['chrf_std'])} | {_si(r['params'])} "
            f"| {_si(r['flops_per_token'])} | {_si(r['kv_cache_bytes_per_token'])} "
            f"| {_si(r['train_tokens_per_s'])} | {mem} |"
        )
    lines += [
        "",
        "BLEU and chrF: mean ± sample standard deviation over seeds (Runs: finished/all). "
        f"p: sacreBLEU paired bootstrap ({c.n_bootstrap} resamples) of the test hypotheses against the "
        "baseline's, per seed-matched pair of runs; the largest p over the pairs is shown (* p < 0.05). "
        "FLOPs/token: forward matmul FLOPs per target token (16-token sentences); KV-cache: fp32 bytes "
        "per generated token over all decoder layers.",
    ]
    if c.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in c.notes]
    lines += ["", f"## Runs without results ({len(c.missing)})", ""]
    lines += [_missing_line(r) for r in c.missing] or ["None: every run finished."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_csv(comparison: Comparison, path: str | Path) -> Path:
    """One row per configuration (:data:`CSV_COLUMNS`), then one row per run without results
    (``label`` = ``MISSING``, ``run_dirs`` = its folder, ``p_value_seeds`` = the reason)."""
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in comparison.rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    runs_path = path.with_name("runs.csv")
    with runs_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["configuration", "seed", "status", "bleu", "chrf", "updates", "run_dir", "reason"])
        for c in comparison.configurations:
            for r in c.runs:
                w.writerow([c.label, r.seed, "ok", r.results["bleu"], r.results.get("chrf"), r.results.get("updates"), r.run_dir, ""])
        labels = {id(r): c.label for c in comparison.configurations for r in c.missing}
        for r in comparison.missing:
            w.writerow([labels.get(id(r), ""), r.seed, "missing", "", "", "", r.run_dir, r.reason])
    return path


def write_outputs(comparison: Comparison, out_dir: str | Path) -> dict[str, Path]:
    """Write ``comparison.md``, ``comparison.csv``, ``runs.csv``, ``valid_curves.png`` and
    ``bleu_bars.png`` into ``out_dir`` (created).

    Returns:
        ``{"markdown", "csv", "runs_csv", "valid_curves", "bleu_bars"}`` -> path (plots only when
        some configuration finished).
    """
    from transformer.analysis.plots import plot_bleu_bars, plot_validation_curves

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if comparison.rows:
        paths["valid_curves"] = plot_validation_curves(comparison, out / "valid_curves.png")
        paths["bleu_bars"] = plot_bleu_bars(comparison, out / "bleu_bars.png")
    paths["csv"] = write_csv(comparison, out / "comparison.csv")
    paths["runs_csv"] = out / "runs.csv"
    md = out / "comparison.md"
    md.write_text(to_markdown(comparison, [str(paths[k]) for k in ("valid_curves", "bleu_bars") if k in paths]), encoding="utf-8")
    paths["markdown"] = md
    return paths

