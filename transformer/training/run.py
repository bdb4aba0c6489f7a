"""One training run around a :class:`~transformer.training.trainer.Trainer`: the run folder, resume,
data, checkpoints and the final ``results.json`` (the function behind ``scripts/train.py``).

Order matters for reliability: a resume is read and checked (:mod:`transformer.training.resume`)
before anything is written into the run folder; then temporaries of interrupted saves are removed,
``config.yaml`` and the tokenizers are written, and the run's log goes to ``train.log``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer.config import Config, ConfigError, config_dict, to_config
from transformer.data.dataset import load_translation_data
from transformer.io import atomic_write_text
from transformer.models import count_parameters
from transformer.training.allocator import tune_cpu_allocator
from transformer.training.checkpoint import CheckpointError, remove_stale_temporaries
from transformer.training.distributed import setup_distributed, shutdown_distributed
from transformer.training.loggers import build_loggers
from transformer.training.results import (
    RunLog,
    copy_tokenizers,
    final_test,
    hydra_choices,
    run_dir_for,
    run_name,
    saved_choices,
)
from transformer.training.resume import ResumePoint, prepare_resume
from transformer.training.trainer import Trainer

__all__ = ["restore", "train"]


def train(cfg: Config | DictConfig) -> dict[str, Any]:
    """Train ``cfg`` to the end, test it, and write ``results.json`` into the run folder.

    With ``train.resume=true`` (or ``train.resume_from=PATH``) the run continues from its checkpoint
    with its own saved config (see :mod:`transformer.training.resume`); everything is checked before
    anything in the run folder is written. Temporary files of interrupted saves are removed first.

    Args:
        cfg: a validated config (see :func:`transformer.config.validate_config`), typed or as
            Hydra composed it; the run trains with the typed :class:`~transformer.config.Config`.

    Returns:
        The results dict (also in ``results.json``): ``bleu``, ``chrf``, ``sacrebleu_signature``,
        ``params`` (``active_params``: per token, fewer for a mixture of experts), ``updates``, ``wall_time_s``, ``train_tokens_per_s``, ``peak_memory_mb``,
        ``choices``, ``config`` and per-split ``test`` scores.

    Raises (an error of a resume that is refused carries ``run_folder_untouched = True``):
        TrainingError: when training diverges (the message names the last finite checkpoint).
        CheckpointError: a checkpoint to resume from that cannot be read or does not fit (the
            message lists the folder's other checkpoints and ``train.resume_from``).
        ConfigError: a resume whose command line changes fields a resumed run cannot change.
    """
    start = time.time()
    command_line = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(config_dict(cfg))
    run_dir = run_dir_for(command_line)
    try:
        resume = prepare_resume(command_line, run_dir, torch.device("cpu"))  # reads and checks; writes nothing
    except (ConfigError, CheckpointError) as err:
        err.run_folder_untouched = True  # type: ignore[attr-defined]  (scripts/train.py then drops Hydra's record)
        raise
    cfg = to_config(resume.cfg) if resume is not None else to_config(cfg)
    t = cfg.train
    if t.num_threads > 0:
        torch.set_num_threads(t.num_threads)
    dist_info = setup_distributed(t.device)
    if t.tune_malloc and dist_info.device.type == "cpu":
        tune_cpu_allocator()
    log = RunLog(run_dir, dist_info.is_main)
    data = load_translation_data(cfg.data, log=log)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, data, dist_info, run_dir)
    trainer.log = log
    choices = hydra_choices()
    if resume is not None:
        try:
            restore(trainer, resume)
        except CheckpointError as err:
            err.run_folder_untouched = True  # type: ignore[attr-defined]
            raise
        choices = saved_choices(resume.stem.parent) or choices
    log.open()  # from here on the run folder is written
    if dist_info.is_main:
        stale = remove_stale_temporaries(run_dir)
        if stale:
            log(f"removed {len(stale)} temporary files of interrupted saves: {', '.join(f.name for f in stale[:5])}")
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(config_dict(cfg)))
        copy_tokenizers(data, run_dir)
    if resume is not None:
        log(f"resumed from {resume.stem} at update {trainer.update} (epoch {trainer.epoch})")
    elif t.resume:
        log(f"train.resume=true but {run_dir} holds no checkpoint; starting from scratch")
    params, active = count_parameters(trainer.model), count_parameters(trainer.model, active_only=True)
    shown = f"{params:,} parameters" + (f" ({active:,} active per token)" if active != params else "")
    log(f"model: {cfg.model.arch}, {shown}, precision {trainer.precision} "
        f"(train.precision={t.precision}); run folder {run_dir}")
    loggers = build_loggers(cfg.logger, run_dir, run_name(cfg, choices), config_dict(cfg), dist_info.is_main)
    stop = trainer.fit(loggers)
    log(f"stopped: {stop}")
    if trainer.parallel.mode == "fsdp":  # the final test runs on rank 0 alone, with full weights
        trainer.model = trainer.eval_model()

    results: dict[str, Any] = {}
    if dist_info.is_main:
        results = final_test(trainer, choices, params, start, active_params=active)
    loggers.log({k: v for k, v in results.items() if isinstance(v, (int, float))}, step=trainer.update, split="test")
    loggers.close()
    shutdown_distributed()
    return results


def restore(trainer: Trainer, resume: ResumePoint) -> None:
    """Load a checked :class:`~transformer.training.resume.ResumePoint` into ``trainer``.

    Raises:
        CheckpointError: the saved weights or optimiser state do not fit the model of the config.
    """
    try:
        trainer.load_state(resume.model_state, resume.train_state)
    except (RuntimeError, KeyError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise CheckpointError(
            f"cannot resume from {resume.stem}: its weights or optimiser state do not fit the model of its "
            f"config ({reason[:300]})"
        ) from err
    trainer.last_saved = (resume.stem, trainer.update)
