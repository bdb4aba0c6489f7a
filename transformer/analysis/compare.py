"""Compare the runs of one or more sweeps: one row per configuration, mean ± std over seeds.

A configuration is the set of runs of one identity (:mod:`transformer.config.identity`: the
resolved config without :data:`IGNORED_KEYS` and the seed). Each configuration is tested against
the baseline, and the row above, by a paired bootstrap over test sentences and seeds (Clark et al.
2011; :mod:`transformer.analysis.bootstrap`), Holm-Bonferroni adjusted; a difference within the
baseline's seed range is never significant. The method and how to read it:
docs/studies.md#comparing-runs-comparepy.

    comparison = compare_sweeps(["multirun/ladder/2026-01-01_10-00-00"])
    paths = write_outputs(comparison, "multirun/ladder/2026-01-01_10-00-00/comparison")"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformer.analysis.collect import Run, find_run_dirs, job_records, load_run, never_started
from transformer.analysis.comparability import (
    MixedField,
    MixedRunsError,
    mixed_fields,
    mixed_runs_message,
    recipe_of,
    repeated_seeds,
)
from transformer.analysis.grouping import IGNORED_KEYS, Configuration, group_runs
from transformer.analysis.length import DEFAULT_BUCKETS, Bucket, LengthTable, length_table, parse_buckets
from transformer.analysis.stats import (
    Scores,
    first_result,
    holm_bonferroni,
    kv_cache_bytes,
    mean,
    pooled_std,
    seed_range,
    significance,
    std,
)

__all__ = [
    "ALPHA",
    "CSV_COLUMNS",
    "UNTRAINED_BELOW",
    "Comparison",
    "MixedRunsError",
    "compare_sweeps",
    "describe_machine",
    "significant",
]

ALPHA = 0.05
"""The level below which an adjusted p-value is significant (starred)."""

UNTRAINED_BELOW = 1.0
"""Mean test BLEU under which a configuration is untrained (``--untrained-below``)."""

CSV_COLUMNS = (
    "label",
    "is_baseline",
    "untrained",
    "n_runs",
    "n_missing",
    "seeds",
    "test_split",
    "bleu_mean",
    "bleu_std",
    "bleu_range",
    "delta_bleu",
    "p_value",
    "p_value_holm",
    "p_value_seeds",
    "within_noise",
    "significant",
    "delta_prev_bleu",
    "p_value_prev",
    "p_value_prev_holm",
    "within_noise_prev",
    "significant_prev",
    "chrf_mean",
    "chrf_std",
    "chrf_p_value",
    "params",
    "active_params",
    "flops_per_token",
    "kv_cache_bytes_per_token",
    "train_tokens_per_s",
    "peak_memory_mb",
    "machines",
    "best_valid_mean",
    "updates_mean",
    "mixed",
    "run_dirs",
)


@dataclass
class Comparison:
    """The outcome of :func:`compare_sweeps`.

    Attributes:
        configurations: in display order; the baseline is one of them.
        rows: one dict per configuration with the :data:`CSV_COLUMNS` keys.
        baseline: the baseline's label (None when no configuration finished).
        missing: every run without results, and every expected sweep job without a folder.
        n_bootstrap: paired-bootstrap resamples (0: no significance test).
        machines: one line per distinct machine / torch / precision of the finished runs.
        noise_floor: ``{"label", "n_seeds", "std", "range", "pooled_std", "pooled_configs"}`` of the
            baseline's test BLEU over seeds (``range`` = max - min; None under two seeds) and the seed
            std pooled over configurations with two or more seeds.
        mixed: the recipe keys the runs differ in beyond the switches and the seed (``allow_mixed``).
        length, source_length: test scores per bucket of reference / source length, or None.
        unreferenced: run folders whose test references could not be read: no p-values for them.
    """

    sweep_dirs: list[Path]
    configurations: list[Configuration]
    rows: list[dict]
    baseline: str | None
    missing: list[Run]
    notes: list[str] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)
    n_bootstrap: int = 0
    machines: list[str] = field(default_factory=list)
    noise_floor: dict = field(default_factory=dict)
    mixed: list[MixedField] = field(default_factory=list)
    compare_prev: bool = True
    length: LengthTable | None = None
    unreferenced: list[Path] = field(default_factory=list)
    source_length: LengthTable | None = None
    untrained_below: float = UNTRAINED_BELOW


def significant(p_holm: float | None, within_noise: bool | None) -> bool | None:
    """Whether a comparison is significant: Holm-adjusted p under :data:`ALPHA` and not within the
    noise floor. None without a p-value."""
    return None if p_holm is None else p_holm < ALPHA and not within_noise


def describe_machine(results: dict) -> str:
    """One line naming where a run trained, from its ``results.json``."""
    hw = results.get("hardware")
    if not isinstance(hw, dict):
        return "machine not recorded (results.json without `hardware`)"
    cores = hw.get("cpu_count", "?")
    where = f"{hw.get('cpu', '?')} ({cores} core{'' if cores == 1 else 's'}, {hw.get('cpu_capability', '?')})"
    if hw.get("gpu"):
        where = f"{hw['gpu']} + {where}"
    return (
        f"{where}, torch {hw.get('torch', '?')} with {hw.get('torch_threads', '?')} thread(s), "
        f"{results.get('precision', '?')} precision, device {results.get('device', '?')}"
    )


def _pick_baseline(configs: list[Configuration], wanted: str | None) -> Configuration:
    if wanted is None:  # the first configuration as trained, before any decoded at test-time settings
        return next((c for c in configs if not c.runs[0].test_time), configs[0])
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
    allow_mixed: bool = False,
    compare_prev: bool = True,
    length_buckets: str | Sequence[Bucket] | None = DEFAULT_BUCKETS,
    length_splits: str | Sequence[str] | None = None,
    untrained_below: float = UNTRAINED_BELOW,
) -> Comparison:
    """Load every run of ``sweep_dirs``, group them into configurations and compute the table.

    Args:
        sweep_dirs: multirun folders, parents of several, or run folders.
        baseline: label (exact, or a unique case-insensitive substring); default the first
            configuration that is not an evaluation at test-time settings.
        n_bootstrap: paired-bootstrap resamples; 0 skips significance testing.
        allow_mixed: accept runs whose recipes differ beyond the switches and the seed (listed).
        compare_prev: also test each configuration against the row above; False for a branch study.
        length_buckets: buckets in words (:func:`~transformer.analysis.length.parse_buckets`); None: no
            length tables.
        length_splits: the length tables' test splits (:func:`~transformer.analysis.length.length_table`).
        untrained_below: mean test BLEU under which a configuration is untrained and left out of the
            Holm family (0: none is).

    Raises:
        FileNotFoundError: a sweep folder does not exist.
        MixedRunsError: runs differ beyond the switches and the seed (runs and fields named).
        ValueError: one seed twice in a configuration, a ``baseline`` matching none or several, bad
            ``length_buckets`` or ``length_splits``.
    """
    buckets = None if length_buckets is None else parse_buckets(length_buckets)
    sweep_dirs = [Path(d) for d in sweep_dirs]
    runs: list[Run] = []
    never: list[Run] = []
    for d in sweep_dirs:
        dirs = find_run_dirs(d)
        records = job_records(d)
        for run in map(load_run, dirs):
            record = records.get(run.run_dir)
            if not run.ok and record is not None and record.get("state") != "finished":
                run.reason = f"{record.get('state')}: {record.get('error')}; {run.reason}"  # how the job ended
            runs.append(run)
        never.extend(never_started(d, set(dirs)))
    configs, unmatched = group_runs(runs, ignore)
    rest = _placed_by_overrides(configs, unmatched + never)  # first: it adds to the configurations' missing runs
    missing = [r for c in configs for r in c.missing] + rest
    notes: list[str] = []
    signatures: dict[str, str] = {}
    if not configs:
        return Comparison(
            sweep_dirs,
            [],
            [],
            None,
            missing,
            ["no finished run found"],
            signatures,
            n_bootstrap,
            compare_prev=compare_prev,
        )
    twice = repeated_seeds(configs)
    if twice:
        raise ValueError(twice)
    mixed = mixed_fields(configs, ignore)
    if mixed and not allow_mixed:
        raise MixedRunsError(mixed_runs_message(mixed))
    base = _pick_baseline(configs, baseline)
    first = base.runs[0].results
    for key, name in (("sacrebleu_signature", "bleu"), ("chrf_signature", "chrf")):
        if first.get(key):
            signatures[name] = str(first[key])
    sig: dict[str, dict] = {}
    unreferenced: list[Path] = []
    scores = Scores(n_bootstrap, bootstrap_seed)  # each run resampled once for all the comparisons
    if n_bootstrap > 0 and len(configs) > 1:
        sig, boot_signature = significance(configs, base, n_bootstrap, bootstrap_seed, notes, unreferenced, scores)
        if boot_signature:
            signatures["bootstrap"] = boot_signature
    prev_sig: dict[str, dict] = {}
    if n_bootstrap > 0 and compare_prev:
        for prev, cur in zip(configs, configs[1:]):  # each configuration against the one before it
            pair_notes: list[str] = []
            res, _ = significance([prev, cur], prev, n_bootstrap, bootstrap_seed, pair_notes, unreferenced, scores)
            prev_sig[cur.label] = res.get(cur.label, {})
            notes.extend(f"{n} (against {prev.label})" for n in pair_notes)
    bleus_of = {c.label: [r.results["bleu"] for r in c.runs] for c in configs}  # test BLEU per seed
    untrained = {c.label for c in configs if (mean(bleus_of[c.label]) or 0.0) < untrained_below}
    if untrained:
        notes.append(
            f"untrained (mean test BLEU under {untrained_below:g}): {', '.join(sorted(untrained))}; their "
            "comparisons are left out of the Holm-Bonferroni family and never starred"
        )
    base_bleus = bleus_of[base.label]
    base_bleu = mean(base_bleus)
    pooled, pooled_configs = pooled_std(list(bleus_of.values()))
    noise = {
        "label": base.label,
        "n_seeds": len(base.runs),
        "std": std(base_bleus),
        "range": seed_range(base_bleus),
        "pooled_std": pooled,
        "pooled_configs": pooled_configs,
    }
    family: dict[tuple[str, str], float | None] = {}  # the table's comparisons, each once
    for i, c in enumerate(configs):
        if c is not base and not {c.label, base.label} & untrained:
            family[("base", c.label)] = sig.get(c.label, {}).get("p_value")
        prev = configs[i - 1] if i > 0 else None  # against the baseline: counted above
        if compare_prev and prev is not None and prev is not base and not {c.label, prev.label} & untrained:
            family[("prev", c.label)] = prev_sig.get(c.label, {}).get("p_value")
    holm = holm_bonferroni(family)

    def within(delta: float | None) -> bool | None:
        return None if delta is None or noise["range"] is None else abs(delta) <= noise["range"]

    mixed_keys = [m.key for m in mixed]
    prev_bleu: float | None = None
    rows = []
    for c in configs:
        bleus = bleus_of[c.label]
        chrfs = [r.results.get("chrf") for r in c.runs]
        bleu_mean = mean(bleus)
        s = sig.get(c.label, {})
        delta_prev = None if prev_bleu is None or bleu_mean is None else bleu_mean - prev_bleu
        no_prev, prev_bleu = not rows or not compare_prev, bleu_mean  # no row above to compare with
        delta = None if c is base or bleu_mean is None or base_bleu is None else bleu_mean - base_bleu
        prev_is_base = not no_prev and configs[len(rows) - 1] is base
        prev_holm = holm.get(("base", c.label)) if prev_is_base else holm.get(("prev", c.label))
        noisy, noisy_prev = within(delta), None if no_prev else within(delta_prev)
        # speed and memory average only over one machine and software (describe_machine: CPU and its
        # vector extensions, GPU, torch build, threads, precision, device): a mean of, say, a GPU's and
        # one CPU core's tokens/s means nothing
        n_machines = len({describe_machine(r.results) for r in c.runs})
        rows.append(
            {
                "label": c.label,
                "is_baseline": c is base,
                "untrained": c.label in untrained,
                "n_runs": len(c.runs),
                "n_missing": len(c.missing),
                "seeds": " ".join(str(r.seed) for r in c.runs),
                "test_split": c.runs[0].test_split,
                "bleu_mean": bleu_mean,
                "bleu_std": std(bleus),
                "bleu_range": seed_range(bleus),
                "delta_bleu": delta,
                "p_value": s.get("p_value"),
                "p_value_holm": holm.get(("base", c.label)),
                "p_value_seeds": s.get("p_value_seeds", ""),
                "within_noise": noisy,
                "significant": significant(holm.get(("base", c.label)), noisy),
                "delta_prev_bleu": None if no_prev else delta_prev,
                "p_value_prev": prev_sig.get(c.label, {}).get("p_value"),
                "p_value_prev_holm": None if no_prev else prev_holm,
                "within_noise_prev": noisy_prev,
                "significant_prev": None if no_prev else significant(prev_holm, noisy_prev),
                "chrf_mean": mean(chrfs),
                "chrf_std": std(chrfs),
                "chrf_p_value": s.get("chrf_p_value"),
                "params": first_result(c.runs, "params"),
                # per token (a mixture of experts: top_k routed experts); runs older than the key are dense
                "active_params": first_result(c.runs, "active_params") or first_result(c.runs, "params"),
                "flops_per_token": first_result(c.runs, "flops_per_token"),
                "kv_cache_bytes_per_token": kv_cache_bytes(c.config),
                "train_tokens_per_s": mean([r.results.get("train_tokens_per_s") for r in c.runs])
                if n_machines == 1
                else None,
                "peak_memory_mb": mean([r.results.get("peak_memory_mb") for r in c.runs]) if n_machines == 1 else None,
                "machines": n_machines,
                "best_valid_mean": mean([r.results.get("best_valid") for r in c.runs]),
                "updates_mean": mean([r.results.get("updates") for r in c.runs]),
                "mixed": _mixed_values(c, mixed_keys),
                "run_dirs": " ".join(str(r.run_dir) for r in c.runs),
            }
        )
    splits = {r["test_split"] for r in rows}
    if len(splits) > 1:
        notes.append(f"configurations were tested on different splits: {', '.join(sorted(map(str, splits)))}")
    machines = sorted({describe_machine(r.results) for c in configs for r in c.runs})
    if any(row["machines"] > 1 for row in rows):
        notes.append(
            "Train tok/s and Peak MB are shown only for a configuration whose runs trained on one machine "
            'and software ("mixed": its seeds differ in CPU, GPU, torch build, threads or device, whose '
            "speeds do not average); runs.csv has each run's, with its machine"
        )
    if mixed:
        notes.append("runs trained differently are compared (--allow-mixed): " + "; ".join(m.sentence() for m in mixed))
    length = source_length = None
    if buckets is not None:  # by the reference's length, and by the source's (what a model is given)
        length = length_table(configs, base, buckets, length_splits, n_bootstrap, bootstrap_seed)
        source_length = length_table(configs, base, buckets, length_splits, n_bootstrap, bootstrap_seed, by="source")
    return Comparison(
        sweep_dirs,
        configs,
        rows,
        base.label,
        missing,
        notes,
        signatures,
        n_bootstrap,
        machines,
        noise,
        mixed,
        compare_prev,
        length,
        unreferenced,
        source_length=source_length,
        untrained_below=untrained_below,
    )


def _without_seed(overrides: Sequence[str]) -> frozenset[str]:
    return frozenset(o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "seed" and not o.startswith("hydra"))


def _placed_by_overrides(configs: list[Configuration], runs: list[Run]) -> list[Run]:
    """Each run without a config (a job that left no folder, or no readable config) that the
    overrides of one configuration's runs name but for the seed joins that configuration's missing
    runs (its row reads 2/3); the others are returned."""
    rest = []
    for run in runs:
        key = _without_seed(run.overrides)
        homes = [c for c in configs if any(_without_seed(r.overrides) == key for r in c.runs)]
        if run.config is None and run.overrides and len(homes) == 1:
            homes[0].missing.append(run)
        else:
            rest.append(run)
    return rest


def _mixed_values(config: Configuration, keys: Sequence[str]) -> str:
    """``key=value`` of each mixed recipe key for the runs of ``config`` (several values joined by ``/``)."""
    from_runs = [recipe_of(r) for r in config.runs]
    parts = []
    for key in keys:
        values = sorted({str(rec.get(key, "missing")) for rec in from_runs})
        parts.append(f"{key}={'/'.join(values)}")
    return " ".join(parts)
