"""Interleaved A/B of the README default command between two checkouts of this repository (e.g. main
before and after a change), each run a fresh ``scripts/train.py`` process under ``/usr/bin/time``.

    git worktree add /tmp/before <commit>; git worktree add /tmp/after HEAD
    flock /tmp/cpu.lock python -m benchmarks.ab_checkouts /tmp/before /tmp/after --pairs 3 --updates 150 \\
        --out docs/benchmarks/ab_default_run

Every process trains the default model on Multi30k for ``--updates`` updates with the default
configuration of its own checkout (whatever ``train.pad_to_multiple``, precision or cache capacity
that checkout defaults to), no validation and no test (the harness of :mod:`benchmarks.ab`); the
order within a pair alternates (A B, B A, ...), as a shared
machine's speed drifts. Per run: target tokens/s (``results.json``), the peak resident memory
(``/usr/bin/time -f %M``), the batch shapes and the precision. The table gives each pair's ratio
B / A and their median. Run it alone (``flock /tmp/cpu.lock``): timing beside other work measures
the other work.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks import ab, write_report
from transformer.analysis.markdown import cell, table


def _sides(a_tok_s: float, b_tok_s: float, ratio: float, a_rss: float, b_rss: float) -> list[str]:
    return [
        cell(a_tok_s, "{:,.0f}"),
        cell(b_tok_s, "{:,.0f}"),
        cell(ratio, "{:.3f}"),
        cell(a_rss, "{:,.0f}"),
        cell(b_rss, "{:,.0f}"),
    ]


def markdown(rows: list[dict], names: tuple[str, str]) -> str:
    """Per pair: A's and B's tok/s and max RSS, and B / A; then the medians."""
    cells, ratios = [], []
    for pair in sorted({r["pair"] for r in rows}):
        a, b = (next(r for r in rows if r["pair"] == pair and r["side"] == s) for s in ("A", "B"))
        ratios.append(b["tok_s"] / a["tok_s"])
        cells.append([str(pair + 1), *_sides(a["tok_s"], b["tok_s"], ratios[-1], a["rss_mb"], b["rss_mb"])])
    med = {s: statistics.median(r["tok_s"] for r in rows if r["side"] == s) for s in ("A", "B")}
    rss = {s: statistics.median(r["rss_mb"] for r in rows if r["side"] == s) for s in ("A", "B")}
    cells.append(["median", *_sides(med["A"], med["B"], statistics.median(ratios), rss["A"], rss["B"])])
    header = ["pair", "A tok/s", "B tok/s", "B / A", "A max RSS MB", "B max RSS MB"]
    lines = table(header, "rrrrrr", cells)
    first = {s: next(r for r in rows if r["side"] == s) for s in ("A", "B")}
    notes = [
        f"A = {names[0]} ({first['A']['precision']}, {first['A']['shapes']} batch shapes), "
        f"B = {names[1]} ({first['B']['precision']}, {first['B']['shapes']} batch shapes); CPU {first['A']['cpu']}."
    ]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="checkout A (e.g. before)")
    p.add_argument("b", type=Path, help="checkout B (e.g. after)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--extra", default="", help="overrides given to both sides (space-separated)")
    ab.add_arguments(p, "ab_checkouts")
    args = p.parse_args(argv)
    for side in (args.a, args.b):
        if not (side / "scripts" / "train.py").is_file():
            p.error(f"{side} is not a checkout of this repository (no scripts/train.py)")
    roots = {"A": args.a, "B": args.b}

    def run(side: str) -> dict:
        root = roots[side].resolve()
        _, _, row = ab.train_process(args.extra, args.updates, args.data_root, Path(work), root=root)
        return {**row, "side": side, "checkout": str(roots[side])}

    with tempfile.TemporaryDirectory() as work:
        rows = ab.interleaved_rounds(["A", "B"], args.pairs, run, key="pair")  # A B, B A, ...
    write_report(args.out, "ab_checkouts", rows, markdown(rows, (str(args.a), str(args.b))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
