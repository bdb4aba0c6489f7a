"""Which number format runs where: ``train.precision`` resolved for a device, the autocast of
training and of decoding, whether the hardware multiplies bf16 natively, and the machine a result
ran on. ``auto`` is bf16 where the device multiplies bf16 in hardware and fp32 elsewhere (an
emulated bf16 matmul is far slower: docs/benchmarks/cpu_choices.md)."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "AUTOCAST_DTYPES",
    "FP32_DEVICES",
    "PRECISIONS",
    "autocast",
    "cpu_has_fast_bf16",
    "cpu_model_name",
    "cuda_has_fast_bf16",
    "decoding_autocast",
    "decoding_precision",
    "describe_hardware",
    "resolve_precision",
]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``train.precision``'s values (decoding takes the same)."""
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""A resolved precision -> its autocast dtype (None: fp32, no autocast)."""
FP32_DEVICES = ("cpu",)
"""Device types that decode in fp32 whatever the run's precision: the CPU, whose decoding speed is
measured in fp32 (``docs/benchmarks/decode_speed.md``) and whose fp32 hypotheses the tests hold; a
CPU with fast bf16 trains in bf16 under ``train.precision=auto`` and still decodes in fp32."""


def cuda_has_fast_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA device with native bf16 (compute capability 8.0+)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16), by torch's cpuinfo probes."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` on ``device``: ``fp32``, ``bf16`` or ``fp16``; ``auto`` is bf16 on CUDA
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


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` on ``device`` in a resolved ``precision`` (fp32: a null context)."""
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def decoding_precision(precision: str, device: torch.device | str) -> str:
    """``fp32``, ``bf16`` or ``fp16``: what decoding runs in on ``device`` for ``train.precision=precision``.

    fp32 on :data:`FP32_DEVICES`; elsewhere the run's own, ``auto`` resolved as in training (bf16 on
    CUDA with compute capability 8.0 or more, else fp32). See docs/decoding.md#precision-and-the-kv-cache.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    device = torch.device(device)
    if device.type in FP32_DEVICES:
        return "fp32"
    if precision == "auto":
        return "bf16" if cuda_has_fast_bf16(device) else "fp32"
    return precision


def decoding_autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """:func:`autocast` in :func:`decoding_precision`.

    Raises:
        ValueError: an unknown precision.
    """
    return autocast(decoding_precision(precision, device), device)


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
