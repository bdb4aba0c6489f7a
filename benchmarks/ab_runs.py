"""Interleaved A/B of the README default run: variants (override sets) of one checkout, or two
checkouts of this repository (e.g. main before and after a change), each run a fresh
``scripts/train.py`` process under ``/usr/bin/time``.

    python -m benchmarks.ab_runs --variants "train.compile=false" "train.compile=true" --rounds 3 --updates 150
    git worktree add /tmp/before <commit>; git worktree add /tmp/after HEAD
    flock /tmp/cpu.lock python -m benchmarks.ab_runs --checkouts /tmp/before /tmp/after --rounds 3 --updates 150 \\
        --out docs/benchmarks/ab_default_run

The runs are every (checkout, variant) of ``--checkouts`` (default: this checkout) and ``--variants``
(default: the checkout's own configuration). Every process trains the default model on Multi30k for
``--updates`` updates with no validation on the way (the harness of :mod:`benchmarks.ab`); round
``r`` starts at run ``r``, since a shared machine's speed drifts. The table gives per run the
medians over the rounds of its target tokens/s (compiling included), tokens/s after the first
update, the first update's seconds, the recompilations and the peak resident memory, its batch
shapes and precision, and the ratios to the first run: the median of the rounds' ratios (each round
measures every run under the same conditions). Run it alone (``flock /tmp/cpu.lock``): timing
beside other work measures the other work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO, ab, interleaved_rounds, write_report
from transformer.analysis.markdown import cell, table


def markdown(rows: list[dict], names: list[str]) -> str:
    """One line per run: its medians and its ratios to the first run."""
    first = {r["round"]: r for r in rows if r["name"] == names[0]}

    def median(mine: list[dict], key: str, ratio: bool = False) -> float | None:
        values = [r[key] for r in mine if r[key] is not None]
        if ratio:
            values = [r[key] / first[r["round"]][key] for r in mine if r[key] is not None and first[r["round"]][key]]
        return statistics.median(values) if values else None

    cells = []
    for name in names:
        mine = [r for r in rows if r["name"] == name]
        cells.append(
            [
                f"`{name}`",
                cell(median(mine, "tok_s"), "{:,.0f}"),
                " / ".join(format(r["tok_s"], ",.0f") for r in mine),
                cell(median(mine, "tok_s", ratio=True), "{:.3f}"),
                cell(median(mine, "tok_s_after_first"), "{:,.0f}"),
                cell(median(mine, "tok_s_after_first", ratio=True), "{:.3f}"),
                cell(median(mine, "first_update_s"), "{:.1f}"),
                cell(median(mine, "recompiles"), "{:g}"),
                cell(median(mine, "rss_mb"), "{:,.0f}"),
                cell(mine[0]["shapes"]),
                cell(mine[0]["precision"]),
            ]
        )
    header = ["run", "tok/s", "rounds", "ratio", "tok/s after update 1", "ratio after update 1"]
    header += ["first update s", "recompilations", "max RSS MB", "batch shapes", "precision"]
    rounds = len({r["round"] for r in rows})
    notes = f"Medians of {rounds} interleaved rounds of {rows[0]['updates']} updates; CPU {rows[0]['cpu']}."
    return "\n".join(table(header, "lrlrrrrrrrl", cells)) + "\n\n" + notes + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=[""], metavar="OVERRIDES", help="space-separated overrides")
    p.add_argument("--checkouts", nargs="+", type=Path, default=[REPO], metavar="DIR", help="default: this one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--data-root", default=os.environ.get("TRANSFORMER_DATA_DIR", "../shared/data"))
    p.add_argument("--out", type=Path, default=None, help="folder for ab_runs.json / .md")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.updates < 1:
        p.error(f"--rounds and --updates must be at least 1, got {args.rounds} and {args.updates}")
    args.variants = [" ".join(v.split()) for v in args.variants]  # one variant, however it is spaced
    for root in args.checkouts:
        if not (root / "scripts" / "train.py").is_file():
            p.error(f"{root} is not a checkout of this repository (no scripts/train.py)")
    runs = {}
    for root in args.checkouts:
        for v in args.variants:
            name = " ".join([str(root)] * (len(args.checkouts) > 1) + [v] * (v != "")) or "(default)"
            runs[name] = (root.resolve(), v)
    if len(runs) < len(args.checkouts) * len(args.variants):
        p.error("two runs are the same checkout and variant")

    def run(name: str) -> dict:
        row = {"name": name, **ab.train_process(runs[name][1], args.updates, args.data_root, Path(work), runs[name][0])}
        print(json.dumps(row), flush=True)
        return row

    with tempfile.TemporaryDirectory() as work:
        try:
            rows = interleaved_rounds(list(runs), args.rounds, run)
        except RuntimeError as err:  # a run failed: its variant and the error line it printed
            print(f"ab_runs: {err}", file=sys.stderr)
            return 1
    write_report(args.out, "ab_runs", rows, markdown(rows, list(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
