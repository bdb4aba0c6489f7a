"""glibc allocator tuning: freed tensor memory stays in the process (no munmap + page faults)."""

import os
import sys

import pytest
import torch

from transformer.training.job.allocator import ONEDNN_CACHE_ENV, limit_onednn_cache, tune_cpu_allocator


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


def test_onednn_cache_capacity_is_set_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    assert limit_onednn_cache(None) is None and ONEDNN_CACHE_ENV not in os.environ  # oneDNN's default
    assert limit_onednn_cache(64) == "64" and os.environ[ONEDNN_CACHE_ENV] == "64"
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "7")  # the user's setting wins
    assert limit_onednn_cache(0) == "7" and os.environ[ONEDNN_CACHE_ENV] == "7"
    with pytest.raises(ValueError, match="train.onednn_cache_capacity"):
        limit_onednn_cache(-1)


def test_negative_onednn_cache_capacity_fails_validation_naming_the_field():
    from transformer.config import Config
    from transformer.config.checks import ConfigError, validate_config

    cfg = Config()
    cfg.train.onednn_cache_capacity = -2
    with pytest.raises(ConfigError, match=r"train.onednn_cache_capacity=-2 must be >= 0"):
        validate_config(cfg)
