"""Warmup-stable-decay (WSD; Hu et al. 2024, "MiniCPM", §4.1), as a plugin: a learning-rate schedule
with a field of its own.

A linear warmup to ``optim.lr`` over ``lr_scheduler.warmup_updates``, the peak held, then a linear
decay to ``lr_scheduler.min_lr`` over the last ``lr_scheduler.decay_fraction`` of
``train.max_updates`` (MiniCPM decays exponentially over about 10% of the run; a linear decay is the
common variant). Its two checks show both hooks: ``validate(self)`` refuses a fraction outside
(0, 1], ``validate_config(self, cfg)`` a run without ``train.max_updates`` or one whose warmup and
decay do not fit in it, each in one line before anything runs.

    python scripts/train.py plugins=[examples/plugins/wsd_schedule] lr_scheduler=wsd lr_scheduler.decay_fraction=0.3 train.max_updates=4000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer.config import SchedulerConfig
from transformer.registry import register_lr_scheduler


@dataclass
class WSDConfig(SchedulerConfig):
    """``lr_scheduler=wsd``: the fields every schedule has, and the share of the run spent decaying."""

    name: str = "wsd"
    decay_fraction: float = 0.2  # the last 20% of train.max_updates decay linearly to min_lr

    def validate(self) -> None:
        """Called with the option's node before anything is built."""
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"lr_scheduler.decay_fraction={self.decay_fraction} must be in (0, 1]")

    def validate_config(self, cfg: Any) -> None:
        """Called with the option's node and the whole config: the combination with ``train.max_updates``."""
        if cfg.train.max_updates <= 0:
            raise ValueError("needs train.max_updates > 0 (the decay ends there), e.g. train.max_updates=4000")
        decay = round(self.decay_fraction * cfg.train.max_updates)
        if self.warmup_updates + decay > cfg.train.max_updates:
            raise ValueError(
                f"lr_scheduler.warmup_updates={self.warmup_updates} plus the decay's {decay} updates "
                f"(lr_scheduler.decay_fraction={self.decay_fraction}) exceed train.max_updates="
                f"{cfg.train.max_updates}"
            )


@register_lr_scheduler("wsd", config=WSDConfig)
def wsd(update: int, cfg: Any, base_lr: float, d_model: int, max_updates: int) -> float:
    """The learning rate of update ``update`` (from 1): warmup, the peak ``base_lr``, a linear decay
    to ``cfg.min_lr`` ending at ``max_updates`` (and ``min_lr`` after it)."""
    warmup = cfg.warmup_updates
    if update <= warmup:
        return cfg.warmup_init_lr + (base_lr - cfg.warmup_init_lr) * update / warmup
    decay = max(1, round(cfg.decay_fraction * max_updates))
    start = max_updates - decay
    if update <= start:
        return base_lr
    return base_lr + (cfg.min_lr - base_lr) * min(1.0, (update - start) / decay)
