"""A run that is already finished somewhere else is not trained again (``train.finished_runs``).

A long study outlives the machine it started on: its finished runs' small files are kept (committed
under ``docs/results/ladder/runs/<step>_seed<seed>/``, without checkpoints), but a fresh machine's
``runs/`` is empty, so ``train.resume=auto`` alone would train them again. With
``train.finished_runs=docs/results/ladder/runs`` a job whose run folder holds no checkpoint looks for
its finished twin there, ``<finished_runs>/<run folder name>/results.json`` (or
``<finished_runs>/results.json`` when the folder is itself one run's), and skips training when that
run trained exactly this job: the same configuration as ``scripts/compare.py`` groups runs
(:mod:`transformer.config.identity`: the resolved config, budget included, apart from the keys that
never change what a run computes, :data:`~transformer.config.IGNORED_KEYS`, and the files of a plugin
whose options neither chose), the same seed, with the same precision as it resolves on this machine and the same torch version (what
``scripts/compare.py`` requires of the runs of one table). A field added to the schema after the
run trained counts at its default, and the twin must have trained on the same kind of device with
as many processes (``train.max_tokens`` is per process). When the twin differs, the job trains and
says in one line why. In a sweep, the folder Hydra made for a skipped job is removed again
(``scripts/train.py``); a sweep's subfolders are named by its swept values (``relu_seed1``; the
ladder's ``<step>_seed<seed>``), so the twin is found by the same name.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from transformer.config import IGNORED_KEYS, Config, ConfigError, config_dict, config_identity
from transformer.device import resolve_device
from transformer.precision import resolve_precision

__all__ = ["finished_runs_folder", "finished_twin", "skip_if_finished_elsewhere"]

_NOT_COMPARED: tuple[str, ...] = tuple(k for k in IGNORED_KEYS if k != "seed") + ("train.precision",)
"""Config keys a finished twin may differ in: the seed must match; ``train.precision`` is compared as
resolved (``auto`` and ``fp32`` are the same run on a CPU without fast bf16)."""


def _results_file(finished_runs: Path, run_dir: Path) -> Path | None:
    for candidate in (finished_runs / "results.json", finished_runs / run_dir.name / "results.json"):
        if candidate.is_file():
            return candidate
    return None


def finished_runs_folder(cfg: Config) -> Path:
    """``train.finished_runs`` as an absolute path (relative to the directory the command runs in).

    Raises:
        ConfigError: the folder does not exist (a typo would otherwise train every run again).
    """
    folder = Path(str(cfg.train.finished_runs)).expanduser().absolute()
    if not folder.is_dir():
        raise ConfigError(
            f"train.finished_runs={cfg.train.finished_runs}: there is no folder {folder} (paths are "
            f"relative to the directory the command runs in, {Path.cwd()})"
        )
    return folder


def finished_twin(cfg: Config, run_dir: Path) -> tuple[Path | None, dict[str, Any] | None, str]:
    """Look for the finished run of ``cfg`` under ``cfg.train.finished_runs``.

    Args:
        cfg: the job's typed config (``train.finished_runs`` set).
        run_dir: the job's run folder; its name picks the twin's folder.

    Returns:
        ``(path of the twin's results.json, its results, "")`` when it trained exactly this job;
        ``(path or None, None, why)`` otherwise, ``why`` a sentence naming what differs (at most
        five fields, with both values) or that no results.json was found.

    Raises:
        ConfigError: ``train.finished_runs`` is not a folder (see :func:`finished_runs_folder`).
        ValueError: an unknown ``train.precision`` (which :func:`~transformer.config.validate_config`
            reports before).
    """
    folder = finished_runs_folder(cfg)
    path = _results_file(folder, run_dir)
    if path is None:
        return None, None, f"neither {folder / 'results.json'} nor {folder / run_dir.name / 'results.json'} exists"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return path, None, f"{path} cannot be read ({err})"
    if not isinstance(results, dict) or not isinstance(results.get("config"), dict):
        return path, None, f"{path} records no config"
    then, now = config_identity(results["config"], _NOT_COMPARED), config_identity(config_dict(cfg), _NOT_COMPARED)
    differs = [
        f"{k} ({then.get(k)!r} there, {now.get(k)!r} here)"
        for k in sorted(set(then) | set(now))
        if then.get(k) != now.get(k)
    ]
    precision = resolve_precision(cfg.train.precision, resolve_device(cfg.train.device))
    if results.get("precision") != precision:
        differs.append(f"precision ({results.get('precision')!r} there, {precision!r} here)")
    device = resolve_device(cfg.train.device)
    if str(results.get("device", "cpu")).split(":")[0] != device.type:
        differs.append(f"device ({results.get('device')!r} there, {device.type!r} here)")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if int(results.get("world_size", 1)) != world_size:
        differs.append(
            f"processes ({results.get('world_size')} there, {world_size} here: train.max_tokens is per process)"
        )
    hardware = results.get("hardware") if isinstance(results.get("hardware"), dict) else {}
    if hardware.get("torch") != torch.__version__:
        differs.append(f"torch ({hardware.get('torch')!r} there, {torch.__version__!r} here)")
    if differs:
        more = f" and {len(differs) - 5} more" if len(differs) > 5 else ""
        return path, None, f"{path} trained another run: {'; '.join(differs[:5])}{more}"
    return path, results, ""


def skip_if_finished_elsewhere(cfg: Config, run_dir: Path, has_checkpoint: bool) -> dict[str, Any] | None:
    """The twin's results when ``cfg`` is already finished under ``train.finished_runs`` (one line on
    stderr either way, from rank 0), else None (the job trains). Nothing is read when
    ``train.finished_runs`` is null or the run folder holds a checkpoint of its own (a run that was
    started here is this folder's, whatever ``train.resume`` does with it); nothing is ever written.

    Args:
        cfg: the job's typed config.
        run_dir: the job's run folder.
        has_checkpoint: whether ``run_dir`` holds any checkpoint.

    Returns:
        The twin's results with ``skipped_complete: True`` and ``finished_in`` (the folder), or None.

    Raises:
        ConfigError: ``train.finished_runs`` is not a folder.
    """
    if not cfg.train.finished_runs or has_checkpoint:
        return None
    path, results, why = finished_twin(cfg, run_dir)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if results is None:
        if rank0:
            print(f"train.finished_runs: {why}; training {run_dir}", file=sys.stderr, flush=True)
        return None
    assert path is not None
    if rank0:
        print(
            f"{run_dir} is finished in {path.parent} (update {results.get('updates')}, results.json there): "
            "not trained again (a folder made for it here holding only Hydra's record is removed)",
            file=sys.stderr,
            flush=True,
        )
    return {**results, "skipped_complete": True, "finished_in": str(path.parent)}
