"""Training building blocks used by the trainer loop: LR schedules, the label-smoothed criterion,
the optimizer builder, crash-safe checkpoints and metrics loggers.

Heavy optional dependencies (wandb, tensorboard) are imported only when their logger is built.
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
from transformer.training.criterion import LabelSmoothedCrossEntropy, label_smoothed_nll_loss, perplexity
from transformer.training.loggers import (
    JsonlLogger,
    MetricsLogger,
    MultiLogger,
    TensorboardLogger,
    WandbLogger,
    build_loggers,
)
from transformer.training.optim import build_optimizer, param_groups_for_weight_decay
from transformer.training.schedules import WarmupLRScheduler, build_scheduler, lr_at

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
