"""The learning-rate schedule check: :func:`check_schedule` (a schedule is no module; it is held to
its own properties)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from transformer.config import typed_config, validate_config
from transformer.training.step.schedules import build_scheduler

__all__ = ["check_schedule"]


def check_schedule(
    name: str, *, max_updates: int = 40, base_lr: float = 1e-3, d_model: int = 32, **fields: Any
) -> None:
    """The properties of ``lr_scheduler=name`` (``fields``: its ``lr_scheduler.*`` fields, default
    ``warmup_updates=5``), as training builds it (:func:`~transformer.training.build_scheduler`) for a
    run of ``max_updates`` updates at peak ``base_lr``:

    - the config passes validation (the option's ``validate`` / ``validate_config`` included);
    - the rate is finite and ``>= 0`` at every update from 1 to ``max_updates``;
    - with ``warmup_updates >= 2`` it never falls during the warmup and ends it higher than it began;
    - it is a pure function of its arguments: the rates asked in reverse order, asked again, read off
      an optimizer stepped through the run, and read after loading the scheduler's state at every
      update (a resume) are the same numbers.

    Raises:
        AssertionError: a property failed (the message names it and the update).
        ConfigError: an invalid configuration (named as by training).
    """
    cfg = typed_config(
        {"lr_scheduler": {"name": name, "warmup_updates": 5, **fields}, "train": {"max_updates": max_updates}}
    )
    validate_config(cfg)

    def scheduler() -> Any:
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base_lr)
        return optimizer, build_scheduler(optimizer, cfg.lr_scheduler, base_lr, d_model, max_updates)

    optimizer, sched = scheduler()
    updates = range(1, max_updates + 1)
    rates = [sched.lr_for_update(u) for u in updates]
    for u, lr in zip(updates, rates):
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise AssertionError(f"lr_scheduler={name}: the rate of update {u} is {lr!r}, not a finite number >= 0")
    warmup = int(cfg.lr_scheduler.warmup_updates)
    if warmup >= 2:
        falls = [u for u in range(2, min(warmup, max_updates) + 1) if rates[u - 1] < rates[u - 2]]
        if falls or not rates[min(warmup, max_updates) - 1] > rates[0]:
            raise AssertionError(
                f"lr_scheduler={name}: the warmup (lr_scheduler.warmup_updates={warmup}) does not rise "
                f"(update 1: {rates[0]:.3g}, update {warmup}: {rates[min(warmup, max_updates) - 1]:.3g}"
                + (f"; it falls at update {falls[0]}" if falls else "")
                + ")"
            )
    stepped = []
    for _ in updates:
        stepped.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        sched.step()
    state = sched.state_dict()
    fresh = scheduler()[1]
    again = [fresh.lr_for_update(u) for u in reversed(updates)][::-1]
    resumed = []
    for u in updates:
        other_optimizer, other = scheduler()
        other.load_state_dict({**state, "last_epoch": u - 1})
        resumed.append(float(other_optimizer.param_groups[0]["lr"]))
    for what, values in (
        ("asked in reverse order by a new scheduler", again),
        ("read off the optimizer during the run", stepped),
        ("after a resume at each update", resumed),
    ):
        differ = [u for u, a, b in zip(updates, rates, values) if a != b]
        if differ:
            u = differ[0]
            raise AssertionError(
                f"lr_scheduler={name} is not a pure function of its arguments: the rate of update {u} "
                f"is {rates[u - 1]!r}, and {values[u - 1]!r} {what}"
            )
