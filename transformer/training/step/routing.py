"""The training loop's bookkeeping of mixture-of-experts routing: per update, :class:`RoutingMonitor`
adds up each micro-batch's router losses and expert loads, sums the loads over the ranks, moves
DeepSeek-V3's selection biases (saved with the weights), and returns the metrics to log. The sums
stay on the device until :func:`read_routing`; for a dense model every call is a no-op."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.models import moe_blocks, update_expert_biases

__all__ = ["RoutingMonitor", "read_routing"]


class RoutingMonitor:
    """Router losses and expert loads of one update, and the bias update that ends it; ``model`` is the
    bare module, ``distributed`` sums the loads over the ranks."""

    def __init__(self, model: nn.Module, distributed: bool) -> None:
        self.model, self.distributed = model, distributed
        self.enabled = bool(moe_blocks(model))
        self._last: dict[str, Any] = {}  # the last update's routing, on the device until read
        self._reset()

    def _reset(self) -> None:
        self.aux: list[Tensor] = []
        self.z: list[Tensor] = []
        self.load: Tensor | None = None
        self.dropped = 0

    def add(self, out: dict[str, Any]) -> None:
        """Record one micro-batch's :func:`~transformer.training.step.criterion.model_loss` output (a
        dense model's has no router entries: nothing happens). Reads nothing on the host."""
        if "moe_load" not in out:
            return
        self.aux.append(out["moe_aux_loss"])
        self.z.append(out["moe_z_loss"])
        self.load = out["moe_load"] if self.load is None else self.load + out["moe_load"]
        self.dropped += out["moe_dropped"]  # a Python int (the dispatch is dropless)

    def finish(self) -> dict[str, Any]:
        """After the optimizer step (a collective under torchrun): sum the loads over the ranks, update the
        biases and start the next update. Returns ``{}`` for a dense model, else the device values
        :func:`read_routing` reads (``moe_losses`` ``(2, micro_batches)``, ``moe_counts``, ``moe_layers``)."""
        if self.load is None:
            return {}
        counts = torch.cat(
            [self.load.flatten(), self.load.new_full((1,), self.dropped)]
        )  # a fill, not a copy from the host
        if self.distributed:
            dist.all_reduce(counts)
        update_expert_biases(self.model, counts[:-1].view_as(self.load))
        raw = {
            "moe_losses": torch.stack([torch.stack(self.aux), torch.stack(self.z)]),
            "moe_counts": counts,
            "moe_layers": self.load.shape[0],
        }
        self._reset()
        self._last = raw
        return raw

    @property
    def last(self) -> dict[str, Any]:
        """The last update's routing metrics (:func:`read_routing`), read on first access; ``{}``
        for a dense model."""
        if "moe_counts" in self._last:
            self._last = read_routing(self._last)
        return self._last

    def load_last(self, routing: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's ``routing`` (None: a checkpoint that lacks it)."""
        self._last = dict(routing or {})


def read_routing(raw: dict[str, Any]) -> dict[str, Any]:
    """The logged routing metrics (a host sync): ``{}`` for a dense model; else ``moe_aux_loss`` and
    ``moe_z_loss`` (unweighted, mean over micro-batches), ``moe_tokens_per_expert`` (per layer, real
    tokens over all ranks), ``moe_max_load`` (largest over mean load; 1 = balanced) and
    ``moe_dropped_tokens`` (0)."""
    if not raw:
        return {}
    counts = raw["moe_counts"]
    load = counts[:-1].view(raw["moe_layers"], -1)
    mean = load.float().mean(dim=1).clamp(min=1e-9)
    aux, z = raw["moe_losses"].tolist()
    return {
        "moe_aux_loss": sum(aux) / len(aux),
        "moe_z_loss": sum(z) / len(z),
        "moe_tokens_per_expert": load.tolist(),
        "moe_max_load": float((load.float().amax(dim=1) / mean).max()),
        "moe_dropped_tokens": int(counts[-1]),
    }
