"""Which floating-point precision a run uses, and what machine it ran on, as the operating system
and torch name it. ``train.precision=auto`` is bf16 where the device multiplies bf16 in hardware,
fp32 elsewhere (an emulated bf16 matmul is far slower; docs/benchmarks/cpu_choices.md)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from transformer.device import cuda_has_fast_bf16

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16), by torch's cpuinfo probes."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``fp32``, ``bf16`` or ``fp16`` on ``device`` for ``train.precision``; ``auto`` is bf16 on CUDA
    with native bf16 and on CPUs with AMX or AVX512-BF16, else fp32.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if cuda_has_fast_bf16(device) else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp32"


def cpu_model_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else :func:`platform.processor` / machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_hardware(device: torch.device | None = None) -> dict[str, Any]:
    """The machine for ``results.json``: ``cpu``, ``cpu_count``, ``cpu_capability`` (``AVX2``, ...),
    ``cpu_fast_bf16``, ``torch_threads``, ``torch`` and, on CUDA, ``gpu``."""
    info: dict[str, Any] = {
        "cpu": cpu_model_name(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_fast_bf16": cpu_has_fast_bf16(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


__all__ = [
    "PRECISIONS",
    "cpu_has_fast_bf16",
    "cpu_model_name",
    "describe_hardware",
    "resolve_precision",
]
