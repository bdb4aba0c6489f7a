"""A trainer's training state: what a checkpoint's ``.pt`` file holds besides the weights
(optimizer, scheduler, grad scaler, RNG states, sampler position, counters, the moving average's
training weights and the config), and how a resumed :class:`~transformer.training.loop.trainer.Trainer`
takes it back (:meth:`~transformer.training.loop.trainer.Trainer.train_state` and
:meth:`~transformer.training.loop.trainer.Trainer.load_state` call these).

The functions read and set the attributes :class:`TrainerParts` names, so this module does not
import the trainer's (which imports this one).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from transformer.config import Config, config_dict
from transformer.training.checkpoint import get_rng_state, set_rng_state
from transformer.training.step.ema import EMA


class TrainerParts(Protocol):
    """What the training state is made of: the attributes of a
    :class:`~transformer.training.loop.trainer.Trainer` that :func:`train_state` reads and
    :func:`load_train_state` sets."""

    cfg: Config
    model: torch.nn.Module
    ema: EMA | None
    parallel: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    sampler: Any
    update: int
    epoch: int
    best_metric: float | None
    bad_validations: int
    train_tokens: int
    train_time: float
    wall_time_before: float
    last_routing: dict[str, Any]

    def wall_time(self) -> float: ...

    def data_position(self) -> dict[str, int]: ...


__all__ = ["TrainerParts", "load_train_state", "train_state"]


def train_state(trainer: TrainerParts) -> dict[str, Any]:
    """Everything but the saved weights needed to continue exactly (loadable with weights_only).

    With ``train.ema_decay > 0`` the checkpoint's weights file holds the moving average (the
    weights to translate with) and ``ema`` here holds the decay and the training weights.
    """
    ema = None
    if trainer.ema is not None:
        ema = {"decay": trainer.ema.decay, "model": trainer.model.state_dict()}
    return {
        "optimizer": trainer.parallel.optimizer_state_dict(trainer.optimizer),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": get_rng_state(),
        "sampler": trainer.data_position(),  # the batches trained on, not those prepared ahead
        "update": trainer.update,
        "epoch": trainer.epoch,
        "best_metric": trainer.best_metric,
        "bad_validations": trainer.bad_validations,
        "train_tokens": trainer.train_tokens,
        "train_time": trainer.train_time,
        "wall_time": trainer.wall_time(),
        "ema": ema,
        "routing": trainer.last_routing,
        "config": config_dict(trainer.cfg),
    }


def load_train_state(trainer: TrainerParts, model_state: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    """Restore weights and training state saved by :meth:`~transformer.training.loop.trainer.Trainer.save`
    (every rank loads the same files).

    A checkpoint written with a moving average restores the training weights from the state and
    the average from ``model_state``; turning ``train.ema_decay`` on at resume starts the average
    from the resumed weights, turning it off continues from the training weights.
    """
    saved_ema = state.get("ema")
    trainer.parallel.load_full_state_dict(saved_ema["model"] if saved_ema else model_state)
    if trainer.ema is not None:
        if saved_ema:
            trainer.ema.load_state_dict(model_state)
        else:
            trainer.ema = EMA(trainer.model, trainer.ema.decay)
    trainer.parallel.load_optimizer_state_dict(trainer.optimizer, state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    trainer.update, trainer.epoch = int(state["update"]), int(state["epoch"])
    trainer.best_metric = state["best_metric"]
    trainer.bad_validations = int(state["bad_validations"])
    trainer.train_tokens, trainer.train_time = int(state["train_tokens"]), float(state["train_time"])
    trainer.wall_time_before = float(state.get("wall_time", 0.0))  # checkpoints before it was recorded: 0
    trainer.last_routing = dict(state.get("routing") or {})  # checkpoints before it was recorded: none
