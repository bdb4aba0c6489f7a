"""The training loop's bookkeeping of mixture-of-experts routing (``model/ffn=moe``).

Per update, :class:`RoutingMonitor` adds up what :func:`~transformer.training.criterion.model_loss`
returns for each micro-batch (router losses, tokens per expert), sums the expert loads over the
ranks, moves DeepSeek-V3's selection biases after the optimizer step
(:func:`~transformer.models.update_expert_biases`; a no-op unless ``model.ffn.bias_update_speed > 0``)
and returns the metrics the trainer logs to ``metrics.jsonl``. The biases are buffers of the model,
saved with its weights, so a resumed run continues them exactly. A dense model has nothing to
monitor: every call is a no-op.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.models import moe_blocks, update_expert_biases

__all__ = ["RoutingMonitor"]


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
        self._reset()

    def _reset(self) -> None:
        self.aux = self.z = 0.0
        self.micro_batches = 0
        self.load: Tensor | None = None
        self.dropped = 0

    def add(self, out: dict[str, Any]) -> None:
        """Record one micro-batch's :func:`~transformer.training.criterion.model_loss` output (a
        dense model's has no router entries: nothing happens)."""
        if "moe_load" not in out:
            return
        self.aux += float(out["moe_aux_loss"])
        self.z += float(out["moe_z_loss"])
        self.micro_batches += 1
        self.load = out["moe_load"] if self.load is None else self.load + out["moe_load"]
        self.dropped += int(out["moe_dropped"])

    def finish(self) -> dict[str, Any]:
        """After the optimizer step: sum the update's loads over the ranks, update the selection
        biases and start the next update (every rank calls it: a collective under torchrun).

        Returns:
            ``{}`` for a dense model; else ``moe_aux_loss`` and ``moe_z_loss`` (unweighted, mean over
            this rank's micro-batches), ``moe_tokens_per_expert`` (per MoE layer, in model order,
            the update's assignments of real tokens per expert over all ranks; padding never
            counts), ``moe_max_load`` (the
            largest expert load over the mean load, all layers; 1 = balanced) and
            ``moe_dropped_tokens`` (0: dropless dispatch).
        """
        if self.load is None:
            return {}
        counts = torch.cat([self.load.flatten(), self.load.new_tensor([self.dropped])])
        if self.distributed:
            dist.all_reduce(counts)
        load = counts[:-1].view_as(self.load)
        update_expert_biases(self.model, load)
        mean = load.float().mean(dim=1).clamp(min=1e-9)
        metrics = {
            "moe_aux_loss": self.aux / self.micro_batches,
            "moe_z_loss": self.z / self.micro_batches,
            "moe_tokens_per_expert": load.tolist(),
            "moe_max_load": float((load.float().amax(dim=1) / mean).max()),
            "moe_dropped_tokens": int(counts[-1]),
        }
        self._reset()
        return metrics
