"""The training process's resident memory after every update, and how much of it glibc's heap only
keeps: with ``--trim``, ``malloc_trim(0)`` after each update hands the heap's free pages back, and the
RSS after it is the memory the process still holds.

    python -m benchmarks.heap_per_update --out /tmp/heap/keep.jsonl -- train.max_updates=150
    python -m benchmarks.heap_per_update --trim --out /tmp/heap/trim.jsonl -- train.max_updates=150

Everything after ``--`` goes to ``scripts/train.py`` (the README's default command, with no validation
and no test: ``FIXED``). The training runs in this process, its ``Trainer.train_step`` wrapped to read
``/proc/self/statm`` after each update: one JSON line per update, ``{"update", "rss_mb",
"held_mb"}`` (``held_mb``: after the trim; the same as ``rss_mb`` without ``--trim``). A trim costs
page faults on the next update, so time the two modes apart and alone (``flock /tmp/cpu.lock``).
Linux with glibc only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import runpy
import sys
from pathlib import Path

from benchmarks import REPO, rss_mb
from benchmarks.ab import FIXED  # training only: no validation, no test split beside the data's own


def record_updates(out: Path, trim: bool) -> None:
    """Wrap :meth:`~transformer.training.loop.trainer.Trainer.train_step` to write one line per update
    to ``out`` (and call glibc's ``malloc_trim(0)`` after each update when ``trim``)."""
    from transformer.training.loop.trainer import Trainer

    malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim if trim else None
    step = Trainer.train_step
    out.parent.mkdir(parents=True, exist_ok=True)
    f = out.open("w", encoding="utf-8")
    count = [0]

    def recorded(self, batches, ntokens=None):
        stats = step(self, batches, ntokens)
        count[0] += 1
        before = rss_mb()
        if malloc_trim is not None:
            malloc_trim(0)
        row = {"update": count[0], "rss_mb": round(before, 1), "held_mb": round(rss_mb(), 1)}
        f.write(json.dumps(row) + "\n")
        f.flush()
        return stats

    Trainer.train_step = recorded


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per update")
    p.add_argument("--trim", action="store_true", help="malloc_trim(0) after each update")
    args = p.parse_args(own)
    record_updates(args.out, args.trim)
    sys.argv = [str(REPO / "scripts" / "train.py"), *FIXED, *train_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
