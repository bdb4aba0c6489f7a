"""Average the weights of several checkpoints into one safetensors file (Vaswani et al. 2017 §6.1:
the last 5 (base) or 20 (big) checkpoints; fairseq ``scripts/average_checkpoints.py``).

    python scripts/train.py train.save_every=100 train.keep_last=5 hydra.run.dir=outputs/RUN   # numbered checkpoints
    python scripts/average_checkpoints.py --inputs outputs/RUN --num-last 5 --output outputs/RUN/checkpoint_avg5.safetensors
    python scripts/translate.py checkpoint=outputs/RUN/checkpoint_avg5.safetensors input=test.en
    python scripts/average_checkpoints.py --inputs RUN/checkpoint_3000 RUN/checkpoint_4000 --output avg.safetensors

A folder input takes its numbered ``checkpoint_{update}`` files (the newest ``--num-last`` of
them; training writes them only with ``train.save_every=N``, and keeps the newest
``train.keep_last``); file inputs (``.safetensors`` files or checkpoint stems) are used as given,
or their last ``--num-last``. When fewer than ``--num-last`` exist, all of them are averaged with a
warning. Averaging is done in float64 and cast back to each tensor's dtype; the output is written
atomically and loads with ``model.load_state_dict(safetensors.torch.load_file(path))``. Its
metadata names the run the checkpoints come from (``source_run``), so ``scripts/translate.py`` and
``scripts/evaluate.py`` find that run's config and tokenizer even when the average is written
outside the run folder.

The work is :func:`transformer.training.checkpoint.write_average`; this file parses the arguments
and reports errors as ``average_checkpoints.py: error: ...`` with exit status 1
(:func:`transformer.cli.user_errors`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer.cli import user_errors
from transformer.training.checkpoint import CheckpointError, write_average

PROG = "average_checkpoints.py"
ERRORS = {(ValueError, FileNotFoundError, CheckpointError): 1}
"""The user errors this script reports on one line, and their exit status."""


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry point; returns the written file.

    Args:
        argv: arguments without the program name (``sys.argv[1:]`` when None).

    Returns:
        The output path.

    Raises:
        SystemExit: status 1 with one line ``average_checkpoints.py: error: ...`` on stderr for a
            user error (see :func:`transformer.training.checkpoint.write_average`); 2 for bad arguments.
    """
    args = build_parser().parse_args(argv)
    with user_errors(ERRORS, prefix=f"{PROG}: error: "):
        return write_average(args.inputs, args.output, args.num_last, warn_prefix=f"{PROG}: warning: ")


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script (the README's command lines are parsed with it in a test)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--inputs",
        nargs="+",
        type=Path,
        required=True,
        help="a folder of checkpoint_{update} files, or checkpoint files/stems",
    )
    parser.add_argument("--num-last", type=int, default=None, help="average only the last N checkpoints")
    parser.add_argument("--output", type=Path, required=True, help="the .safetensors file to write")
    return parser


if __name__ == "__main__":
    main()
