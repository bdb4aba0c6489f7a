"""Data parallelism under torchrun (or a submitit SLURM task): this process's rank and device, and
the process group (NCCL on CUDA, gloo on the CPU). How gradients are shared is
:mod:`transformer.training.distributed.parallel`."""

from __future__ import annotations

import datetime
import gc
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from transformer.config import ConfigError
from transformer.device import resolve_device, unavailable

__all__ = [
    "broadcast_weights",
    "DistInfo",
    "broadcast_from_main",
    "export_submitit_environment",
    "setup_distributed",
    "shutdown_distributed",
]


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


def export_submitit_environment() -> bool:
    """In a submitit task not started by torchrun, export torchrun's variables (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) from the SLURM job
    environment; return whether it did. Each task takes GPU ``LOCAL_RANK``."""
    if "SUBMITIT_EXECUTOR" not in os.environ or "WORLD_SIZE" in os.environ:
        return False
    from submitit.helpers import TorchDistributedEnvironment  # the optional [slurm] extra

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


def setup_distributed(device_name: str, timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group when ``WORLD_SIZE > 1``; return this process's :class:`DistInfo` (rank 0
    of 1 without it).

    The device is :func:`~transformer.device.resolve_device`'s (``cuda``: GPU ``LOCAL_RANK``).
    ``timeout_s`` (``train.dist_timeout``) is how long a collective waits; NCCL's 10-minute default is
    too short for a rank saving a big model.

    Raises:
        ConfigError: a CUDA device where torch sees none.
    """
    export_submitit_environment()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = resolve_device(device_name)
    if why := unavailable(device, "train.device"):
        raise ConfigError(why)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        cuda = device.type == "cuda"
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if cuda else None,  # NCCL binds its communicator to this rank's GPU at once
        )
    return DistInfo(rank, world_size, device)


def shutdown_distributed(parallel: Any = None) -> None:
    """Wait for every rank, release ``parallel``'s DDP wrapper, then leave the process group (a
    deadlock-free order: docs/design.md#leaving-the-process-group)."""
    if not dist.is_initialized():
        return
    if parallel is not None:
        parallel.release()
        gc.collect()
    dist.barrier()
    time.sleep(0.05)  # releases the GIL: the gloo workers drop the barrier's work before the group goes
    dist.destroy_process_group()


def broadcast_weights(model: Any, dist_info: DistInfo) -> None:
    """Rank 0's parameters and buffers copied into every rank's ``model`` in place (nothing to do
    without torchrun); every rank calls it, with models of the same structure."""
    if dist_info.world_size <= 1:
        return
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def broadcast_from_main(obj: Any, dist_info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; returned unchanged without torchrun)."""
    if dist_info.world_size <= 1:
        return obj
    shared = [obj]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
