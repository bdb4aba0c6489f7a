"""Average the weights of several checkpoints into one safetensors file (Vaswani et al. 2017 §6.1:
the last 5 (base) or 20 (big) checkpoints; fairseq ``scripts/average_checkpoints.py``).

    python scripts/train.py train.save_every=100 train.keep_last=5 hydra.run.dir=outputs/RUN   # numbered checkpoints
    python scripts/average_checkpoints.py --inputs outputs/RUN --num-last 5 --output outputs/RUN/checkpoint_avg.safetensors
    python scripts/translate.py checkpoint=outputs/RUN/checkpoint_avg.safetensors input=test.en
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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow running from a checkout without installing
    sys.path.insert(0, str(ROOT))

from transformer.training.checkpoint import (  # noqa: E402
    CheckpointError,
    average_checkpoints,
    numbered_checkpoints,
    save_weights,
)


def resolve_inputs(inputs: list[Path], num_last: int | None) -> list[Path]:
    """The checkpoints to average.

    Args:
        inputs: one folder of numbered checkpoints, or checkpoint files/stems.
        num_last: keep only the last ``num_last`` (by update for a folder, by position for files);
            None keeps all.

    Returns:
        Checkpoint paths, oldest first.

    Raises:
        ValueError: when a folder is mixed with files, ``num_last < 1``, or there is nothing to
            average (the message names the folder, what it holds, and ``train.save_every``).

    Warns:
        On stderr, when fewer than ``num_last`` checkpoints exist (all of them are averaged).
    """
    if num_last is not None and num_last < 1:
        raise ValueError(f"--num-last={num_last} must be >= 1")
    if any(p.is_dir() for p in inputs):
        if len(inputs) != 1:
            raise ValueError("give either one folder or checkpoint files to --inputs, not both")
        paths = numbered_checkpoints(inputs[0])
        where = f"{inputs[0]} has numbered checkpoints {[p.name for p in paths]}"
        if not paths:
            others = sorted(p.name[: -len(".safetensors")] for p in inputs[0].glob("checkpoint_*.safetensors"))
            holds = f" (it holds {', '.join(others)})" if others else ""
            raise ValueError(
                f"no checkpoints to average: {inputs[0]} has no numbered checkpoint_<update> files{holds}. "
                "Training writes them only with train.save_every=N (e.g. train.save_every=500 "
                "train.keep_last=5); or pass checkpoint files to --inputs"
            )
    else:
        paths, where = list(inputs), f"--inputs lists {len(inputs)} checkpoints"
    if not paths:
        raise ValueError(f"no checkpoints to average: {where}")
    if num_last is not None:
        if len(paths) < num_last:
            print(f"average_checkpoints.py: warning: --num-last={num_last} but {where}; averaging "
                  f"those {len(paths)}", file=sys.stderr)
        paths = paths[-num_last:]
    return paths


def source_run(paths: list[Path]) -> Path | None:
    """The run folder the checkpoints come from: the first one's folder when it holds the run's
    config (``config.yaml`` or ``.hydra/config.yaml``), else None."""
    folder = Path(paths[0]).resolve().parent
    found = any((folder / name).is_file() for name in ("config.yaml", ".hydra/config.yaml"))
    return folder if found else None


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry point; returns the written file.

    Args:
        argv: arguments without the program name (``sys.argv[1:]`` when None).

    Returns:
        The output path.

    Raises:
        ValueError: see :func:`resolve_inputs` and
            :func:`transformer.training.checkpoint.average_checkpoints`.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", nargs="+", type=Path, required=True,
                        help="a folder of checkpoint_{update} files, or checkpoint files/stems")
    parser.add_argument("--num-last", type=int, default=None, help="average only the last N checkpoints")
    parser.add_argument("--output", type=Path, required=True, help="the .safetensors file to write")
    args = parser.parse_args(argv)

    paths = resolve_inputs(args.inputs, args.num_last)
    averaged = average_checkpoints(paths)
    metadata = {"averaged_from": json.dumps([str(p) for p in paths])}
    run = source_run(paths)
    if run is not None:  # lets translate/evaluate find the run's config and tokenizer from anywhere
        metadata["source_run"] = str(run)
    out = save_weights(args.output, averaged, metadata=metadata)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return out


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        sys.exit(f"average_checkpoints.py: error: {e}")
