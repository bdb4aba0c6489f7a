"""A run folder's layout and a checkpoint's names and suffixes, in one place: every layer that reads
or writes a run folder takes the names from here. It imports nothing from the package. The layout:
docs/runs.md#the-run-folder; a sweep folder also holds ``jobs.jsonl`` (:data:`JOBS_RECORD`). A
checkpoint is named by its stem (``dir / "checkpoint_last"``), its files the stem plus :data:`SUFFIXES`."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "AVERAGE",
    "BEST",
    "CONFIG_NAMES",
    "EVAL_DIR",
    "FORMAT",
    "HYDRA_RECORD",
    "JOBS_RECORD",
    "LAST",
    "META_SUFFIX",
    "REFS_SUFFIX",
    "STATE_SUFFIX",
    "SUFFIXES",
    "WEIGHTS_SUFFIX",
    "checkpoint_file",
    "checkpoint_stem",
    "has_checkpoint",
    "job_records_of",
    "numbered",
    "references_file",
    "test_time_tag",
    "weights_path",
]

WEIGHTS_SUFFIX = ".safetensors"
STATE_SUFFIX = ".pt"
META_SUFFIX = ".json"
SUFFIXES = (STATE_SUFFIX, WEIGHTS_SUFFIX, META_SUFFIX)  # the files of one checkpoint, in write order
FORMAT = "transformer-zoo-checkpoint/1"
"""The format tag a checkpoint's training state carries."""

LAST = "checkpoint_last"
BEST = "checkpoint_best"
AVERAGE = "checkpoint_avg"
"""The weights a ``train.average_last > 0`` run averaged and tested (weights only: no ``.pt``, no ``.json``)."""
JOBS_RECORD = "jobs.jsonl"
"""In a multirun's sweep folder (beside Hydra's ``multirun.yaml``): the outcome of each job, one JSON
line per job as it ends (:func:`transformer.cli.record_job`), which ``compare.py`` reads for the
jobs that left no results."""
REFS_SUFFIX = ".ref"
"""The references a hypotheses file was scored against, beside it (``hyps/<split>.ref``): a run folder
is compared (paired bootstrap) without the data it was tested on."""
HYDRA_RECORD = ".hydra"
"""Hydra's record of the run (:mod:`transformer.runs.hydra_record` writes, reads and takes it back)."""
CONFIG_NAMES = ("config.yaml", HYDRA_RECORD + "/config.yaml")
"""Where a run folder's config is, in the order read."""

EVAL_DIR = "eval"
"""Where ``scripts/evaluate.py`` writes a checkpoint's results in its run folder (``eval/<name>/``)."""


def test_time_tag(overrides: list[str]) -> str:
    """A short name for settings changed at test time (``rope_type=dynamic``, ``factor=2.0``,
    ``original_max_position_embeddings=16`` -> ``rope_dynamic_x2_L0=16``; other fields as
    ``<field>=<value>``); ``""`` for none."""
    short = {"rope_type": "rope_{}", "factor": "x{}", "original_max_position_embeddings": "L0={}"}
    parts = []
    for item in overrides:
        key, _, value = str(item).partition("=")
        field = key.rsplit(".", 1)[-1]
        value = value[:-2] if value.endswith(".0") else value
        parts.append(short.get(field, field + "={}").format(value))
    return "_".join(parts)


def numbered(update: int) -> str:
    """The stem name of the checkpoint saved at ``update``: ``checkpoint_<update>``."""
    return f"checkpoint_{int(update)}"


def checkpoint_file(stem: Path, suffix: str) -> Path:
    """The file ``stem`` + ``suffix`` of checkpoint ``stem`` (``dir / "checkpoint_last"``)."""
    return stem.with_name(stem.name + suffix)


def checkpoint_stem(path: str | Path) -> Path:
    """The checkpoint a path names: one of its files (``.safetensors``, ``.pt``, ``.json``) without
    the suffix, or the path itself (already a stem, or a folder)."""
    p = Path(path)
    return p.with_suffix("") if p.suffix in SUFFIXES else p


def weights_path(path: Path) -> Path:
    """The weights file of ``path``: itself when it ends in ``.safetensors``, else the stem's."""
    return path if path.suffix == WEIGHTS_SUFFIX else checkpoint_file(checkpoint_stem(path), WEIGHTS_SUFFIX)


def has_checkpoint(run_dir: str | Path, name: str = LAST) -> bool:
    """Whether ``run_dir`` holds checkpoint ``name``'s weights (default ``checkpoint_last``)."""
    return checkpoint_file(Path(run_dir) / name, WEIGHTS_SUFFIX).is_file()


def references_file(hyps_file: str | Path) -> Path:
    """The references file beside the hypotheses file ``hyps_file`` (``hyps/<split>.txt`` ->
    ``hyps/<split>.ref``): one reference per line, line-aligned with the hypotheses."""
    return Path(hyps_file).with_suffix(REFS_SUFFIX)


def job_records_of(sweep_dir: str | Path) -> list[dict]:
    """Every readable record of the sweep's :data:`JOBS_RECORD`, in the order the jobs wrote them (a
    line that is not a JSON object, e.g. one torn by a crash, is skipped); empty without the file."""
    try:
        lines = (Path(sweep_dir) / JOBS_RECORD).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
