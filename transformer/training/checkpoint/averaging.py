"""The work of ``scripts/average_checkpoints.py``: average the last N numbered checkpoints of a run
(or files) into one safetensors file whose metadata names the run (``source_run``, so translate and
evaluate find its config and tokenizer) and the checkpoints (``averaged_from``); and a run's own
average, ``checkpoint_avg.safetensors``, which its final test uses (docs/decoding.md#averaging-checkpoints)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.runs.folder import AVERAGE, CONFIG_NAMES, FORMAT, WEIGHTS_SUFFIX, checkpoint_stem, weights_path
from transformer.runs.io import write_safetensors
from transformer.training.checkpoint.files import load_weights
from transformer.training.checkpoint.manager import numbered_checkpoints

__all__ = ["average_checkpoints", "resolve_inputs", "save_run_average", "source_run", "write_average"]


def average_checkpoints(paths: Iterable[Path | str]) -> dict[str, Tensor]:
    """name -> the weights averaged over checkpoints (Vaswani et al. 2017 §6.1; fairseq's
    ``average_checkpoints.py``), CPU: floats summed in float64 and cast back, other tensors from the
    last; files read one at a time.

    Raises:
        ValueError: no ``paths``, or names or shapes differing from the first file's (named).
        FileNotFoundError, CheckpointError: a missing or unreadable file.
    """
    files = [weights_path(Path(p)) for p in paths]
    if not files:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    sums: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for i, path in enumerate(files):
        state = load_weights(path)
        if i == 0:
            dtypes = {k: v.dtype for k, v in state.items()}
            sums = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in state.items()}
            continue
        if state.keys() != sums.keys():
            missing, extra = sorted(sums.keys() - state.keys()), sorted(state.keys() - sums.keys())
            raise ValueError(
                f"{path} does not have the tensors of {files[0]}: missing {missing[:10]}, extra {extra[:10]}"
            )
        for k, v in state.items():
            if v.shape != sums[k].shape or v.is_floating_point() != dtypes[k].is_floating_point:
                raise ValueError(
                    f"{path}: {k} is {v.dtype} {tuple(v.shape)}, in {files[0]} it is {dtypes[k]} {tuple(sums[k].shape)}"
                )
            sums[k] = sums[k].add_(v.to(torch.float64)) if v.is_floating_point() else v
    n = len(files)
    return {k: (v.div_(n).to(dtypes[k]) if dtypes[k].is_floating_point else v) for k, v in sums.items()}


def resolve_inputs(inputs: Sequence[Path | str], num_last: int | None, *, warn_prefix: str = "warning: ") -> list[Path]:
    """The checkpoints to average, oldest first: one folder of numbered checkpoints, or files/stems;
    the last ``num_last`` (None: all). Fewer than ``num_last`` is a warning on stderr.

    Raises:
        ValueError: a folder mixed with files, ``num_last < 1``, or nothing to average (the folder,
            what it holds, and ``train.save_every`` named).
    """
    inputs = [Path(p) for p in inputs]
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
            print(f"{warn_prefix}--num-last={num_last} but {where}; averaging those {len(paths)}", file=sys.stderr)
        paths = paths[-num_last:]
    return paths


def source_run(paths: Sequence[Path | str]) -> Path | None:
    """The first checkpoint's folder (resolved) when it holds the run's config, else None."""
    folder = Path(paths[0]).resolve().parent
    found = any((folder / name).is_file() for name in CONFIG_NAMES)
    return folder if found else None


def write_average(
    inputs: Sequence[Path | str], output: Path | str, num_last: int | None = None, *, warn_prefix: str = "warning: "
) -> Path:
    """Average the checkpoints :func:`resolve_inputs` picks into ``output`` (atomic), print one line, and
    return the path. Float64 sums cast back to each dtype; integer buffers come from the last checkpoint.

    Raises:
        ValueError: see :func:`resolve_inputs`; checkpoints whose tensors differ.
        FileNotFoundError, CheckpointError: a missing or unreadable checkpoint.
    """
    paths = resolve_inputs(inputs, num_last, warn_prefix=warn_prefix)
    averaged = average_checkpoints(paths)
    metadata = {"averaged_from": json.dumps([str(p) for p in paths])}
    run = source_run(paths)
    if run is not None:  # lets translate/evaluate find the run's config and tokenizer from anywhere
        metadata["source_run"] = str(run)
    out = write_safetensors(output, averaged, metadata=metadata)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return out


def save_run_average(
    run_dir: Path | str, checkpoints: Sequence[Path | str], model_config: dict[str, Any] | None = None
) -> tuple[dict[str, Tensor], Path]:
    """Average a run's checkpoints (oldest first) into ``<run_dir>/checkpoint_avg.safetensors``,
    atomically, with the format tag, a fresh ``checkpoint_id``, ``averaged_from`` and ``model_config``
    in its metadata.

    Returns:
        ``(averaged, path)``: the tensors as written (``load_state_dict(averaged, strict=True)``) and the file.

    Raises:
        ValueError, FileNotFoundError, CheckpointError: see :func:`average_checkpoints`.
        OSError: the file cannot be written (nothing half-written).
    """
    averaged = average_checkpoints(checkpoints)
    metadata = {
        "format": FORMAT,
        "checkpoint_id": uuid.uuid4().hex,
        "averaged_from": json.dumps([checkpoint_stem(p).name for p in checkpoints]),
    }
    if model_config is not None:
        metadata["model_config"] = json.dumps(model_config, sort_keys=True)
    path = write_safetensors(Path(run_dir) / (AVERAGE + WEIGHTS_SUFFIX), averaged, metadata=metadata)
    return averaged, path
