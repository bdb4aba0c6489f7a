"""Interleaved A/B of ``train.compile=true`` against eager on the README default run, each run a
fresh ``scripts/train.py`` process under ``/usr/bin/time``.

    flock /tmp/cpu.lock python -m benchmarks.compile_ab --rounds 3 --updates 150 \\
        --out docs/benchmarks/compile_ab

Every process trains the default model on Multi30k for ``--updates`` updates with the default
configuration (precision, ``train.pad_to_multiple``, threads as the checkout resolves them), no
validation and no test (the harness of :mod:`benchmarks.ab`), and logs update 1
and the last update only (``train.log_every`` past the end), so that ``metrics.jsonl`` times the
first update alone and the others as one window. The order of the variants alternates round by
round (a shared machine's speed drifts). Per run: target tokens/s over the whole training time
(``results.json``, compiling included), tokens/s of updates 2 to N (the last ``metrics.jsonl``
record: compiled code running, recompilations included), the first update's seconds (its target
tokens over its tokens/s; compiled: mostly compiling), the peak resident memory (``/usr/bin/time
-f %M``) and the recompilations dynamo logged (``TORCH_LOGS=recompiles``; each compiled function's
first graph is not one). Run it alone (``flock /tmp/cpu.lock``): timing beside other work
measures the other work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import ab, write_report
from transformer.analysis.markdown import cell, table

VARIANTS = ("train.compile=false", "train.compile=true")
KEYS = ("tok_s", "tok_s_after_first", "first_update_s", "recompiles", "rss_mb")


def run_once(variant: str, updates: int, data_root: str, workdir: Path) -> dict:
    """:func:`~benchmarks.ab.train_process`'s measurements, tok/s after the first (compiling) update,
    the first update's seconds and the recompilations."""
    run_dir, stderr, row = ab.train_process(
        variant,
        updates,
        data_root,
        workdir,
        extra=(f"train.log_every={updates + 1}",),  # update 1 and the last update only
        env={"TORCH_LOGS": "recompiles"},  # dynamo logs each recompilation with its reason
    )
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if r.get("split") == "train"]
    first, last = train[0], train[-1]
    return {
        **row,
        "tok_s_after_first": last["tokens_per_s"] if last["update"] > 1 else None,
        "first_update_s": first["ntokens"] / first["tokens_per_s"],
        "recompiles": stderr.count("Recompiling function"),
    }


def markdown(rows: list[dict], variants: list[str]) -> str:
    """Per variant the medians, and the ratios to the first variant."""
    med = {
        v: {k: statistics.median(r[k] for r in rows if r["variant"] == v and r[k] is not None) for k in KEYS}
        for v in variants
    }
    base = med[variants[0]]["tok_s_after_first"]
    lines = table(
        [
            "variant",
            "tok/s (all)",
            "tok/s (updates 2..N)",
            "ratio (2..N)",
            "first update s",
            "recompilations",
            "max RSS MB",
            "precision",
        ],
        "lrrrrrrl",
        (
            [
                f"`{v}`",
                cell(med[v]["tok_s"], "{:,.0f}"),
                cell(med[v]["tok_s_after_first"], "{:,.0f}"),
                cell(med[v]["tok_s_after_first"] / base, "{:.3f}"),
                cell(med[v]["first_update_s"], "{:.1f}"),
                cell(med[v]["recompiles"], "{:g}"),
                cell(med[v]["rss_mb"], "{:,.0f}"),
                cell(next(r for r in rows if r["variant"] == v)["precision"]),
            ]
            for v in variants
        ),
    )
    rounds = sorted({r["round"] for r in rows})
    notes = f"{len(rounds)} rounds (medians), {rows[0]['updates']} updates, CPU {rows[0]['cpu']}."
    return "\n".join(lines) + "\n\n" + notes + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--rounds", type=int, default=3)
    ab.add_arguments(p, "compile_ab")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        rows = ab.interleaved_rounds(
            args.variants, args.rounds, lambda v: run_once(v, args.updates, args.data_root, Path(work))
        )
    write_report(args.out, "compile_ab", rows, markdown(rows, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
