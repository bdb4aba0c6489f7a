"""Learning-rate schedules: inverse square root (fairseq and Vaswani et al. 2017 forms), cosine and
constant, each with a linear warmup.

Update numbering: updates are numbered from 1, and the learning rate used by update ``u`` (the
``u``-th ``optimizer.step()``) is :func:`lr_at` ``(u)``. :class:`WarmupLRScheduler` keeps that
contract with the usual PyTorch call order::

    for batch in batches:          # update u = 1, 2, ...
        loss.backward()
        optimizer.step()           # uses lr_at(u)
        scheduler.step()           # sets lr_at(u + 1) for the next update

``scheduler.last_epoch`` counts the completed updates, so the optimizer's learning rate is always
``lr_at(scheduler.last_epoch + 1)``.
"""

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
"""Schedules registered by plugins (:func:`transformer.registry.register_lr_scheduler`): name ->
``schedule(update, cfg, base_lr, d_model, max_updates) -> learning rate``, with :func:`lr_at`'s
arguments (``cfg`` holds every ``lr_scheduler.*`` field, the option's own included). The built-in
names are :data:`_NAMES` (their formulas are in :func:`lr_at`)."""
assert tuple(LR_SCHEDULERS) == _NAMES  # the names validation accepts before any plugin registers


def _linear_warmup(update: int, warmup: int, init_lr: float, peak_lr: float) -> float:
    return init_lr + (peak_lr - init_lr) * update / warmup


def lr_at(update: int, cfg: Any, base_lr: float, d_model: int, max_updates: int) -> float:
    """The learning rate used by update ``update`` (numbered from 1).

    Schedules (``cfg.name`` / ``cfg.form``), with ``w = cfg.warmup_updates`` and ``u = update``:

    - ``inverse_sqrt``, ``form=fairseq`` (fairseq ``inverse_sqrt``): linear warmup
      ``warmup_init_lr + (base_lr - warmup_init_lr) * u / w`` for ``u <= w``, then
      ``base_lr * sqrt(w / u)``. The peak, reached at ``u = w``, is ``base_lr``.
    - ``inverse_sqrt``, ``form=noam`` (Vaswani et al. 2017 §5.3, eq. 3):
      ``noam_scale * d_model^-0.5 * min(u^-0.5, u * w^-1.5)``. ``base_lr`` and ``warmup_init_lr``
      are not used; this equals the fairseq form with ``warmup_init_lr = 0`` and
      ``base_lr = noam_scale * d_model^-0.5 * w^-0.5`` (6.99e-4 for d_model 512, w 4000).
    - ``cosine``: the same linear warmup, then a half cosine from ``base_lr`` down to
      ``cfg.min_lr`` at ``u = max_updates`` (Loshchilov & Hutter 2017, without restarts), and
      ``min_lr`` after it.
    - ``constant``: the same linear warmup, then ``base_lr``.

    ``w = 0`` means no warmup (``cosine`` and ``constant`` only).

    Args:
        update: the update number, ``>= 1``.
        cfg: a :class:`transformer.config.SchedulerConfig` (or a DictConfig with its fields).
        base_lr: the peak learning rate (``optim.lr``), in the optimizer's units.
        d_model: the model width, used by the ``noam`` form only.
        max_updates: the length of the run in updates, used by ``cosine`` only.

    Returns:
        The learning rate as a float.

    Raises:
        ValueError: for ``update < 1``, an unknown ``cfg.name`` or ``cfg.form``, ``form=noam`` with
            another schedule than ``inverse_sqrt`` or with ``warmup_init_lr != 0``,
            ``inverse_sqrt`` with ``warmup_updates <= 0``, a negative ``warmup_updates``, or
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

    The optimizer's learning rate during update ``u`` (numbered from 1) is ``lr_at(u)``:
    construction sets ``lr_at(1)``, and each :meth:`step` (called after ``optimizer.step()``)
    sets the rate of the next update. All param groups get the same absolute rate; the groups'
    own ``lr`` values are overwritten.

    :meth:`state_dict` holds only the position (``last_epoch`` = completed updates) as plain ints
    and floats, so it loads with ``torch.load(weights_only=True)``; the schedule itself comes
    from the config given to the constructor, and :meth:`load_state_dict` re-applies the rate of
    the next update, so loading the optimizer state before or after the scheduler state gives
    the same learning rate.

    Args:
        optimizer: the optimizer whose param groups are driven.
        cfg: a :class:`transformer.config.SchedulerConfig`.
        base_lr: the peak learning rate (``optim.lr``).
        d_model: the model width (``noam`` form).
        max_updates: the run length in updates (``cosine``).

    Raises:
        ValueError: when the configuration is invalid (see :func:`lr_at`).
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
        """The number of completed updates (``scheduler.step()`` calls)."""
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
            KeyError: when ``state_dict`` has no ``last_epoch``.
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
    """Build the scheduler of ``cfg`` for ``optimizer``; see :class:`WarmupLRScheduler`.

    Args:
        optimizer: the optimizer to drive.
        cfg: a :class:`transformer.config.SchedulerConfig`.
        base_lr: the peak learning rate (``optim.lr``).
        d_model: the model width (``noam`` form).
        max_updates: the run length in updates (``cosine``; ``train.max_updates``).

    Returns:
        A :class:`WarmupLRScheduler` that has already set ``lr_at(1)`` on the optimizer.

    Raises:
        ValueError: when the configuration is invalid (see :func:`lr_at`).
    """
    return WarmupLRScheduler(optimizer, cfg, base_lr, d_model, max_updates)


__all__ = ["WarmupLRScheduler", "build_scheduler", "lr_at"]
