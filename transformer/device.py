"""Which device a run, a translation or an evaluation uses: :func:`resolve_device` is the one place
that decides. ``auto`` (or None) is the GPU when torch sees one, else the CPU; ``cuda`` is this
process's GPU with its index (``LOCAL_RANK``, else 0), since ``torch.device("cuda")`` compares
unequal to ``cuda:0``; anything else as given. Tensors are made on their inputs' device, never a
default (``tests/test_device.py``)."""

from __future__ import annotations

import os

import torch

__all__ = ["resolve_device", "unavailable"]


def resolve_device(name: str | torch.device | None = "auto", local_rank: int | None = None) -> torch.device:
    """The :class:`torch.device` that ``name`` means here, with an index for CUDA; ``local_rank``
    defaults to ``LOCAL_RANK`` (else 0).

    Raises:
        RuntimeError: ``name`` is not a device torch knows.
    """
    if name is None or name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else int(local_rank)
        device = torch.device("cuda", rank)
    return device


def unavailable(device: torch.device, field: str) -> str | None:
    """Why ``device`` cannot be used here (a CUDA device torch does not see), naming ``field``; None when
    it can."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return (
            f"{field}={device.type}: torch sees no CUDA device on this machine (torch.cuda.is_available() is "
            f"False, torch {torch.__version__}); use {field}=cpu, or {field}=auto to take a GPU when there is one"
        )
    return None
