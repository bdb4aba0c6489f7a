"""``benchmarks/heap_per_update.py``: a real (tiny) training run, one line per update with the RSS
before and after ``malloc_trim(0)``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, SHARED_DATA, multi30k_excerpt, parallel_text_args

pytestmark = pytest.mark.skipif(
    not (SHARED_DATA / "multi30k" / "train.en.gz").is_file() or not sys.platform.startswith("linux"),
    reason="needs the Multi30k excerpt and glibc",
)


def test_every_update_is_recorded_and_a_trim_never_adds_memory(tmp_path):
    corpus = multi30k_excerpt(tmp_path / "corpus", {"train": 200, "val": 10, "test_2016_flickr": 10})
    tiny = [
        *parallel_text_args(corpus, 300),
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "train.max_tokens=600",
        "train.max_updates=3",
        "train.precision=fp32",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    out = tmp_path / "trim.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.heap_per_update",
        "--trim",
        "--out",
        str(out),
        "--",
        *tiny,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert all(0 < r["held_mb"] <= r["rss_mb"] + 1 for r in rows), rows  # +1: pages touched by the read itself
    assert (tmp_path / "run" / "results.json").is_file()  # the training ran to its end
