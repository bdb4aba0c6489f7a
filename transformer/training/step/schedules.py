"""Learning-rate schedules: inverse square root (fairseq and Vaswani et al. 2017 forms), cosine and
constant, each with a linear warmup.

Updates are numbered from 1: update ``u`` (the ``u``-th ``optimizer.step()``) uses ``lr_at(u)``, and
after ``scheduler.step()`` the optimizer holds ``lr_at(scheduler.last_epoch + 1)``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from transformer.config.options import LR_SCHEDULERS

_NAMES = ("inverse_sqrt", "cosine", "constant")
_FORMS = ("fairseq", "noam")

SCHEDULES: dict[str, Callable[[int, Any, float, int, int], float]] = {}
"""Plugin schedules (:func:`transformer.registry.register_lr_scheduler`): name -> a function of
:func:`lr_at`'s arguments."""
assert tuple(LR_SCHEDULERS) == _NAMES  # the names validation accepts before any plugin registers


def _linear_warmup(update: int, warmup: int, init_lr: float, peak_lr: float) -> float:
    return init_lr + (peak_lr - init_lr) * update / warmup


def lr_at(update: int, cfg: Any, base_lr: float, d_model: int, max_updates: int) -> float:
    """The learning rate of update ``update`` (from 1); ``w = cfg.warmup_updates``, ``u = update``.

    - ``inverse_sqrt``, ``form=fairseq``: linear warmup from ``warmup_init_lr`` to ``base_lr`` at
      ``u = w``, then ``base_lr * sqrt(w / u)``.
    - ``inverse_sqrt``, ``form=noam`` (Vaswani et al. 2017 eq. 3):
      ``noam_scale * d_model^-0.5 * min(u^-0.5, u * w^-1.5)``; ``base_lr`` is not used.
    - ``cosine``: the warmup, then a half cosine from ``base_lr`` to ``cfg.min_lr`` at ``max_updates``
      (Loshchilov & Hutter 2017, no restarts), ``min_lr`` after it.
    - ``constant``: the warmup, then ``base_lr``. ``w = 0``: no warmup (cosine and constant only).

    Raises:
        ValueError: ``update < 1``, an unknown name or form, ``noam`` with another schedule or a
            nonzero ``warmup_init_lr``, ``inverse_sqrt`` without warmup, a negative warmup, or
            ``cosine`` with ``max_updates <= warmup_updates``.
    """
    if update < 1:
        raise ValueError(f"updates are numbered from 1, got update={update}")
    name, form, warmup = cfg.name, cfg.form, int(cfg.warmup_updates)
    if name in SCHEDULES:  # a plugin's
        return float(SCHEDULES[name](update, cfg, base_lr, d_model, max_updates))
    if name not in _NAMES:
        raise ValueError(f"lr_scheduler.name={name!r} is not one of {', '.join((*_NAMES, *SCHEDULES))}")
    if form not in _FORMS:
        raise ValueError(f"lr_scheduler.form={form!r} is not one of {', '.join(_FORMS)}")
    if warmup < 0:
        raise ValueError(f"lr_scheduler.warmup_updates={warmup} must be >= 0")

    if name == "inverse_sqrt":
        if warmup <= 0:
            raise ValueError(
                "lr_scheduler=inverse_sqrt needs lr_scheduler.warmup_updates > 0 (the decay is "
                "anchored at the end of warmup)"
            )
        if form == "noam":
            if cfg.warmup_init_lr != 0.0:
                raise ValueError(
                    "lr_scheduler.form=noam warms up from 0 (Vaswani et al. 2017 eq. 3); "
                    f"lr_scheduler.warmup_init_lr={cfg.warmup_init_lr} is only used by form=fairseq"
                )
            return cfg.noam_scale * d_model**-0.5 * min(update**-0.5, update * warmup**-1.5)
        if update <= warmup:
            return _linear_warmup(update, warmup, cfg.warmup_init_lr, base_lr)
        return base_lr * math.sqrt(warmup / update)

    if form == "noam":
        raise ValueError(f"lr_scheduler.form=noam applies to inverse_sqrt only, not {name}")
    if name == "cosine" and max_updates <= warmup:
        raise ValueError(
            f"lr_scheduler=cosine needs train.max_updates ({max_updates}) > lr_scheduler.warmup_updates ({warmup})"
        )
    if update <= warmup:
        return _linear_warmup(update, warmup, cfg.warmup_init_lr, base_lr)
    if name == "constant":
        return base_lr
    # cosine
    progress = min(1.0, (update - warmup) / (max_updates - warmup))
    return cfg.min_lr + (base_lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _ScheduleParams:
    """The fields of a SchedulerConfig as plain values (a frozen copy, independent of OmegaConf)."""

    def __init__(self, cfg: Any) -> None:
        fields = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg.items())
        for key, value in fields.items():  # a plugin schedule's own fields too
            setattr(self, key, value)
        self.name = str(cfg.name)
        self.form = str(cfg.form)
        self.warmup_updates = int(cfg.warmup_updates)
        self.noam_scale = float(cfg.noam_scale)
        self.warmup_init_lr = float(cfg.warmup_init_lr)
        self.min_lr = float(cfg.min_lr)


class WarmupLRScheduler(LRScheduler):
    """A PyTorch LR scheduler that sets every param group's learning rate to :func:`lr_at`.

    Construction sets ``lr_at(1)``; each :meth:`step` after ``optimizer.step()`` sets the next update's
    rate. The state holds only the position (plain ints, ``weights_only`` loadable), and loading it
    re-applies the next rate, so the order of loading optimizer and scheduler states does not matter.

    Raises:
        ValueError: an invalid configuration (:func:`lr_at`).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, cfg: Any, base_lr: float, d_model: int, max_updates: int
    ) -> None:
        self._params = _ScheduleParams(cfg)
        self._base_lr = float(base_lr)
        self._d_model = int(d_model)
        self._max_updates = int(max_updates)
        lr_at(1, self._params, self._base_lr, self._d_model, self._max_updates)  # validate now
        super().__init__(optimizer, last_epoch=-1)

    @property
    def num_updates(self) -> int:
        """Completed updates (``scheduler.step()`` calls)."""
        return self.last_epoch

    def lr_for_update(self, update: int) -> float:
        """:func:`lr_at` with this scheduler's configuration (``update`` numbered from 1)."""
        return lr_at(update, self._params, self._base_lr, self._d_model, self._max_updates)

    def get_lr(self) -> list[float]:
        """The rate of the next update, ``lr_at(last_epoch + 1)``, once per param group."""
        lr = self.lr_for_update(self.last_epoch + 1)
        return [lr for _ in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """The position in the schedule: ``{"last_epoch": int, "_step_count": int}``."""
        return {"last_epoch": int(self.last_epoch), "_step_count": int(self._step_count)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the position and set the optimizer's rate to that of the next update.

        Raises:
            KeyError: ``state_dict`` has no ``last_epoch``.
        """
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        lr = self.lr_for_update(self.last_epoch + 1)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [lr for _ in self.optimizer.param_groups]


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Any, base_lr: float, d_model: int, max_updates: int
) -> WarmupLRScheduler:
    """A :class:`WarmupLRScheduler` for ``optimizer`` that has already set ``lr_at(1)``.

    Raises:
        ValueError: an invalid configuration (:func:`lr_at`).
    """
    return WarmupLRScheduler(optimizer, cfg, base_lr, d_model, max_updates)


__all__ = ["WarmupLRScheduler", "build_scheduler", "lr_at"]
