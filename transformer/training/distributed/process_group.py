"""Data parallelism under torchrun: this process's rank and device, and the process group.

A run launched by ``torchrun --nproc_per_node=N scripts/train.py`` has ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK`` in its environment; :func:`setup_distributed` joins the process group (NCCL on CUDA,
gloo on CPU). A SLURM job started by ``hydra/launcher=submitit_slurm`` (one task per GPU, no torchrun)
takes the same variables from submitit's job environment (:func:`export_submitit_environment`). How gradients are shared (DistributedDataParallel or FSDP2, summed and divided by
the global number of target tokens, so N ranks compute the same update as one rank with
``update_freq=N``) is :mod:`transformer.training.distributed.parallel`.
"""

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
    """In a task started by submitit (``SUBMITIT_EXECUTOR`` set, e.g. by ``hydra/launcher=submitit_slurm``
    or ``submitit_local``) and not by torchrun (no ``WORLD_SIZE``): export torchrun's variables
    (``MASTER_ADDR`` = the job's first host, ``MASTER_PORT`` from the job id unless set, ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) from submitit's job environment
    (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``, ...), via
    ``submitit.helpers.TorchDistributedEnvironment``. ``CUDA_VISIBLE_DEVICES`` is left alone: each
    task takes the GPU ``LOCAL_RANK``.

    Returns:
        Whether the variables were exported.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ or "WORLD_SIZE" in os.environ:
        return False
    from submitit.helpers import TorchDistributedEnvironment  # the optional [slurm] extra

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


def setup_distributed(device_name: str, timeout_s: float = 1800.0) -> DistInfo:
    """Initialise ``torch.distributed`` when launched by torchrun or submitit (``WORLD_SIZE > 1``).

    Uses NCCL on CUDA and gloo on CPU. The device is :func:`~transformer.device.resolve_device`'s
    (``auto``: CUDA when present; ``cuda``: the GPU ``LOCAL_RANK``), made this process's current
    CUDA device. Under submitit, torchrun's variables are first exported from the job environment
    (:func:`export_submitit_environment`).

    Args:
        device_name: ``train.device``: ``auto``, ``cpu``, ``cuda`` or any ``torch.device`` string.
        timeout_s: how long a collective waits for the other ranks before it fails
            (``train.dist_timeout``; NCCL's own default is 10 minutes, too short for a rank that
            tests or saves a big model while the others wait).

    Returns:
        This process's :class:`DistInfo` (rank 0 of 1 without torchrun).

    Raises:
        ConfigError: a CUDA device on a machine where torch sees none.
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
    """Wait for every rank, then leave the process group (nothing to do without one).

    Args:
        parallel: the run's :class:`~transformer.training.distributed.parallel.DataParallel`; its
            DistributedDataParallel wrapper is released first.

    The order avoids a deadlock seen under load with gloo (a rank hung at exit after its run had
    finished): a gloo worker thread drops the barrier's work, and with it the references to
    tensors that have Python objects, which needs the GIL; if the last reference to the process
    group is then dropped by the DDP ``Reducer``'s destructor, that destructor joins the worker
    threads while holding the GIL. So the ``Reducer`` goes first (the group is still held by
    ``torch.distributed``, nothing is joined), the GIL is free for a moment after the barrier (the
    workers finish their clean-up), and ``destroy_process_group`` destroys the group last.
    """
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
