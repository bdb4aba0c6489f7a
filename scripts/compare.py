"""Compare the runs of one or more sweeps: markdown table, CSV, significance and PNG plots.

    python scripts/train.py -m experiment=ladder hydra/launcher=joblib hydra.launcher.n_jobs=2
    python scripts/compare.py runs/ladder                                  # -> runs/ladder/comparison/
    python scripts/compare.py docs/results/ladder/runs --out docs/results/ladder \
        --baseline step0_vaswani2017 --bootstrap 1000

One row per configuration (runs whose resolved config differs only in seed, paths and logging):
BLEU and chrF mean ± std over seeds, parameters, FLOPs per token, KV-cache bytes per token,
train tokens/s, peak memory, the paired-bootstrap p-values against the baseline row and the row
above, Holm-Bonferroni adjusted over the table, and the baseline's seed spread as the noise floor.
The runs must differ only in the study's switches and the seed: runs trained with another
precision, budget, data or torch version stop the comparison with a sentence naming them, unless
--allow-mixed (then the table shows the differences). Runs without results.json (crashed,
unfinished) are listed, never dropped. Writes comparison.md, comparison.csv, runs.csv,
valid_curves.png and bleu_bars.png; prints the markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow running from a checkout without installing
    sys.path.insert(0, str(ROOT))

from transformer.analysis import compare_sweeps, write_outputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="multirun folders (or run folders)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first sweep>/comparison)")
    parser.add_argument("--baseline", default=None,
                        help="baseline configuration label or unique substring (default: the first, in ladder order)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="paired-bootstrap resamples; 0 to skip (default 1000)")
    parser.add_argument("--bootstrap-seed", type=int, default=12345, help="resampling seed (default 12345)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="compare runs that differ in more than the switches and the seed (precision, budget, "
                             "data, torch version); the differences are shown in the table")
    args = parser.parse_args(argv)
    try:
        comparison = compare_sweeps(args.sweep_dirs, baseline=args.baseline, n_bootstrap=args.bootstrap,
                                    bootstrap_seed=args.bootstrap_seed, allow_mixed=args.allow_mixed)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.out or args.sweep_dirs[0] / "comparison"
    paths = write_outputs(comparison, out)
    print(paths["markdown"].read_text(encoding="utf-8"))
    for name, path in paths.items():
        print(f"wrote {name}: {path}", file=sys.stderr)
    if comparison.missing:
        print(f"warning: {len(comparison.missing)} run(s) without results (listed above)", file=sys.stderr)
    if not comparison.rows:
        print("error: no finished run found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
