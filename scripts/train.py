"""Train one model (or a sweep with -m): the Hydra entry point of every experiment.

    python scripts/train.py                                   # transformer_small on multi30k_en_de, 23 min of training
    python scripts/train.py model=llama_style_tiny data=multi30k_de_en train.max_updates=4000
    python scripts/train.py -m model/ffn=relu,swiglu seed=1,2,3
    python scripts/train.py model/position=rope --cfg job     # print the resolved config only
    torchrun --nproc_per_node=2 scripts/train.py ...          # data parallel

The run folder (Hydra's output dir) receives metrics.jsonl, checkpoints, test hypotheses and
results.json.

User errors (an invalid config, unusable data, a checkpoint that cannot be resumed, a diverged
run, a run folder another process is writing) end with one line ``error: ...`` on stderr and exit
status 2 (configuration) or 1 (others); ``HYDRA_FULL_ERROR=1`` shows the traceback instead. In a
sweep (``-m``) a failed job prints its line and the other jobs still run (Hydra reports the failure
at the end). A signal of ``train.stop_signals`` (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) stops training
after the update in progress, saves ``checkpoint_last`` and exits with status 75; the same command
with ``train.resume=auto`` continues it. The return value, for a sweeper such as Optuna
(``hydra/sweeper=optuna``), is the best validation ``train.best_metric``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("transformer") is None:  # a checkout without an install (an installed package is used as installed)
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer.cli import (  # noqa: E402
    MissingPlugin,
    RunFailed,
    check_hydra_plugins,
    check_sweep_objective,
    in_multirun,
    sweep_objective,
    sweeper_direction,
    user_errors,
)
from transformer.config import ConfigError, flat_group_override, register_configs, to_config, validate_config  # noqa: E402
from transformer.data.corpus import DataError  # noqa: E402
from transformer.io import FolderLocked  # noqa: E402
from transformer.plugins import PluginError, command_line_plugins, import_plugins  # noqa: E402
from transformer.training.checkpoint import CheckpointError  # noqa: E402
from transformer.training.run import train  # noqa: E402
from transformer.training.stopping import StopRequested  # noqa: E402
from transformer.training.trainer import TrainingError  # noqa: E402

register_configs()

RUN_ERRORS = {(ConfigError, PluginError): 2, (TrainingError, CheckpointError, DataError, FileNotFoundError, FolderLocked): 1}
"""The user errors of a run and their exit statuses (one line on stderr each, see :func:`user_errors`)."""


def _forget_resume_record() -> None:
    """Remove the record Hydra wrote for a refused resume (``.hydra/resume-<time>/``): the run folder
    is left exactly as it was."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        sub = str(hc.output_subdir or "")
        if sub.startswith(".hydra/resume-"):
            shutil.rmtree(Path(hc.runtime.output_dir) / sub, ignore_errors=True)
    except Exception:  # not under Hydra
        pass


def _forget_new_folder() -> None:
    """Remove the run folder Hydra made for a job that was finished elsewhere (``train.finished_runs``)
    when it holds nothing but Hydra's record: a skipped job leaves no trace in the sweep."""
    try:
        from hydra.core.hydra_config import HydraConfig

        folder = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra
        return
    if folder.is_dir() and [p.name for p in folder.iterdir()] == [".hydra"]:
        shutil.rmtree(folder, ignore_errors=True)


def _forget_if_untouched(err: BaseException) -> None:
    """Before a user error is reported: a refusal that wrote nothing (``run_folder_untouched``) also
    drops Hydra's record of the resume."""
    if getattr(err, "run_folder_untouched", False):
        _forget_resume_record()


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Validate the config, then train, validate, test and write results.json.

    Returns:
        The run's best validation ``train.best_metric`` (what a Hydra sweeper optimises; never a test
        score). A run stopped by a signal of ``train.stop_signals`` exits with status 75 after
        saving ``checkpoint_last``.
    """
    with user_errors({ConfigError: 2, PluginError: 2}, on_error=_forget_if_untouched):
        try:
            import_plugins(cfg.get("plugins"))  # a sweep's worker process imports them too
            validate_config(cfg)
            config = to_config(cfg)  # the typed Config every function below takes
            try:
                check_sweep_objective(config.train, sweeper_direction())
            except ValueError as err:
                raise ConfigError(str(err)) from None
        except ConfigError as err:
            refused = ConfigError(f"invalid configuration: {err}")
            refused.run_folder_untouched = True  # nothing was written (a resume's Hydra record is dropped)
            raise refused
    with user_errors(RUN_ERRORS, on_error=_forget_if_untouched):
        try:
            results = train(config)
        except StopRequested as err:  # a polite stop: checkpoint_last saved, the line saying how to continue logged
            if in_multirun():
                raise RunFailed(str(err)) from None
            sys.exit(err.exit_status)
    if results.get("skipped_complete"):
        _forget_resume_record()  # train.resume=auto on a complete run: the folder stays as it was
        if results.get("finished_in"):
            _forget_new_folder()  # finished elsewhere (train.finished_runs): no empty folder in the sweep
    return sweep_objective(results)  # the best validation metric: a sweeper never tunes on the test set


if __name__ == "__main__":
    try:
        check_hydra_plugins(sys.argv[1:])  # a missing launcher/sweeper plugin: one line naming its pip install
    except MissingPlugin as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if (flat := flat_group_override(sys.argv[1:])) is not None:  # model.attention=gqa: one line naming model/attention=gqa
        print(f"error: invalid configuration: {flat}", file=sys.stderr)
        sys.exit(2)
    try:  # plugins=[...] first: their options and configs/ exist before Hydra composes
        sys.argv[1:] = command_line_plugins(sys.argv[1:])
    except PluginError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
