"""Hydra's record of a training job in its run folder: ``.hydra/`` at the first start,
``.hydra/resume-<date>_<time>/`` at each resume. Reading it, and taking it back when a job ends
before it wrote anything (:func:`forget_record`), so a refused run leaves no folder and a refused
resume leaves its folder as it was."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from transformer.runs.folder import HYDRA_RECORD
from transformer.runs.io import folder_locked_by_other

__all__ = ["RESUME_RECORD", "forget_record", "job_choices", "job_run_dir", "record_subdir", "recorded_choices"]

RESUME_RECORD = HYDRA_RECORD + "/resume-"
"""The prefix of a resume's record: ``.hydra/resume-<date>_<time>``."""


def record_subdir(resuming: bool, output_dir: str | Path | None = None) -> str | None:
    """``.hydra`` for a new run, ``.hydra/resume-<date>_<time>`` for a resume, None (no record) when
    another live process holds the folder's lock."""
    if (
        output_dir is not None
        and str(output_dir).lower() not in ("", "none", "null")
        and folder_locked_by_other(str(output_dir))
    ):
        return None
    return RESUME_RECORD + time.strftime("%Y-%m-%d_%H-%M-%S") if resuming else HYDRA_RECORD


def job_run_dir() -> Path | None:
    """The run folder of the Hydra job running now (``hydra.runtime.output_dir``); None outside Hydra."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # HydraConfig not set: not under Hydra (tests, notebooks)
        return None


def _choices(choices) -> dict[str, str]:
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra") and v is not None}


def job_choices() -> dict[str, str]:
    """The config-group choices of the Hydra job running now (``{"model": "transformer_tiny",
    "model/ffn": "relu", ...}``, Hydra's own groups left out); empty outside Hydra."""
    try:
        return _choices(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def recorded_choices(run_dir: Path) -> dict[str, str] | None:
    """The config-group choices recorded when the run in ``run_dir`` started; None without a readable record."""
    try:
        return _choices(OmegaConf.load(Path(run_dir) / HYDRA_RECORD / "hydra.yaml").hydra.runtime.choices)
    except Exception:  # no record, or not Hydra's
        return None


def forget_record() -> Path | None:
    """Take back Hydra's record of this job when the job wrote nothing; return the path removed, or None.

    A resume's record is removed; a new run's folder holding only ``.hydra/`` is removed with the empty
    folders above it, up to the working directory. Nothing else is touched."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    folder = Path(hc.runtime.output_dir)
    sub = str(hc.output_subdir or "")
    if sub.startswith(RESUME_RECORD):
        target = folder / sub
    elif sub == HYDRA_RECORD and folder.is_dir() and [p.name for p in folder.iterdir()] == [HYDRA_RECORD]:
        target = folder
    else:
        return None
    shutil.rmtree(target, ignore_errors=True)
    if target == folder:
        _remove_empty_parents(folder)
    elif not any(target.parent.iterdir()):  # a run folder without a record of its own (trained by train())
        target.parent.rmdir()
    return target


def _remove_empty_parents(folder: Path) -> None:
    """Remove the empty folders above ``folder`` that lie inside the working directory, nearest first."""
    cwd = Path.cwd().resolve()
    parent = folder.resolve().parent
    while parent != cwd and cwd in parent.parents:
        try:
            parent.rmdir()  # only an empty folder
        except OSError:
            return
        parent = parent.parent
