"""glibc allocator tuning: freed tensor memory stays in the process (no munmap + page faults)."""

import os
import sys

import pytest
import torch

from transformer.training.allocator import tune_cpu_allocator


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc-only")
def test_freed_large_tensor_stays_mapped_after_tuning():
    assert tune_cpu_allocator() is True
    assert tune_cpu_allocator() is True  # idempotent
    x = torch.ones(64, 1024, 1024 // 4)  # 64 MiB, touched
    held = _rss_mb()
    assert float(x[0].sum()) == 1024 * 1024 // 4
    del x
    # untuned glibc would munmap the block and RSS would fall by ~64 MiB
    assert _rss_mb() > held - 16
    y = torch.ones(64, 1024, 1024 // 4)  # reuses the freed block
    assert float(y[-1].sum()) == 1024 * 1024 // 4
