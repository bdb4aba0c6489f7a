"""A/B of the default run's batching: ``train.pad_to_multiple`` (and ``train.onednn_cache_capacity``),
interleaved rounds, each a fresh ``scripts/train.py`` process under ``/usr/bin/time``.

    python -m benchmarks.batch_shapes --data-root ../shared/data --rounds 3 --out docs/results/default_run/batch_shapes
    python -m benchmarks.batch_shapes --variants "train.pad_to_multiple=1" "train.pad_to_multiple=8" \
        "train.pad_to_multiple=8 train.onednn_cache_capacity=null"

Every process trains the default model on Multi30k for ``--updates`` updates (no validation, no
test: ``train.valid_bleu=false 'data.test_splits=[]'``), the issue's measuring command; the order
of the variants alternates round by round (a shared machine's speed drifts). Per run: target
tokens/s (``results.json``), the peak resident memory (``/usr/bin/time -f %M``), the number of
distinct batch shapes the run reported at start, and the precision it resolved. Run it alone
(``flock /tmp/cpu.lock``): timing beside other work measures the other work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks import REPO, write_report
from transformer.analysis.markdown import cell, table

FIXED = [
    "train.max_time=0",
    "train.validate_every=100000",
    "train.valid_bleu=false",
    "data.test_splits=[]",
    "train.progress=false",
]


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
    reports (tok/s, max RSS, precision, CPU).

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
        },
    )


def run_once(variant: str, updates: int, data_root: str, workdir: Path, root: Path = REPO) -> dict:
    """:func:`train_process`'s measurements and the number of distinct batch shapes the run logged."""
    _, stderr, row = train_process(variant, updates, data_root, workdir, root)
    shapes = re.search(r"batches: (\d+) distinct", stderr)
    return {**row, "shapes": int(shapes.group(1)) if shapes else None}


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


def interleaved_rounds(variants: list[str], rounds: int, run: Callable[[str], dict]) -> list[dict]:
    """``run(variant)`` for every variant, ``rounds`` times, each round in the opposite order to the
    one before (a shared machine's speed drifts); each row gets its ``round`` and is printed as it
    comes."""
    rows = []
    for r in range(rounds):
        for v in variants if r % 2 == 0 else list(reversed(variants)):
            rows.append({**run(v), "round": r})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["train.pad_to_multiple=1", "train.pad_to_multiple=8"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--data-root", default=os.environ.get("TRANSFORMER_DATA_DIR", "../shared/data"))
    p.add_argument("--out", type=Path, default=None, help="folder for batch_shapes.json / .md")
    p.add_argument("--root", type=Path, default=REPO, help="the checkout to run (default: this one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        rows = interleaved_rounds(
            args.variants,
            args.rounds,
            lambda v: run_once(v, args.updates, args.data_root, Path(work), root=args.root.resolve()),
        )
    write_report(args.out, "batch_shapes", rows, markdown(rows, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
