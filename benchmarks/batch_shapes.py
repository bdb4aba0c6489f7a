"""A/B of the default run's batching: ``train.pad_to_multiple`` (and ``train.onednn_cache_capacity``),
interleaved rounds, each a fresh ``scripts/train.py`` process under ``/usr/bin/time``.

    python -m benchmarks.batch_shapes --data-root ../shared/data --rounds 3 --out docs/results/default_run/batch_shapes
    python -m benchmarks.batch_shapes --variants "train.pad_to_multiple=1" "train.pad_to_multiple=8" \
        "train.pad_to_multiple=8 train.onednn_cache_capacity=null"

Every process trains the default model on Multi30k for ``--updates`` updates, with no validation
and no test, in interleaved rounds (:mod:`benchmarks.ab`). Per run: target tokens/s
(``results.json``), the peak resident memory (``/usr/bin/time -f %M``), the number of distinct batch
shapes the run reported at start, and the precision it resolved. Run it alone (``flock
/tmp/cpu.lock``): timing beside other work measures the other work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO, ab, write_report
from transformer.analysis.markdown import cell, table


def markdown(rows: list[dict], variants: list[str]) -> str:
    """The table: per variant the median tok/s and RSS, the rounds, and the ratio to the first."""
    base = statistics.median(r["tok_s"] for r in rows if r["variant"] == variants[0])
    cells = []
    for v in variants:
        mine = [r for r in rows if r["variant"] == v]
        med = statistics.median(r["tok_s"] for r in mine)
        cells.append(
            [
                f"`{v}`",
                cell(mine[0]["shapes"]),
                cell(med, "{:,.0f}"),
                " / ".join(format(r["tok_s"], ",.0f") for r in mine),
                cell(med / base, "{:.3f}"),
                cell(statistics.median(r["rss_mb"] for r in mine), "{:,.0f}"),
                cell(mine[0]["precision"]),
            ]
        )
    header = [
        "variant",
        "batch shapes",
        "tok/s (median)",
        "rounds",
        "ratio to first",
        "max RSS MB (median)",
        "precision",
    ]
    return "\n".join(table(header, "lrrlrrl", cells)) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["train.pad_to_multiple=1", "train.pad_to_multiple=8"])
    p.add_argument("--rounds", type=int, default=3)
    ab.add_arguments(p, "batch_shapes")
    p.add_argument("--root", type=Path, default=REPO, help="the checkout to run (default: this one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        rows = ab.interleaved_rounds(
            args.variants,
            args.rounds,
            lambda v: ab.train_process(v, args.updates, args.data_root, Path(work), root=args.root.resolve())[2],
        )
    write_report(args.out, "batch_shapes", rows, markdown(rows, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
