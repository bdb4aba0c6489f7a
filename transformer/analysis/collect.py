"""Run folders of a sweep: finding them, reading each one (:class:`Run`), and the jobs a Hydra
multirun launched but never started. A run is a training run's folder or an evaluation's (the
model as evaluated, :attr:`Run.test_time`); reading never raises: a run without results carries
the reason in :attr:`Run.reason`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from transformer.config import upgrade_config
from transformer.runs.folder import job_records_of, references_file

__all__ = ["Run", "expected_jobs", "find_run_dirs", "job_records", "load_run", "natural_key", "never_started"]

_RUN_MARKERS = ("results.json", "metrics.jsonl", "config.yaml", ".hydra")


@dataclass
class Run:
    """One run folder.

    Attributes:
        results: ``results.json``, or None.
        config: the resolved config (``results.json``, ``config.yaml`` or ``.hydra/config.yaml``), or None.
        choices: Hydra group choices (``{"ladder": "step3_swiglu", ...}``).
        overrides: the job's command-line overrides.
        metrics: the records of ``metrics.jsonl`` (a torn last line skipped).
        reason: why the run has no results (None when finished).
        evaluation: whether the folder is an evaluation, not a training run.
    """

    run_dir: Path
    results: dict | None = None
    config: dict | None = None
    choices: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    reason: str | None = None
    evaluation: bool = False

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
    def trained_config(self) -> dict | None:
        """:attr:`config` with ``train.precision`` as the run resolved it (``results["precision"]``):
        ``auto`` means fp32 on one machine and bf16 on another, so runs are compared by what they ran."""
        if self.config is None:
            return None
        resolved = (self.results or {}).get("precision")
        if not resolved or not isinstance(self.config.get("train"), dict):
            return self.config
        return {**self.config, "train": {**self.config["train"], "precision": resolved}}

    @property
    def test_split(self) -> str | None:
        return None if self.results is None else self.results.get("test_split")

    def hyps_path(self, split: str | None = None) -> Path | None:
        """The hypotheses file of test split ``split`` (default :attr:`test_split`), None when absent."""
        split = split or self.test_split
        path = self.run_dir / f"{split}.txt" if self.evaluation else self.run_dir / "hyps" / f"{split}.txt"
        return path if split and path.is_file() else None

    def refs_path(self, split: str | None = None) -> Path | None:
        """``hyps/<split>.ref``, the references the split's hypotheses were scored against, or None when
        the folder holds none (they are then read from the data)."""
        hyps = self.hyps_path(split)
        path = None if hyps is None else references_file(hyps)
        return path if path is not None and path.is_file() else None

    @property
    def test_time(self) -> list[str]:
        """The settings an evaluation changed at test time (``["model.position.rope_scaling.rope_type=dynamic",
        ...]``)."""
        value = (self.results or {}).get("test_time") if self.evaluation else None
        return [str(v) for v in value] if isinstance(value, list) else []

    def valid_curve(self, metric: str) -> list[tuple[int, float]]:
        """``[(update, value)]`` of the validation records that carry ``metric``."""
        return [
            (int(m["update"]), float(m[metric]))
            for m in self.metrics
            if m.get("split") == "valid" and isinstance(m.get(metric), (int, float)) and "update" in m
        ]


def natural_key(text: str) -> list:
    """Sort key that orders embedded numbers by value (``step2`` before ``step10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]


def _is_run_dir(path: Path) -> bool:
    return any((path / m).exists() for m in _RUN_MARKERS)


def find_run_dirs(sweep_dir: str | Path) -> list[Path]:
    """Every run folder at or below ``sweep_dir`` (holding ``results.json``, ``metrics.jsonl``,
    ``config.yaml`` or ``.hydra/``; hidden folders and run subfolders skipped), in natural order.

    Raises:
        FileNotFoundError: ``sweep_dir`` is not a folder.
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep folder not found: {root}")
    if _is_run_dir(root):
        return [root]
    found: list[Path] = []
    for child in sorted(root.iterdir(), key=lambda p: natural_key(p.name)):
        if child.is_dir() and not child.name.startswith("."):
            found.extend(find_run_dirs(child))
    return found


def _load_yaml(path: Path, resolve: bool = True) -> Any:
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


def _is_evaluation(results: Any) -> bool:
    """``results.json`` of ``scripts/evaluate.py`` in checkpoint mode (``checkpoint`` and ``splits``)."""
    return isinstance(results, dict) and "checkpoint" in results and isinstance(results.get("splits"), dict)


def _evaluation_as_run(results: dict, config: dict) -> dict:
    """An evaluation's results in a training run's keys: the trained run's facts, then its own ``test``,
    ``test_split`` and ``bleu`` / ``chrf``."""
    splits = {k: v for k, v in results["splits"].items() if isinstance(v, dict) and "bleu" in v}
    trained = results.get("trained") if isinstance(results.get("trained"), dict) else {}
    if not splits:
        return {**trained, **results}
    own = (config.get("data") or {}).get("test_split")
    main = own if own in splits else next(iter(splits))
    return {
        **trained,
        **results,
        "test": splits,
        "test_split": main,
        "bleu": splits[main]["bleu"],
        "chrf": splits[main].get("chrf"),
    }


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
        run.config = upgrade_config(run.results["config"])
    else:
        for path in (run_dir / "config.yaml", hydra_dir / "config.yaml"):
            if path.is_file():
                try:
                    run.config = upgrade_config(_load_yaml(path))
                    break
                except Exception:
                    continue
    if _is_evaluation(run.results):
        run.evaluation = True
        if run.results.get("limit"):
            problems.append(
                f"an evaluate.py folder of the first {run.results['limit']} sentences of each split "
                "(limit): a row needs whole test sets"
            )
        elif run.config is not None:
            run.results = _evaluation_as_run(run.results, run.config)
        else:
            problems.append(
                "an evaluate.py folder without the model's config (an ensemble, or written before "
                "evaluations recorded it)"
            )
    if run.results is not None and isinstance(run.results.get("choices"), dict):
        run.choices = {str(k): str(v) for k, v in run.results["choices"].items()}
    elif (hydra_dir / "hydra.yaml").is_file():
        try:
            hcfg = _load_yaml(hydra_dir / "hydra.yaml", resolve=False)
            choices = hcfg["hydra"]["runtime"]["choices"]
            run.choices = {
                str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra") and v is not None
            }
        except Exception:
            pass
    run.metrics = _read_metrics(run_dir / "metrics.jsonl")
    if not run.ok:
        if run.results is not None and not problems:
            problems.append("results.json has no BLEU")
        elif not problems:
            updates = [m["update"] for m in run.metrics if isinstance(m.get("update"), int)]
            problems.append(
                f"no results.json (last logged update {max(updates)})"
                if updates
                else "no results.json, no metrics logged"
            )
        last = _last_log_line(run_dir)
        if last:
            problems.append(f"log ends with: {last}")
        run.reason = "; ".join(problems)
    return run


def expected_jobs(sweep_dir: str | Path) -> list[list[str]] | None:
    """The override lists of a basic-sweeper multirun's jobs (job number = index), rebuilt from
    ``multirun.yaml`` as Hydra's ``BasicSweeper`` builds them; None without one or for another sweeper."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    try:
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


def job_records(sweep_dir: str | Path) -> dict[Path, dict]:
    """The last ``jobs.jsonl`` record of each job folder of the sweep, by path; empty without one."""
    return {Path(sweep_dir) / str(r["folder"]): r for r in job_records_of(sweep_dir) if r.get("folder")}


def _recorded_reason(record: dict) -> str:
    if record.get("state") == "finished":
        return "its folder is gone (the job finished: deleted or moved since)"
    return f"{record.get('state')}: {record.get('error') or 'no line recorded'}"


def _job_key(overrides: list[str]) -> frozenset[str]:
    return frozenset(o for o in overrides if not o.startswith("hydra"))


def never_started(sweep_dir: Path, found: set[Path]) -> list[Run]:
    """One :class:`Run` (no results, its overrides and reason) per multirun job that left no folder: those
    ``jobs.jsonl`` records whose folder is gone, then those ``multirun.yaml`` expects that no folder in
    ``found`` holds and no record names."""
    records = job_records(sweep_dir)
    out = [
        Run(run_dir=folder, overrides=[str(o) for o in record.get("overrides") or []], reason=_recorded_reason(record))
        for folder, record in records.items()
        if folder not in found
    ]
    jobs = expected_jobs(sweep_dir)
    if jobs is None:
        return out
    try:
        subdir = str(_load_yaml(sweep_dir / "multirun.yaml", resolve=False)["hydra"]["sweep"]["subdir"])
    except Exception:
        return out
    numbered = subdir.replace(" ", "") == "${hydra.job.num}"
    held = {_job_key(load_run(d).overrides) for d in found} | {
        _job_key([str(o) for o in r.get("overrides") or []]) for r in records.values()
    }
    for num, overrides in enumerate(jobs):
        run_dir = sweep_dir / str(num) if numbered else sweep_dir
        if (numbered and run_dir in found) or (not numbered and _job_key(overrides) in held):
            continue
        if numbered and run_dir in records:
            continue
        what = "job folder missing (never started)" if numbered else f"job {num} never started (no folder)"
        out.append(Run(run_dir=run_dir, overrides=overrides, reason=what))
    return out
