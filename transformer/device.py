"""Which device a run, a translation or an evaluation uses: :func:`resolve_device` is the one place
that decides (``train.device``, ``translate.py``'s and ``evaluate.py``'s ``device``, the device a
finished run is compared on, the one a loaded model goes to).

* ``auto`` (or None): the GPU when torch sees one (``torch.cuda.is_available()``), else the CPU;
* ``cuda``: the GPU of this process, with its index: ``LOCAL_RANK`` under torchrun (each rank
  its own GPU), else 0. A device without an index (``torch.device("cuda")``) compares unequal to
  every tensor's device (``cuda:0``), so the index is always filled in;
* anything else (``cpu``, ``cuda:1``, ``mps``) as given.

The tensors a forward pass or a decoding step makes are put on the device of their inputs
(``device=x.device``, ``x.new_*``, ``torch.*_like``), never on a default: ``tests/test_device.py``
holds every tensor factory call of the package to that rule, and ``tests/test_fake_cuda.py`` runs the
GPU path on fake ``cuda:0`` tensors.
"""

from __future__ import annotations

import os

import torch

__all__ = ["cuda_has_fast_bf16", "resolve_device", "unavailable"]


def cuda_has_fast_bf16(device: torch.device | str) -> bool:
    """True when ``device`` is a CUDA device that supports bf16 natively (compute capability 8.0+:
    Ampere, Hopper); False for any other device or without a GPU. Training's ``train.precision=auto``
    and decoding's precision both ask here."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def resolve_device(name: str | torch.device | None = "auto", local_rank: int | None = None) -> torch.device:
    """The device that ``name`` means here (see the module docstring).

    Args:
        name: ``auto``, None, ``cpu``, ``cuda``, ``cuda:N`` or any ``torch.device`` string / device.
        local_rank: the process's GPU for a bare ``cuda``; default: ``LOCAL_RANK`` from the
            environment (torchrun, submitit), else 0.

    Returns:
        A :class:`torch.device`, with an index when it is a CUDA device.

    Raises:
        RuntimeError: ``name`` is not a device torch knows (torch's message).
    """
    if name is None or name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else int(local_rank)
        device = torch.device("cuda", rank)
    return device


def unavailable(device: torch.device, field: str) -> str | None:
    """Why ``device`` cannot be used on this machine, None when it can: a CUDA device while torch
    sees none. The callers raise it as their own one-line error before any work.

    Args:
        device: a device from :func:`resolve_device`.
        field: the setting that chose it (``train.device``, ``device``), named in the sentence.
    """
    if device.type == "cuda" and not torch.cuda.is_available():
        return (
            f"{field}={device.type}: torch sees no CUDA device on this machine (torch.cuda.is_available() is "
            f"False, torch {torch.__version__}); use {field}=cpu, or {field}=auto to take a GPU when there is one"
        )
    return None
