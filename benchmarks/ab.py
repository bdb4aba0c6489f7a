"""The A/B harness of the default run: fresh ``scripts/train.py`` processes under ``/usr/bin/time``,
run in interleaved rounds; a library, no command line (``batch_shapes.py``, ``compile_ab.py`` and
``ab_checkouts.py`` are its benchmarks).

Every process trains the default model on Multi30k for a number of updates with no validation and
no test (:data:`FIXED`: ``train.valid_bleu=false 'data.test_splits=[]'``), the measuring command of
the default run; the order of the variants alternates round by round, since a shared machine's speed
drifts. Run an A/B alone (``flock /tmp/cpu.lock``): timing beside other work measures the other work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks import REPO

FIXED = [
    "train.max_time=0",
    "train.validate_every=100000",
    "train.valid_bleu=false",
    "data.test_splits=[]",
    "train.progress=false",
]
"""The overrides of every A/B process: training only, no validation, no test split beside the data's own."""


def train_process(
    variant: str,
    updates: int,
    data_root: str,
    workdir: Path,
    root: Path = REPO,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[Path, str, dict]:
    """One ``scripts/train.py`` process of ``variant`` (space-separated overrides, after ``extra``) with
    the checkout ``root`` (its ``scripts/train.py`` and its ``transformer`` package, ahead of any
    installed one) under ``/usr/bin/time``: its run folder, its stderr and the measurements every A/B
    reports (tok/s, max RSS, precision, CPU, the number of distinct batch shapes the run logged).

    Raises:
        RuntimeError: the process failed (its exit status and the end of its stderr).
    """
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    cmd = [
        "/usr/bin/time",
        "-f",
        "maxrss_kb=%M",
        sys.executable,
        str(root / "scripts" / "train.py"),
        f"train.max_updates={updates}",
        *FIXED,
        *extra,
        *variant.split(),
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "TRANSFORMER_DATA_DIR": data_root, "PYTHONPATH": str(root), **(env or {})}
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: exit {out.returncode}: {out.stderr[-2000:]}")
    results = json.loads((run_dir / "results.json").read_text())
    shapes = re.search(r"batches: (\d+) distinct", out.stderr)
    return (
        run_dir,
        out.stderr,
        {
            "variant": variant,
            "tok_s": results["train_tokens_per_s"],
            "updates": results["updates"],
            "rss_mb": int(re.search(r"maxrss_kb=(\d+)", out.stderr).group(1)) / 1024,
            "peak_memory_mb": results.get("peak_memory_mb"),
            "precision": results.get("precision"),
            "cpu": (results.get("hardware") or {}).get("cpu_capability"),
            "shapes": int(shapes.group(1)) if shapes else None,
        },
    )


def interleaved_rounds(variants: list[str], rounds: int, run: Callable[[str], dict], key: str = "round") -> list[dict]:
    """``run(variant)`` for every variant, ``rounds`` times, each round in the opposite order to the
    one before (a shared machine's speed drifts); each row gets its round under ``key`` and is
    printed as it comes."""
    rows = []
    for r in range(rounds):
        for v in variants if r % 2 == 0 else list(reversed(variants)):
            rows.append({**run(v), key: r})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """The options every A/B takes: ``--updates``, ``--data-root`` and ``--out`` (the folder for
    ``<name>.json`` / ``.md``)."""
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--data-root", default=os.environ.get("TRANSFORMER_DATA_DIR", "../shared/data"))
    p.add_argument("--out", type=Path, default=None, help=f"folder for {name}.json / .md")
