"""Training, sorted by what each part does (lowest room first; a room imports only rooms above it
in this list, ``tests/test_imports.py``):

- :mod:`.errors` and :mod:`.stopping`: the training error, stop signals and the time budget
  (the loop and the job both use them);
- :mod:`.step`: one update's parts: the criterion, the compiled step, the optimizer, the schedules,
  precision, the moving average, routing statistics, the update's numbers, the non-finite checks;
- :mod:`.checkpoint`: the checkpoint files, their manager, averaging and RNG states;
- :mod:`.distributed`: the process group and the DDP / FSDP2 engine;
- :mod:`.monitoring`: metrics loggers, memory peaks, the progress bar;
- :mod:`.loop`: the :class:`~transformer.training.loop.trainer.Trainer` (its ``fit`` owns the loop),
  its saved training state and validation;
- :mod:`.job`: one run around the loop (:func:`~transformer.training.job.run.train`), the
  resume, finished runs, ``results.json``, the allocator;
- :mod:`.command`: the work of ``scripts/train.py`` (:func:`~transformer.training.command.train_job`).

This package re-exports the building blocks below (schedules, criterion, optimizer, checkpoints,
loggers); heavy optional dependencies (wandb, tensorboard) are imported only when their logger is
built.
"""

from transformer.training.checkpoint import (
    CheckpointError,
    CheckpointManager,
    atomic_write,
    average_checkpoints,
    get_rng_state,
    load_checkpoint,
    load_weights,
    numbered_checkpoints,
    save_checkpoint,
    save_weights,
    set_rng_state,
)
from transformer.training.monitoring.loggers import (
    JsonlLogger,
    MetricsLogger,
    MultiLogger,
    TensorboardLogger,
    WandbLogger,
    build_loggers,
)
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, label_smoothed_nll_loss, perplexity
from transformer.training.step.optim import build_optimizer, param_groups_for_weight_decay
from transformer.training.step.schedules import WarmupLRScheduler, build_scheduler, lr_at

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "JsonlLogger",
    "LabelSmoothedCrossEntropy",
    "MetricsLogger",
    "MultiLogger",
    "TensorboardLogger",
    "WandbLogger",
    "WarmupLRScheduler",
    "atomic_write",
    "average_checkpoints",
    "build_loggers",
    "build_optimizer",
    "build_scheduler",
    "get_rng_state",
    "label_smoothed_nll_loss",
    "load_checkpoint",
    "load_weights",
    "lr_at",
    "numbered_checkpoints",
    "param_groups_for_weight_decay",
    "perplexity",
    "save_checkpoint",
    "save_weights",
    "set_rng_state",
]
