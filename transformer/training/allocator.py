"""Keep freed CPU tensor memory in the process instead of returning it to the OS (glibc only).

PyTorch's CPU allocator gets its memory from ``malloc``. glibc serves every block above
``M_MMAP_THRESHOLD`` (128 KiB by default, adapting up to 32 MiB) with a fresh ``mmap`` and gives it
back with ``munmap`` when the tensor dies, so every training step faults in its activations and
gradients page by page again (the kernel zero-fills each page). Raising the mmap threshold and the
trim threshold keeps freed blocks in the heap for the next step — what tcmalloc/jemalloc
(recommended by the PyTorch CPU performance guide) do by default. Measured with 2 threads: a
``transformer_tiny`` training step 650 -> 588 ms, ``llama_style_tiny`` 1175 -> 1093 ms. The cost
is that the process's RSS stays at its peak instead of shrinking between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
    return _tuned


__all__ = ["tune_cpu_allocator"]
