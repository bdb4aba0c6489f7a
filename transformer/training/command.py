"""The work of ``scripts/train.py``: :func:`prepare_command_line` before Hydra composes, and
:func:`train_job`, the Hydra task. A user error ends in one line and a status of :data:`RUN_ERRORS`;
a job refused before writing anything of its own takes back Hydra's record, so it leaves no folder
(or its folder as it was)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from transformer.cli import (
    MissingPlugin,
    RunFailed,
    check_hydra_plugins,
    check_sweep_objective,
    in_multirun,
    record_job,
    sweep_objective,
    sweeper_direction,
    user_errors,
)
from transformer.config import (
    SWEPT_KEYS_ENV,
    ConfigError,
    UnknownOption,
    check_command_line,
    flat_group_override,
    swept_keys,
    to_config,
    validate_config,
)
from transformer.data.corpus import DataError
from transformer.plugins import PluginError, command_line_plugins, import_plugins, plugin_failure
from transformer.runs.folder import HYDRA_RECORD
from transformer.runs.hydra_record import forget_record, job_run_dir
from transformer.runs.io import LOCK_NAME, FolderLocked
from transformer.training.checkpoint import CheckpointError
from transformer.training.errors import TrainingError
from transformer.training.job.run import train
from transformer.training.stopping import StopRequested

__all__ = ["RUN_ERRORS", "prepare_command_line", "train_job"]

RUN_ERRORS = {
    (ConfigError, PluginError): 2,
    (TrainingError, CheckpointError, DataError, FileNotFoundError, FolderLocked): 1,
}
"""The user errors of a run and their exit statuses (one line on stderr each)."""


def prepare_command_line(argv: Sequence[str], config_dir: str | Path | None = None) -> list[str]:
    """Check the command line before Hydra sees it; return ``argv`` with each plugin's ``configs/`` added
    to ``hydra.searchpath``.

    A missing Hydra plugin, a flat group override (``model.attention=gqa``), a plugin that does not
    import, or an unknown key (composed from ``config_dir``; None skips it) stops here.

    Raises:
        SystemExit: status 2, after one line on stderr.
    """
    try:
        check_hydra_plugins(argv)
        if (flat := flat_group_override(argv)) is not None:
            raise ConfigError(f"invalid configuration: {flat}")
        argv = command_line_plugins(argv)
        if "-m" in argv or "--multirun" in argv:  # the jobs' folder names show what the sweep varies
            os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(argv))
        else:
            os.environ.pop(SWEPT_KEYS_ENV, None)
        if config_dir is not None:
            try:
                check_command_line(argv, config_dir, "train")
            except UnknownOption:  # its sentence names the group and its options: no prefix
                raise
            except ConfigError as err:
                raise ConfigError(f"invalid configuration: {err}") from None
        return argv
    except (MissingPlugin, ConfigError, PluginError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def _forget_if_untouched(err: BaseException) -> None:
    if getattr(err, "run_folder_untouched", False):
        forget_record()


def _refused(err: BaseException) -> None:
    """A job stopped by a check before it trained: its record in the sweep, its folder taken back."""
    record_job("refused", str(err))
    _forget_if_untouched(err)


def _failed(err: BaseException, before: tuple[dict[str, tuple[int, int]], bool] | None = None) -> None:
    """Record a job ended by a user error as ``refused`` (it wrote nothing) or ``failed``, taking Hydra's
    record back when it wrote nothing."""
    untouched = getattr(err, "run_folder_untouched", False) and not isinstance(err, PluginError)
    if not isinstance(err, PluginError):
        untouched = _as_it_was(before) or untouched
        err.run_folder_untouched = untouched  # type: ignore[attr-defined]
    record_job("refused" if untouched else "failed", str(err))
    _forget_if_untouched(err)


def _folder_state(folder: Path | None) -> tuple[dict[str, tuple[int, int]], bool] | None:
    """``({name: (size, mtime_ns)}, lock file present)`` of the run folder, Hydra's record and the lock
    aside; None outside Hydra."""
    if folder is None or not folder.is_dir():
        return None
    state = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}
    state.pop(HYDRA_RECORD, None)
    return state, state.pop(LOCK_NAME, None) is not None


def _as_it_was(before: tuple[dict[str, tuple[int, int]], bool] | None) -> bool:
    """Whether the run folder is as ``before`` (a lock file this job created is removed then)."""
    folder = job_run_dir()
    now = _folder_state(folder)
    if before is None or now is None or now[0] != before[0]:
        return False
    if now[1] and not before[1]:  # the lock this job took
        (folder / LOCK_NAME).unlink(missing_ok=True)
    return True


def _untrained_folder_taken_back(err: BaseException) -> bool:
    """Remove what a new run that failed before its first update wrote (``err.written_by_run``); say
    whether only Hydra's record is left."""
    for path in getattr(err, "written_by_run", None) or []:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    folder = job_run_dir()
    if folder is None or not folder.is_dir():
        return False
    left = sorted(p.name for p in folder.iterdir())
    if left == sorted([HYDRA_RECORD, LOCK_NAME]):  # a run that failed before it wrote anything
        (folder / LOCK_NAME).unlink(missing_ok=True)
        left = [HYDRA_RECORD]
    return left == [HYDRA_RECORD]


def train_job(cfg: DictConfig) -> float | None:
    """Validate the composed config, then train, validate, test and write ``results.json``.

    In a multirun a job ended by a user error returns None (a failed trial) so the other jobs run;
    the sweep then ends with one summary line and status 1.

    Returns:
        The best validation ``train.best_metric``, what a sweeper optimises (never a test score).

    Raises:
        SystemExit: a user error (:data:`RUN_ERRORS`), or a stop signal (75, ``checkpoint_last`` saved).
    """
    try:
        return _train_job(cfg)
    except RunFailed:  # a multirun's job: its line is printed and recorded; the sweep goes on
        return None


def _train_job(cfg: DictConfig) -> float | None:
    with user_errors({ConfigError: 2, PluginError: 2}, on_error=_refused):
        try:
            import_plugins(cfg.get("plugins"))  # a sweep's worker process imports them too
            validate_config(cfg)
            config = to_config(cfg)
            try:
                check_sweep_objective(config.train, sweeper_direction())
            except ValueError as err:
                raise ConfigError(str(err)) from None
        except ConfigError as err:
            refused = ConfigError(f"invalid configuration: {err}")
            refused.run_folder_untouched = True  # nothing was written: Hydra's record is taken back
            raise refused from None
    before = _folder_state(job_run_dir())  # a refusal leaves the run folder as it was
    with user_errors(RUN_ERRORS, on_error=functools.partial(_failed, before=before)):
        try:
            results = train(config)
        except StopRequested as err:  # a polite stop: checkpoint_last saved, the line saying how to continue logged
            record_job("stopped", str(err))
            if in_multirun():
                raise RunFailed(str(err)) from None
            sys.exit(err.exit_status)
        except Exception as err:  # a plugin's code failed (its constructor, schedule, forward): one line naming it
            failed = plugin_failure(err)
            user_error = isinstance(err, tuple(t for kinds in RUN_ERRORS for t in kinds))
            if failed is None and not user_error:
                record_job("crashed", f"{type(err).__name__}: {err}")  # a bug: its traceback follows
            if failed is None or user_error:
                raise
            failed.run_folder_untouched = _untrained_folder_taken_back(err)  # type: ignore[attr-defined]
            raise failed from err
    if results.get("skipped_complete"):  # complete already (here, or elsewhere: train.finished_runs)
        forget_record()
    record_job("finished")
    return sweep_objective(results)
