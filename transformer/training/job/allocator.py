"""Keep freed CPU tensor memory in the process instead of returning it to the OS (glibc only).

PyTorch's CPU allocator gets its memory from ``malloc``. glibc serves every block above
``M_MMAP_THRESHOLD`` (128 KiB by default, adapting up to 32 MiB) with a fresh ``mmap`` and gives it
back with ``munmap`` when the tensor dies, so every training step faults in its activations and
gradients page by page again (the kernel zero-fills each page). Raising the mmap threshold and the
trim threshold keeps freed blocks in the heap for the next step — what tcmalloc/jemalloc
(recommended by the PyTorch CPU performance guide) do by default; a training step gets faster
(measured in ``docs/benchmarks/cpu_choices.md``). The cost is that the process's RSS stays at its
peak instead of shrinking between steps.

:func:`limit_onednn_cache` bounds oneDNN's primitive cache, which bf16 matmuls on the CPU go
through: oneDNN keeps up to 1024 primitives (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), one per
distinct shape, each with its own buffers, and translation batches have a new (rows, length) shape
almost every step, so the default cache grows the process's memory by gigabytes in a bf16 run
(measured in ``docs/benchmarks/cpu_choices.md``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_tuned = False


def tune_cpu_allocator(mmap_threshold: int = 1 << 30, trim_threshold: int = 2**31 - 1) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` via ``mallopt`` (once per process).

    Args:
        mmap_threshold: blocks at least this large (bytes) still get their own ``mmap``.
        trim_threshold: free memory at the top of the heap (bytes) kept before ``malloc`` trims it.

    Returns:
        True if the settings are in effect (now or from an earlier call), False where ``mallopt``
        is unavailable (macOS, Windows, musl) — nothing is changed then.
    """
    global _tuned
    if _tuned:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        mallopt(_M_TRIM_THRESHOLD, int(trim_threshold))
    )
    return _tuned


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def limit_onednn_cache(capacity: int | None) -> str | None:
    """Bound oneDNN's primitive cache to ``capacity`` entries for this process.

    oneDNN reads ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` when it creates its first primitive, so this
    must run before the process's first bf16 (oneDNN) matmul; it sets the variable unless the user
    has set it already (theirs wins). The cache only saves primitive creation: results are the same
    at any capacity.

    Args:
        capacity: entries to keep (0 = no cache); None leaves oneDNN's default (1024).

    Returns:
        The capacity in effect as a string (the user's or ours), or None when oneDNN's default applies.

    Raises:
        ValueError: ``capacity`` is negative.
    """
    if capacity is not None and capacity < 0:
        raise ValueError(f"train.onednn_cache_capacity must be >= 0 or null, got {capacity}")
    if ONEDNN_CACHE_ENV in os.environ:
        return os.environ[ONEDNN_CACHE_ENV]
    if capacity is None:
        return None
    os.environ[ONEDNN_CACHE_ENV] = str(int(capacity))
    return os.environ[ONEDNN_CACHE_ENV]


__all__ = ["ONEDNN_CACHE_ENV", "limit_onednn_cache", "tune_cpu_allocator"]
