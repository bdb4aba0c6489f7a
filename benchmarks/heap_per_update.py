"""The training process's resident memory after every update, and how much of it glibc's heap only
keeps: with ``--trim``, ``malloc_trim(0)`` after each update hands the heap's free pages back, and the
RSS after it is the memory the process still holds.

    python -m benchmarks.heap_per_update --out /tmp/heap/keep.jsonl -- train.max_updates=150
    python -m benchmarks.heap_per_update --trim --out /tmp/heap/trim.jsonl -- train.max_updates=150

Everything after ``--`` goes to ``scripts/train.py`` (the README's default command, with no validation
on the way: ``FIXED``; the end's validation loss and one test split follow the last update), run in this process with ``logger=heap_per_update train.log_every=1``: the
logger (:func:`transformer.registry.register_logger`) reads ``/proc/self/statm`` at each update's
train row and writes one JSON line, ``{"update", "rss_mb", "held_mb"}`` (``held_mb``: after the trim;
the same as ``rss_mb`` without ``--trim``). A trim costs page faults on the next update, so time the
two modes apart and alone (``flock /tmp/cpu.lock``). Linux with glibc only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks import REPO, rss_mb
from benchmarks.ab import FIXED  # no validation before the end, one test split
from transformer.registry import register_logger
from transformer.training.monitoring.loggers import MetricsLogger


class HeapLog(MetricsLogger):
    """One JSON line per train row to ``out``; ``malloc_trim(0)`` before the second reading when ``trim``."""

    def __init__(self, out: Path, trim: bool) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.file = out.open("w", encoding="utf-8")
        self.malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim if trim else None

    def log(self, metrics: Mapping[str, Any], step: int, split: str) -> None:
        """Record the RSS (MiB) after update ``step``, before and after the trim."""
        if split != "train":
            return
        before = rss_mb()
        if self.malloc_trim is not None:
            self.malloc_trim(0)
        self.file.write(json.dumps({"update": step, "rss_mb": round(before, 1), "held_mb": round(rss_mb(), 1)}) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per update")
    p.add_argument("--trim", action="store_true", help="malloc_trim(0) after each update")
    args = p.parse_args(own)
    if any(a.split("=", 1)[0].lstrip("+~") in ("logger", "train.log_every") for a in train_args):
        p.error("logger= and train.log_every= are this benchmark's own (logger=heap_per_update train.log_every=1)")
    register_logger("heap_per_update", lambda cfg, run_dir, run_name, config: HeapLog(args.out, args.trim))
    sys.argv = [str(REPO / "scripts" / "train.py"), *FIXED, "logger=heap_per_update", "train.log_every=1", *train_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
