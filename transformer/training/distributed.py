"""Data parallelism under torchrun: this process's rank and device, and the gradient all-reduce.

A run launched by ``torchrun --nproc_per_node=N scripts/train.py`` has ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK`` in its environment; :func:`setup_distributed` joins the process group (NCCL on CUDA,
gloo on CPU). Gradients are summed across ranks with one all-reduce of one flat buffer per update
(:func:`all_reduce_grads`) and divided by the global number of target tokens, so N ranks compute
the same update as one rank with ``update_freq=N`` (fairseq's normalisation).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["DistInfo", "all_reduce_grads", "broadcast_from_main", "setup_distributed", "shutdown_distributed"]


@dataclass
class DistInfo:
    """Rank, world size and device of this process."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that writes files and logs)."""
        return self.rank == 0


def setup_distributed(device_name: str) -> DistInfo:
    """Initialise ``torch.distributed`` when launched by torchrun (``WORLD_SIZE > 1``).

    Uses NCCL on CUDA and gloo on CPU; ``device_name`` ``auto`` picks CUDA when present.

    Args:
        device_name: ``auto``, ``cpu``, ``cuda`` or any ``torch.device`` string; under ``cuda`` each
            rank takes the GPU ``LOCAL_RANK``.

    Returns:
        This process's :class:`DistInfo` (rank 0 of 1 without torchrun).
    """
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device_name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device(device_name)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, world_size, device)


def shutdown_distributed() -> None:
    """Wait for every rank, then leave the process group (nothing to do without one)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_grads(parameters: Iterable[Tensor], ntokens: int, loss_sum: float, dist_info: DistInfo) -> tuple[int, float]:
    """Sum gradients, token counts and losses over ranks; scale gradients to a per-token mean.

    Args:
        parameters: the model's parameters (those without a gradient are skipped).
        ntokens: target tokens of this rank's micro-batches.
        loss_sum: this rank's summed loss.
        dist_info: this process's rank / world size / device.

    Returns:
        The global ``(ntokens, loss_sum)``; every gradient is divided in place by the global
        ``ntokens`` (when > 0).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if dist_info.world_size > 1:
        extra = torch.tensor([float(ntokens), loss_sum], dtype=grads[0].dtype, device=dist_info.device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
        dist.all_reduce(flat)
        ntokens, loss_sum = int(round(flat[-2].item())), float(flat[-1].item())
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    if ntokens > 0:
        for g in grads:
            g.div_(ntokens)
    return ntokens, loss_sum


def broadcast_from_main(obj: Any, dist_info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; returned unchanged without torchrun)."""
    if dist_info.world_size <= 1:
        return obj
    shared = [obj]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
