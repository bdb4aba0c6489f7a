"""Exponential moving average of the weights (``train.ema_decay``): ``ema = decay * ema + (1 - decay)
* weight`` after every update (Polyak & Juditsky 1992; Marian's ``--exponential-smoothing``), in
fp32 from the initial weights, with PyTorch's ``get_ema_multi_avg_fn``. Validation and the final
test swap the averages in (:meth:`EMA.swapped`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

__all__ = ["EMA"]


class EMA:
    """fp32 moving averages of a model's parameters, by name; ``decay`` in ``(0, 1)`` (0.999: about the
    last 1000 updates).

    Tied parameters are averaged once, and :meth:`state_dict` gives every name of the model's, so it
    loads like the model's own weights; persistent buffers are not averaged (their current values).

    Raises:
        ValueError: ``decay`` outside ``(0, 1)``.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"train.ema_decay={decay} must be in (0, 1) (0 turns the average off)")
        self.decay = float(decay)
        self._update = get_ema_multi_avg_fn(self.decay)
        params = dict(model.named_parameters())  # tied parameters appear once
        self.names = list(params)
        self.shadow = [p.detach().float().clone() for p in params.values()]
        self._aliases = _aliases(model)  # state_dict name -> parameter name
        saved = model.state_dict(keep_vars=True)
        self._live_buffers = {n: b for n, b in model.named_buffers() if n in saved}  # live tensors, not averaged

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the averages towards ``model``'s current weights (call after each optimizer step)."""
        params = dict(model.named_parameters())
        current = [params[n].detach().float() for n in self.names]
        self._update(self.shadow, current, 1)  # the count only matters to AveragedModel's first copy

    def state_dict(self) -> dict[str, Tensor]:
        """The averaged weights under the model's ``state_dict`` names (fp32), with the model's
        current persistent buffers."""
        by_name = dict(zip(self.names, self.shadow))
        buffers = {k: b.detach().clone() for k, b in self._live_buffers.items()}
        return {**{k: by_name[p] for k, p in self._aliases.items()}, **buffers}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore averages saved by :meth:`state_dict` (copied, kept in fp32).

        Raises:
            KeyError: a parameter of the model is missing from ``state``.
        """
        missing = [n for n in self.names if n not in state]
        if missing:
            raise KeyError(f"EMA state lacks {missing[:5]}")
        for i, n in enumerate(self.names):
            self.shadow[i] = state[n].detach().to(self.shadow[i].device, torch.float32).clone()

    def to(self, device: torch.device | str) -> EMA:
        """Move the averages to ``device``; returns self."""
        self.shadow = [t.to(device) for t in self.shadow]
        return self

    @contextmanager
    @torch.no_grad()
    def swapped(self, model: nn.Module) -> Iterator[nn.Module]:
        """Yield ``model`` holding the averages (in each parameter's dtype); its own weights come back
        afterwards, bit for bit, also when the block raises."""
        params = dict(model.named_parameters())
        saved = [params[n].detach().clone() for n in self.names]
        try:
            for n, avg in zip(self.names, self.shadow):
                params[n].copy_(avg)
            yield model
        finally:
            for n, w in zip(self.names, saved):
                params[n].copy_(w)


def _aliases(model: nn.Module) -> dict[str, str]:
    """``state_dict`` key -> the ``named_parameters`` name of the same tensor (tied keys share one)."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        first.setdefault(id(p), name)
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first[id(p)]
    return out
