"""The training loop's bookkeeping of mixture-of-experts routing (``model/ffn=moe``).

Per update, :class:`RoutingMonitor` adds up what :func:`~transformer.training.step.criterion.model_loss`
returns for each micro-batch (router losses, tokens per expert), sums the expert loads over the
ranks, moves DeepSeek-V3's selection biases after the optimizer step
(:func:`~transformer.models.update_expert_biases`; a no-op unless ``model.ffn.bias_update_speed > 0``)
and returns the metrics the trainer logs to ``metrics.jsonl``. The biases are buffers of the model,
saved with its weights, so a resumed run continues them exactly. A dense model has nothing to
monitor: every call is a no-op. Nothing is read on the host during an update: the sums stay on the
device and :func:`read_routing` turns them into numbers when the trainer logs or saves.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.models import moe_blocks, update_expert_biases

__all__ = ["RoutingMonitor", "read_routing"]


class RoutingMonitor:
    """Router losses and expert loads of one update, and the bias update that ends it.

    Args:
        model: the trained model (the bare module, not its DDP/FSDP wrapper).
        distributed: whether the loads must be summed over the ranks (``torch.distributed`` is
            initialised with more than one process).
    """

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
        """After the optimizer step: sum the update's loads over the ranks, update the selection
        biases and start the next update (every rank calls it: a collective under torchrun).

        Returns:
            ``{}`` for a dense model; else the update's routing on the device, for
            :func:`read_routing`: ``moe_losses`` (``(2, micro_batches)``: each micro-batch's
            unweighted auxiliary loss and z-loss), ``moe_counts`` (the loads over all ranks,
            ``(n_moe_layers, E)`` flattened, then the dropped assignments) and ``moe_layers``.
        """
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
    """The logged routing metrics of :meth:`RoutingMonitor.finish`'s device values (a host sync).

    Args:
        raw: what ``finish`` returned (``{}`` for a dense model).

    Returns:
        ``{}`` for a dense model; else ``moe_aux_loss`` and ``moe_z_loss`` (unweighted, mean over
        this rank's micro-batches), ``moe_tokens_per_expert`` (per MoE layer, in model order, the
        update's assignments of real tokens per expert over all ranks; padding never counts),
        ``moe_max_load`` (the largest expert load over the mean load, all layers; 1 = balanced) and
        ``moe_dropped_tokens`` (0: dropless dispatch).
    """
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
