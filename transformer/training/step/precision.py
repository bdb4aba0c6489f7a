"""Which floating-point precision a run uses, and what machine it ran on.

``train.precision=auto`` (the default) resolves at run time to ``bf16`` where the device multiplies
bf16 matrices in hardware (CUDA devices with bf16 support; x86 CPUs with AMX tiles or AVX512-BF16)
and to ``fp32`` everywhere else: on a CPU without those instructions a bf16 matmul is emulated,
far slower than fp32 (measured in ``docs/benchmarks/cpu_choices.md``).

:func:`describe_hardware` reads the machine's name from the operating system (``/proc/cpuinfo``
"model name", or the CUDA device name) so that results never carry hand-written hardware.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from transformer.device import cuda_has_fast_bf16

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def cpu_has_fast_bf16() -> bool:
    """True when this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16).

    Uses torch's own CPU feature probes (cpuinfo), the same checks oneDNN uses to pick its bf16
    kernels.
    """
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str, device: torch.device) -> str:
    """Turn ``train.precision`` into the precision that runs on ``device``.

    Args:
        precision: ``auto`` | ``fp32`` | ``bf16`` | ``fp16``.
        device: the training device.

    Returns:
        ``fp32``, ``bf16`` or ``fp16``. ``auto`` gives ``bf16`` on CUDA devices with native bf16
        and on CPUs with AMX or AVX512-BF16, else ``fp32``.

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
    """The machine as the operating system and torch name it (for ``results.json``).

    Returns:
        ``cpu`` (model name), ``cpu_count`` (cores this process may use), ``cpu_capability``
        (torch's vector ISA, e.g. ``AVX2``, ``AVX512``), ``cpu_fast_bf16``, ``torch_threads``,
        ``torch`` (version) and, on CUDA, ``gpu`` (device name).
    """
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
