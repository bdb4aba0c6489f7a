"""Compare the runs of one or more sweeps: markdown table, CSV, significance and PNG plots.

    python scripts/train.py -m experiment=ladder hydra/launcher=joblib hydra.launcher.n_jobs=2
    python scripts/compare.py runs/ladder                                  # -> runs/ladder/comparison/
    python scripts/compare.py docs/results/ladder/runs --out docs/results/ladder \
        --baseline step0_vaswani2017 --bootstrap 1000
    python scripts/compare.py runs/branches docs/results/ladder/runs/step5_gqa_seed1 \
        docs/results/ladder/runs/step5_gqa_seed2 --baseline step5_gqa --no-prev   # a branch study

One row per configuration (runs whose resolved config differs only in seed, study name, paths and logging):
BLEU and chrF mean ± std over seeds, parameters, FLOPs per token, KV-cache bytes per token,
train tokens/s, peak memory, the paired-bootstrap p-values (over test sentences and seeds) against
the baseline row and the row above (not with --no-prev, for branches off one baseline),
Holm-Bonferroni adjusted over the table, and the baseline's seed spread as the noise floor (a
difference within it is never starred); a configuration under --untrained-below mean BLEU (default
1) is marked untrained and left out of the adjustment.

BLEU by reference length: test BLEU and chrF per bucket of reference length in words (whitespace
tokens of the detokenized reference; --length-buckets, default 1-10,11-15,16-20,21-30,31+), mean
over seeds, with the sentence count and 95% bootstrap intervals, paired across configurations
(also of each one's difference to the baseline); on the runs' own test split, or on several test
splits pooled (--length-splits all, or names joined by commas). BLEU by source length: the same,
bucketed by the source's length in words (the sources read through the runs' data config).

The runs must differ only in the study's switches and the seed: runs trained with another
precision, budget, data or torch version stop the comparison with a sentence naming them, unless
--allow-mixed (then the table shows the differences). Runs without results.json (crashed,
unfinished) are listed, never dropped. Writes comparison.md, comparison.csv, runs.csv,
length_buckets.csv, source_length_buckets.csv, valid_curves.png, bleu_bars.png and
bleu_by_length.png; prints the markdown.
Without matplotlib (``pip install -e ".[plots]"``) the tables are written without the plots, with
one warning line.

The work is :func:`transformer.analysis.compare_and_write`; this file parses the arguments and
reports errors (:func:`transformer.cli.user_errors`): exit status 2 for missing folders, an unknown
baseline, runs trained differently, bad length buckets or unknown length splits, 1 when no run has
results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformer.analysis import DEFAULT_BUCKETS, UNTRAINED_BELOW, NoFinishedRun, compare_and_write
from transformer.cli import user_errors

ERRORS = {NoFinishedRun: 1, (FileNotFoundError, ValueError): 2}
"""The user errors this script reports on one line, and their exit statuses."""


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: arguments without the program name (``sys.argv[1:]`` when None).

    Returns:
        0 (the outputs were written).

    Raises:
        SystemExit: with one line ``error: ...`` on stderr, status 2 for missing folders, an
            unknown baseline, runs trained differently, length buckets that are not ascending ranges
            or length splits no run has, 1 when no run has results (the outputs listing the runs
            without results are still written).
    """
    args = build_parser().parse_args(argv)
    with user_errors(ERRORS):
        compare_and_write(
            args.sweep_dirs,
            args.out,
            baseline=args.baseline,
            n_bootstrap=args.bootstrap,
            bootstrap_seed=args.bootstrap_seed,
            allow_mixed=args.allow_mixed,
            compare_prev=not args.no_prev,
            length_buckets=args.length_buckets,
            length_splits=args.length_splits,
            untrained_below=args.untrained_below,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script (the README's command lines are parsed with it in a test)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="multirun folders (or run folders)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first sweep>/comparison)")
    parser.add_argument(
        "--baseline",
        default=None,
        help="baseline configuration label or unique substring (default: the first, in ladder order)",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="paired-bootstrap resamples; 0 to skip (default 1000)"
    )
    parser.add_argument("--bootstrap-seed", type=int, default=12345, help="resampling seed (default 12345)")
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare runs that differ in more than the switches and the seed (precision, budget, "
        "data, torch version); the differences are shown in the table",
    )
    parser.add_argument(
        "--no-prev",
        action="store_true",
        help="no comparison with the row above (Δ prev): each configuration is tested against the "
        "baseline only, for branches off one baseline",
    )
    parser.add_argument(
        "--length-buckets",
        default=DEFAULT_BUCKETS,
        help="buckets of reference length in words, ascending and not overlapping, only the last "
        f"open (default {DEFAULT_BUCKETS})",
    )
    parser.add_argument(
        "--length-splits",
        default=None,
        help="test splits of the length table, pooled: 'all' (every test split all runs have "
        "hypotheses for) or names joined by commas (default: the runs' own test split)",
    )
    parser.add_argument(
        "--untrained-below",
        type=float,
        default=UNTRAINED_BELOW,
        help="mean test BLEU under which a configuration is marked untrained and left out of the "
        f"Holm-Bonferroni family (default {UNTRAINED_BELOW:g}; 0: none is)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
