"""Data parallelism under torchrun: this process's rank and device, and the process group.

A run launched by ``torchrun --nproc_per_node=N scripts/train.py`` has ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK`` in its environment; :func:`setup_distributed` joins the process group (NCCL on CUDA,
gloo on CPU). How gradients are shared (DistributedDataParallel or FSDP2, summed and divided by
the global number of target tokens, so N ranks compute the same update as one rank with
``update_freq=N``) is :mod:`transformer.training.parallel`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "broadcast_from_main", "setup_distributed", "shutdown_distributed"]


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


def broadcast_from_main(obj: Any, dist_info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; returned unchanged without torchrun)."""
    if dist_info.world_size <= 1:
        return obj
    shared = [obj]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
