"""One training run around a :class:`~transformer.training.loop.trainer.Trainer`: the run folder, resume,
data, checkpoints and the final ``results.json`` (the function behind ``scripts/train.py``).

Order matters for reliability: a resume is read and checked (:mod:`transformer.training.job.resume`)
before anything is written into the run folder; then temporaries of interrupted saves are removed,
``config.yaml`` and the tokenizers are written, and the run's log goes to ``train.log``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from transformer.config import (
    Config,
    ConfigError,
    budget_sentence,
    check_checkpoint_averaging,
    config_dict,
    resume_mode,
    to_config,
    used_plugin_files,
)
from transformer.data.batching import resolve_pad_to_multiple
from transformer.data.dataset import load_translation_data
from transformer.device import resolve_device, unavailable
from transformer.models import count_parameters
from transformer.plugins import (
    Plugin,
    import_plugins,
    import_recorded,
    kept_recorded_paths,
    plugins_named,
    record_plugins,
    set_user_choice,
    untrusted,
)
from transformer.precision import resolve_precision
from transformer.runs.folder import has_checkpoint
from transformer.runs.hydra_record import job_choices, recorded_choices
from transformer.runs.io import FolderLock, atomic_write_text, check_unlocked
from transformer.training.checkpoint import CheckpointError, remove_stale_temporaries
from transformer.training.distributed.process_group import setup_distributed, shutdown_distributed
from transformer.training.job.allocator import limit_onednn_cache, tune_cpu_allocator
from transformer.training.job.finished_runs import skip_if_finished_elsewhere
from transformer.training.job.results import (
    RunLog,
    copy_tokenizers,
    final_test,
    run_dir_for,
    run_name,
)
from transformer.training.job.resume import ResumePoint, checkpoint_names, completed_results, prepare_resume
from transformer.training.loop.trainer import Trainer
from transformer.training.monitoring.loggers import build_loggers
from transformer.training.step.compiled import resolve_compile
from transformer.training.stopping import GracefulStop, StopRequested

__all__ = ["restore", "train"]


def train(cfg: Config | DictConfig) -> dict[str, Any]:
    """Train ``cfg`` to the end, test it, and write ``results.json`` into the run folder.

    With ``train.resume=true`` (or ``train.resume_from=PATH``) the run continues from its checkpoint
    with its own saved config (see :mod:`transformer.training.job.resume`); everything is checked before
    anything in the run folder is written. With ``train.resume=auto`` a run that is already complete
    (:func:`~transformer.training.job.resume.completed_results`) is left untouched and its saved results
    are returned (with ``skipped_complete: True``); so are, with ``finished_in``, the results of a run
    that is finished under ``train.finished_runs`` when the run folder holds no checkpoint
    (:mod:`transformer.training.job.finished_runs`). Temporary files of interrupted saves are removed first.

    Args:
        cfg: a validated config (see :func:`transformer.config.validate_config`), typed or as
            Hydra composed it; the run trains with the typed :class:`~transformer.config.Config`.

    Returns:
        The results dict (also in ``results.json``): ``bleu``, ``chrf``, ``sacrebleu_signature``,
        ``params`` (``active_params``: per token, fewer for a mixture of experts), ``updates``, ``wall_time_s``, ``train_tokens_per_s``, ``peak_memory_mb``,
        ``choices``, ``config`` and per-split ``test`` scores.

    One process writes a run folder at a time: rank 0 holds the folder's
    :class:`~transformer.runs.io.FolderLock` until the run ends; a signal of ``train.stop_signals`` stops
    it politely (:mod:`transformer.training.stopping`). A job that submitit requeued continues from
    its checkpoint.

    Raises (an error of a resume that is refused carries ``run_folder_untouched = True``; an error
    that ends a new run before its first update completed carries ``written_by_run``, the paths the
    run created, which ``scripts/train.py`` takes back when a plugin's code raised it):
        FolderLocked: another live process holds the run folder (the message names it; nothing written).
        StopRequested: a stop signal arrived; ``checkpoint_last`` was saved (exit status 75).
        TrainingError: when training diverges (the message names the last finite checkpoint).
        CheckpointError: a checkpoint to resume from that cannot be read or does not fit (the
            message lists the folder's other checkpoints and ``train.resume_from``).
        ConfigError: a resume whose command line changes fields a resumed run cannot change, or a
            new run's ``train.average_last`` its checkpoints cannot give (:func:`~transformer.config.check_checkpoint_averaging`).
    """
    start = time.time()
    command_line = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(config_dict(cfg))
    run_dir = run_dir_for(command_line)
    check_unlocked(run_dir)  # another process writes this folder: stop before reading or writing anything
    before = set(run_dir.iterdir()) if run_dir.is_dir() else None
    command_line = _requeued_job_resumes(command_line, run_dir)
    recorded_plugins = _import_plugins(command_line, run_dir)
    try:
        resume = prepare_resume(command_line, run_dir, torch.device("cpu"))  # reads and checks; writes nothing
        if resume is None:  # a run trained before this check continues as it was trained
            check_checkpoint_averaging(command_line.train)
    except (ConfigError, CheckpointError) as err:
        err.run_folder_untouched = True  # type: ignore[attr-defined]  (scripts/train.py then drops Hydra's record)
        raise
    if resume is not None and resume_mode(command_line.train.resume) == "auto":
        done = completed_results(run_dir, resume)
        if done is not None:  # train.resume=auto on a complete run: nothing is trained or written
            print(
                f"{run_dir} is complete (update {resume.update}, results.json written); train.resume=auto "
                "leaves it as it is",
                file=sys.stderr,
                flush=True,
            )
            done["skipped_complete"] = True
            return done
    cfg = to_config(resume.cfg) if resume is not None else to_config(cfg)
    auto_multiple = _resolve_auto_batching(cfg) and resume is None  # before train.finished_runs compares it
    _record_plugins(cfg, plugins_named(cfg.plugins), resume, run_dir, recorded_plugins)
    if resume is None:  # nothing to continue here: finished on another machine (train.finished_runs)?
        done = skip_if_finished_elsewhere(cfg, run_dir, has_checkpoint=bool(checkpoint_names(run_dir)))
        if done is not None:
            return done
    t = cfg.train
    if t.num_threads > 0:
        torch.set_num_threads(t.num_threads)
    dist_info = setup_distributed(t.device, t.dist_timeout)
    lock = FolderLock(run_dir).acquire() if dist_info.is_main else None  # one writer per run folder (rank 0)
    try:
        return _train(cfg, resume, dist_info, run_dir, start, auto_multiple and resume is None)
    except Exception as err:
        if resume is None and not getattr(err, "updates_done", 0):  # a new run that trained nothing
            now = set(run_dir.iterdir()) if run_dir.is_dir() else set()
            err.written_by_run = sorted(now - (before or set())) + ([run_dir] if before is None else [])  # type: ignore[attr-defined]
        raise
    finally:
        if lock is not None:
            lock.release()


def _import_plugins(command_line: DictConfig, run_dir: Path) -> list[str]:
    """Import the command line's ``plugins`` and, for a run folder that recorded some, those
    (:func:`~transformer.plugins.import_recorded`: a resume never imports code the user did not
    name or trust; ``plugins_trust`` is the command line's, never the folder's).

    Returns:
        the ``plugins`` entries the run folder's ``config.yaml`` recorded (empty for a new run).
    """
    set_user_choice(command_line.get("plugins") or [], bool(command_line.get("plugins_trust", False)))
    import_plugins(command_line.get("plugins") or [])
    saved = run_dir / "config.yaml"
    if saved.is_file():
        recorded = OmegaConf.load(saved)
        if recorded.get("plugins"):
            import_recorded(run_dir, recorded)
            return [str(e) for e in recorded.plugins]
    return []


def _record_plugins(
    cfg: Config, plugins: list[Plugin], resume: ResumePoint | None, run_dir: Path, recorded: list[str]
) -> None:
    """Set ``cfg.plugins`` (absolute) and ``cfg.plugin_files`` (hashes) from the imported plugins, and
    ``cfg.plugins_trust`` to false (trust is each command's, never recorded:
    :func:`~transformer.plugins.untrusted`); a resume whose chosen plugins' files differ from the ones
    the run started with is refused (a plugin loaded but not chosen computes nothing:
    :func:`~transformer.config.used_plugin_files`). A plugin a resume imported from the run folder's own copy
    (``plugins_trust=true``) keeps the path the run recorded, not the copy's.

    Raises:
        ConfigError: the files changed since the run started (each named).
    """
    paths, files = record_plugins(plugins)
    if resume is not None:
        paths = kept_recorded_paths(plugins, paths, recorded, run_dir)
    saved = used_plugin_files(config_dict(cfg))  # the files of the plugins whose options the run chose
    now = {k: v for k, v in files.items() if k.split("/", 1)[0] in {p.split("/", 1)[0] for p in saved}}
    if resume is not None and saved != now:
        changed = sorted(k for k in set(now) | set(saved) if now.get(k) != saved.get(k))
        err = ConfigError(
            f"the plugin files of this run changed since it started ({', '.join(changed[:5])}): a resumed "
            "run continues with the code it trained with; restore the files or train a new run"
        )
        err.run_folder_untouched = True  # type: ignore[attr-defined]
        raise err
    cfg.plugins, cfg.plugin_files = paths, files
    untrusted(cfg)


def _requeued_job_resumes(command_line: DictConfig, run_dir: Path) -> DictConfig:
    """A job that submitit requeued (``SUBMITIT_EXECUTOR`` set, its folder holding a
    ``checkpoint_last``, ``train.resume=false``) continues from its checkpoint (``train.resume=auto``)."""
    t = command_line.train
    if (
        os.environ.get("SUBMITIT_EXECUTOR")
        and not resume_mode(t.resume)
        and not t.get("resume_from")
        and has_checkpoint(run_dir)
    ):
        print(
            f"{run_dir} holds a checkpoint_last and this is a submitit job: a requeued job continues "
            "(train.resume=auto)",
            file=sys.stderr,
            flush=True,
        )
        command_line = command_line.copy()
        with open_dict(command_line):
            command_line.train.resume = "auto"
    return command_line


def _resolve_auto_batching(cfg: Config) -> bool:
    """``train.pad_to_multiple=auto`` of a new run set, in place, to the number of this machine's
    device and precision (:func:`~transformer.data.batching.resolve_pad_to_multiple`), before
    ``train.finished_runs`` compares it with a finished run's recorded number; whether it did. A
    resume keeps the run's own number (``auto`` on its command line changes nothing:
    :func:`~transformer.training.job.resume.resume_config`). ``train.compile=auto`` is set to what
    it means on this device (:func:`~transformer.training.step.compiled.resolve_compile`), new run or
    resume, so the run records whether it compiled. A device that is not here is left to the device
    check (the Trainer resolves ``auto`` itself too)."""
    t = cfg.train
    try:
        device = resolve_device(t.device)
    except RuntimeError:  # not a device torch knows: named by the device check
        return False
    if unavailable(device, "train.device") is not None:
        return False
    t.compile = resolve_compile(t.compile, device.type)
    if str(t.pad_to_multiple) != "auto":
        return False
    t.pad_to_multiple = resolve_pad_to_multiple("auto", device.type, resolve_precision(t.precision, device))
    return True


def _train(
    cfg: Config, resume: ResumePoint | None, dist_info: Any, run_dir: Path, start: float, auto_multiple: bool = False
) -> dict[str, Any]:
    """The part of :func:`train` that writes the run folder (under its lock on rank 0)."""
    t = cfg.train
    if dist_info.device.type == "cpu":
        if t.tune_malloc:
            tune_cpu_allocator()
        limit_onednn_cache(t.onednn_cache_capacity)
    log = RunLog(run_dir, dist_info.is_main)
    data = load_translation_data(cfg.data, log=log)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, data, dist_info, run_dir, log=log)
    choices = job_choices()
    if resume is not None:
        try:
            restore(trainer, resume)
        except CheckpointError as err:
            err.run_folder_untouched = True  # type: ignore[attr-defined]
            raise
        choices = recorded_choices(resume.stem.parent) or choices
    log.open()  # from here on the run folder is written
    if dist_info.is_main:
        stale = remove_stale_temporaries(run_dir)
        if stale:
            log(f"removed {len(stale)} temporary files of interrupted saves: {', '.join(f.name for f in stale[:5])}")
        record_plugins(plugins_named(cfg.plugins), run_dir)  # their files, copied into <run>/plugins/
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(config_dict(cfg)))
        copy_tokenizers(data, run_dir)
    if resume is not None:
        log(f"resumed from {resume.stem} at update {trainer.update} (epoch {trainer.epoch})")
    elif resume_mode(t.resume):
        log(
            f"train.resume={str(resume_mode(t.resume)).lower()} but {run_dir} holds no checkpoint; starting from scratch"
        )
    params, active = count_parameters(trainer.model), count_parameters(trainer.model, active_only=True)
    shown = f"{params:,} parameters" + (f" ({active:,} active per token)" if active != params else "")
    log(
        f"model: {cfg.model.arch}, {shown}, precision {trainer.precision} "
        f"(train.precision={t.precision}), {'compiled' if trainer.compiled else 'eager'} (train.compile={str(t.compile).lower()}); "
        f"run folder {run_dir}"
    )
    log(f"budget: training stops at {budget_sentence(t)}")
    shapes = trainer.sampler.shapes()
    log(
        f"batches: {len(shapes)} distinct (rows x length) shapes per epoch, {len(trainer.sampler)} batches "
        f"(train.pad_to_multiple={'auto: ' if auto_multiple else ''}{t.pad_to_multiple}, "
        f"train.max_tokens={t.max_tokens})"
    )
    loggers = build_loggers(cfg.logger, run_dir, run_name(cfg, choices), config_dict(cfg), dist_info.is_main)
    try:
        with GracefulStop(t.stop_signals, announce=dist_info.is_main) as stopping:
            try:
                stop = trainer.fit(loggers, stopping)
            except StopRequested as stopped:
                log(
                    f"{stopped}; to continue, run the same command with train.resume=auto (a sweep's own command "
                    f"does), or: python scripts/train.py hydra.run.dir={run_dir} train.resume=true"
                )
                loggers.close()
                shutdown_distributed(trainer.parallel)
                stopping.hand_over()  # e.g. submitit's preemption handler: it requeues the job and exits
                raise
        log(f"stopped: {stop}")
        trainer.unshard_for_test()  # FSDP: the final test decodes with full weights on every rank

        results = final_test(trainer, choices, params, start, active_params=active)  # the ranks decode together
        if not dist_info.is_main:
            results = {}
        test_row = {k: v for k, v in results.items() if isinstance(v, (int, float))}
        loggers.log(test_row, step=trainer.update, split="test")
        loggers.close()
    except StopRequested:
        raise
    except Exception as err:  # train() tells a run that failed at its first update from one that trained
        err.updates_done = trainer.update  # type: ignore[attr-defined]
        raise
    shutdown_distributed(trainer.parallel)
    return results


def restore(trainer: Trainer, resume: ResumePoint) -> None:
    """Load a checked :class:`~transformer.training.job.resume.ResumePoint` into ``trainer``.

    Raises:
        CheckpointError: the saved weights or optimiser state do not fit the model of the config.
    """
    try:
        trainer.load_state(resume.model_state, resume.train_state, saved_as=resume.stem)
    except (RuntimeError, KeyError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise CheckpointError(
            f"cannot resume from {resume.stem}: its weights or optimiser state do not fit the model of its "
            f"config ({reason[:300]})"
        ) from err
