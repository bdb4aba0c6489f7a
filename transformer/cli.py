"""What the command-line scripts share: checks before Hydra starts (a missing Hydra plugin named with
its ``pip install``), the sweep objective, and the one-line report of a user error
(docs/runs.md#errors-and-exit-codes)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from transformer.plugins import plugin_failure, set_user_choice
from transformer.runs.folder import JOBS_RECORD, job_records_of

__all__ = [
    "HYDRA_PLUGINS",
    "MissingPlugin",
    "RunFailed",
    "SweepSummary",
    "check_hydra_plugins",
    "check_sweep_objective",
    "in_multirun",
    "one_line",
    "record_job",
    "run_script",
    "sweep_objective",
    "sweep_summary",
    "sweeper_direction",
    "user_errors",
]

HYDRA_PLUGINS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (group, option): (module that registers it, distribution, this project's extra)
    ("launcher", "submitit_local"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("launcher", "submitit_slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("launcher", "joblib"): ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "sweep"),
    ("sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper", "sweep"),
}
"""The Hydra plugins this project documents, the module each registers and where it comes from."""

_OVERRIDE = re.compile(r"^[~+]*hydra/(launcher|sweeper)=([A-Za-z0-9_]+)$")


class MissingPlugin(RuntimeError):
    """A Hydra plugin named on the command line is not installed (the message names the ``pip install``)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_hydra_plugins(argv: Sequence[str]) -> None:
    """Refuse a command line (``sys.argv[1:]``) whose ``hydra/launcher=`` or ``hydra/sweeper=`` plugin is missing.

    Raises:
        MissingPlugin: naming the option, the distribution and the ``pip install`` that provides it.
    """
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if not match or (match.group(1), match.group(2)) not in HYDRA_PLUGINS:
            continue
        module, dist, extra = HYDRA_PLUGINS[(match.group(1), match.group(2))]
        if not _installed(module):
            raise MissingPlugin(
                f"hydra/{match.group(1)}={match.group(2)} needs the {dist} package, which is not installed: "
                f'pip install -e ".[{extra}]" (or pip install {dist})'
            )


def sweeper_direction() -> str | list | None:
    """``hydra.sweeper.direction`` of the running Hydra job when its sweeper has one (Optuna's), else None."""
    try:
        sweeper = HydraConfig.get().sweeper
    except Exception:  # not under Hydra
        return None
    direction = sweeper.get("direction") if hasattr(sweeper, "get") else None
    return None if direction is None else (list(direction) if not isinstance(direction, str) else str(direction))


def check_sweep_objective(train_cfg, direction: str | list | None) -> None:
    """Refuse a sweeper direction that does not fit ``train.best_metric`` (``maximize`` for bleu,
    ``minimize`` for loss).

    Raises:
        ValueError: naming ``hydra.sweeper.direction`` and ``train.best_metric`` (or ``train.valid_bleu``).
    """
    if direction is None:
        return
    if not isinstance(direction, str):
        raise ValueError(
            f"hydra.sweeper.direction={direction}: scripts/train.py returns one objective "
            "(the best validation train.best_metric); give one direction"
        )
    want = "maximize" if train_cfg.best_metric == "bleu" else "minimize"
    if direction.lower() != want:
        raise ValueError(
            f"hydra.sweeper.direction={direction} but train.best_metric={train_cfg.best_metric} "
            f"(the objective each trial returns) is optimised by {want}"
        )
    if train_cfg.best_metric == "bleu" and not train_cfg.valid_bleu:
        raise ValueError(
            "train.best_metric=bleu is the sweep's objective, but train.valid_bleu=false computes no "
            "validation BLEU; set train.valid_bleu=true or train.best_metric=loss"
        )


def sweep_objective(results: dict) -> float | None:
    """What ``scripts/train.py`` returns to a Hydra sweeper: the best validation ``train.best_metric``,
    never a test score; None when the run has none (a failed trial)."""
    value = results.get("best_valid")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------- user errors


class RunFailed(CompactHydraException):
    """One job of a Hydra multirun failed with a user error (already on stderr): raised instead of
    exiting, so the sweep's other jobs run. Its message is the sweep's one-line summary when the
    record of ``sweep_dir`` (default: the running job's) is readable."""

    def __init__(self, message: str, sweep_dir: str | None = None) -> None:
        if sweep_dir is None and (found := _sweep_of_job()) is not None:
            sweep_dir = str(found[0])
        super().__init__(message, sweep_dir)
        self.message, self.sweep_dir = message, sweep_dir

    def __str__(self) -> str:
        summary = sweep_summary(self.sweep_dir) if self.sweep_dir else None
        return summary or self.message


def _sweep_of_job() -> tuple[Path, Any] | None:
    """The folder and the Hydra config of the multirun job running now; None outside a multirun."""
    try:
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        depth = len(Path(str(hc.sweep.subdir)).parts)  # the job's folder is <sweep dir>/<subdir>
        return Path(hc.runtime.output_dir).parents[depth - 1], hc
    except Exception:  # not under Hydra
        return None


def _launch_stamp(sweep_dir: Path) -> int | None:
    """Which launch of the sweep this is: the sweeper writes ``multirun.yaml`` as it starts one."""
    try:
        return (sweep_dir / "multirun.yaml").stat().st_mtime_ns
    except OSError:
        return None


def record_job(state: str, message: str | None = None) -> None:
    """Append the outcome of the running multirun job as one line of :data:`JOBS_RECORD` in its sweep's
    folder (whole-line writes); nothing outside a multirun."""
    found = _sweep_of_job()
    if found is None:
        return
    sweep_dir, hc = found
    record = {
        "num": int(hc.job.num),
        "folder": os.path.relpath(str(hc.runtime.output_dir), sweep_dir),
        "overrides": [str(o) for o in hc.overrides.task],
        "state": state,
        "error": None if message is None else " ".join(str(message).split()),
        "sweep": _launch_stamp(sweep_dir),
    }
    try:
        with open(sweep_dir / JOBS_RECORD, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:  # the record is a courtesy: the job's own outcome stands
        pass


class SweepSummary(Callback):
    """Hydra callback: when any job of a multirun did not finish, one line ``error: 6 of 8 jobs
    finished; 2 refused: ...`` on stderr and exit status 1. A search sweeper (Optuna's, whose failed
    trials are part of the search) gets the line without ``error:`` and keeps its status."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            sweep_dir = Path(str(config.hydra.sweep.dir))
            grid = "BasicSweeper" in str(config.hydra.sweeper.get("_target_", ""))
        except Exception:  # no sweep folder to read
            return
        jobs = _launched_jobs(sweep_dir)
        if any(r.get("state") != "finished" for r in jobs.values()):
            print(f"{'error: ' if grid else ''}{sweep_summary(sweep_dir)}", file=sys.stderr, flush=True)
            if grid:
                sys.exit(1)


def _launched_jobs(sweep_dir: Path) -> dict[int, dict]:
    """Job number -> its last record in :data:`JOBS_RECORD`, for the sweep's latest launch."""
    stamp = _launch_stamp(sweep_dir)
    # a job's last word counts: a later record of the same number replaces an earlier one
    return {int(r.get("num", -1)): r for r in job_records_of(sweep_dir) if r.get("sweep") == stamp}


def sweep_summary(sweep_dir: str | Path) -> str | None:
    """``6 of 8 jobs finished; 2 refused: <folder>: <line>; ...`` for the latest launch of the sweep in
    ``sweep_dir``; None without a record."""
    sweep_dir = Path(sweep_dir)
    jobs = _launched_jobs(sweep_dir)
    if not jobs:
        return None
    done = sum(1 for r in jobs.values() if r.get("state") == "finished")
    parts = [f"{done} of {len(jobs)} jobs finished"]
    for state in ("refused", "failed", "crashed", "stopped"):
        these = [r for _, r in sorted(jobs.items()) if r.get("state") == state]
        if these:
            said = "; ".join(f"{r.get('folder')}: {r.get('error')}" for r in these)
            parts.append(f"{len(these)} {state}: {said}")
    return "; ".join(parts) + f" (each job: {sweep_dir / JOBS_RECORD}; compare.py lists them)"


def in_multirun() -> bool:
    """Whether the running Hydra job is one job of a multirun (``-m``); False outside Hydra."""
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # not under Hydra
        return False


def one_line(err: BaseException) -> str:
    """``str(err)`` with every run of whitespace as one space, stripped."""
    return " ".join(str(err).split())


def _status(err: BaseException, statuses: Mapping[type | tuple[type, ...], int]) -> int | None:
    """The status of the first key of ``statuses`` that ``err`` is an instance of, else None."""
    for kinds, status in statuses.items():
        if isinstance(err, kinds):
            return status
    return None


def _report(err: BaseException, status: int, prefix: str) -> NoReturn:
    """Print ``prefix + message`` on one line of stderr and exit with ``status`` (raise :class:`RunFailed`
    in a multirun); re-raise ``err`` under ``HYDRA_FULL_ERROR=1``."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    message = one_line(err)
    print(f"{prefix}{message}", file=sys.stderr, flush=True)
    if in_multirun():  # let Hydra run the sweep's other jobs
        raise RunFailed(message) from None
    sys.exit(status)


@contextlib.contextmanager
def user_errors(
    statuses: Mapping[type[BaseException] | tuple[type[BaseException], ...], int],
    *,
    prefix: str = "error: ",
    on_error: Callable[[BaseException], None] | None = None,
    broken_pipe: int | None = None,
    plugins: int | None = None,
) -> Iterator[None]:
    """Turn the user errors raised in the block into one line on stderr and an exit status.

    An instance of a key of ``statuses`` (checked in order) is printed as ``prefix + message`` on one
    line and the process exits with that status. In a Hydra multirun the job raises :class:`RunFailed`
    instead; under ``HYDRA_FULL_ERROR=1`` the exception is re-raised unchanged. Anything else passes
    through::

        with user_errors({(LoadError, ConfigError, FileNotFoundError): 2, LinesFailed: 1}):
            translate_file(cfg)

    Args:
        statuses: exception type, or tuple of types, -> exit status.
        on_error: called with a matching exception first (also in a multirun or under
            ``HYDRA_FULL_ERROR=1``), e.g. to remove what a refused run wrote.
        broken_pipe: the exit status for a ``BrokenPipeError`` (stdout closed early), silent; None lets it pass.
        plugins: the exit status for any other ``Exception`` raised in a loaded plugin's code, reported
            as :func:`plugin_failure`'s line; None lets it pass.

    Raises:
        SystemExit: with the matching status.
        RunFailed: in a Hydra multirun, after the line.
    """
    try:
        yield
    except BrokenPipeError:
        if broken_pipe is None:
            raise
        sys.exit(broken_pipe)
    except BaseException as err:
        status = _status(err, statuses)
        if status is None and plugins is not None and isinstance(err, Exception):
            failed = plugin_failure(err)
            if failed is not None:
                failed.__cause__ = err
                err, status = failed, plugins
        if status is None:
            raise
        if on_error is not None:
            on_error(err)
        _report(err, status, prefix)


def run_script(cfg: Any, work: Callable[[Any], Any], errors: dict, **options: Any) -> Any:
    """A decoding script's ``main``: find the run's plugins (or trust its copy), then return
    ``work(cfg)``; a user error (``errors``: type -> status) or a plugin failure (status 2) is one
    line and an exit status (:func:`user_errors`).

    Raises:
        SystemExit: a user error.
    """
    with user_errors(errors, plugins=2, **options):
        set_user_choice(cfg.plugins, cfg.plugins_trust)
        return work(cfg)
