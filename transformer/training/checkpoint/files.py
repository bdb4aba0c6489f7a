"""Reading and writing checkpoints (see :mod:`transformer.training.checkpoint` for the format):
all three files of a save are staged before any is moved into place (:func:`transformer.io.atomic_write_all`).
"""

from __future__ import annotations

import json
import pickle
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.io import atomic_write_all, safetensors_writer, weights_for_safetensors
from transformer.run_weights import read_weights
from transformer.training.checkpoint.format import (
    FORMAT,
    META_SUFFIX,
    STATE_SUFFIX,
    WEIGHTS_SUFFIX,
    CheckpointError,
    check_plain,
    checkpoint_file,
    weights_path,
)

__all__ = ["average_checkpoints", "load_checkpoint", "load_weights", "save_checkpoint"]


def load_weights(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Read a safetensors weights file.

    Args:
        path: a ``.safetensors`` file or a checkpoint stem (``dir / name``; the suffix is added).
        map_location: the device to put the tensors on.

    Returns:
        name -> tensor.

    Raises:
        FileNotFoundError: when the file is missing.
        CheckpointError: when it cannot be parsed.
    """
    return read_weights(weights_path(Path(path)), str(map_location))[0]


def save_checkpoint(
    path_dir: Path | str, name: str, model_state: dict[str, Tensor], train_state: dict[str, Any]
) -> Path:
    """Write checkpoint ``name`` (``.safetensors``, ``.pt``, ``.json``) atomically into ``path_dir``.

    Args:
        path_dir: the folder (created when missing).
        name: the file stem, e.g. ``"checkpoint_last"``.
        model_state: ``model.state_dict()`` (tied weights allowed, any device).
        train_state: plain training state, e.g. ``{"optimizer": opt.state_dict(), "scheduler":
            sched.state_dict(), "scaler": scaler.state_dict(), "rng": get_rng_state(),
            "sampler": {...}, "update": 1000, "epoch": 3, "best_metric": 31.2, "config": {...}}``.

    Returns:
        The checkpoint stem ``path_dir / name`` (pass ``stem.parent, stem.name`` to
        :func:`load_checkpoint`).

    Raises:
        TypeError: when ``train_state`` holds something ``torch.load(weights_only=True)`` cannot
            read, or ``model_state`` a non-tensor; nothing is written then.
    """
    path_dir = Path(path_dir)
    check_plain(train_state, "train_state")
    tensors = weights_for_safetensors(model_state)
    checkpoint_id = uuid.uuid4().hex
    meta = {"format": FORMAT, "checkpoint_id": checkpoint_id}
    payload = {"format": FORMAT, "checkpoint_id": checkpoint_id, "train_state": train_state}
    info = {
        **{k: v for k, v in train_state.items() if isinstance(v, (bool, int, float, str, type(None)))},
        **meta,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_tensors": len(tensors),
        "num_elements": sum(t.numel() for t in tensors.values()),
    }
    config = train_state.get("config")
    weights_meta = dict(meta)
    if isinstance(config, dict) and isinstance(config.get("model"), dict):
        # the weights name the model they belong to: loaders refuse them with another model config
        weights_meta["model_config"] = json.dumps(config["model"], sort_keys=True)
    stem = path_dir / name
    atomic_write_all(
        [
            (checkpoint_file(stem, STATE_SUFFIX), lambda tmp: torch.save(payload, tmp)),
            (checkpoint_file(stem, WEIGHTS_SUFFIX), safetensors_writer(tensors, weights_meta)),
            (checkpoint_file(stem, META_SUFFIX), lambda tmp: tmp.write_text(json.dumps(info, indent=1) + "\n")),
        ]
    )
    return stem


def load_checkpoint(
    path_dir: Path | str, name: str, map_location: str | torch.device = "cpu"
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read checkpoint ``name`` from ``path_dir``.

    Args:
        path_dir: the folder.
        name: the file stem (``"checkpoint_last"``).
        map_location: device for the weights and the tensors of the training state.

    Returns:
        ``(model_state, train_state)``: name -> tensor for ``model.load_state_dict(...,
        strict=True)``, and the training state dict as saved.

    Raises:
        FileNotFoundError: when a file is missing.
        CheckpointError: when a file cannot be parsed (the message says why, and never suggests
            unpickling a foreign file) or the two files come from different saves.
    """
    stem = Path(path_dir) / name
    weights_path, state_path = checkpoint_file(stem, WEIGHTS_SUFFIX), checkpoint_file(stem, STATE_SUFFIX)
    model_state, meta = read_weights(weights_path, str(map_location))
    if not state_path.is_file():
        raise FileNotFoundError(f"no training state file {state_path}")
    try:
        payload = torch.load(state_path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {state_path}: {_load_failure(e)}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{state_path} is not a {FORMAT} training state")
    if payload["checkpoint_id"] != meta.get("checkpoint_id"):
        raise CheckpointError(
            f"{weights_path} and {state_path} come from different saves (checkpoint_id "
            f"{meta.get('checkpoint_id')} vs {payload['checkpoint_id']}); the save was interrupted "
            "between its renames, use another checkpoint"
        )
    return model_state, payload["train_state"]


def _load_failure(err: Exception) -> str:
    """Why ``torch.load`` refused a training state, without torch's advice to unpickle it anyway
    (a training state of this project holds only plain data, so any other object means the file
    is foreign or damaged, and it is never unpickled)."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (
            f"it holds Python objects{what} besides tensors, numbers and strings, so it is not a "
            "training state written by this project (such files are never unpickled)"
        )
    return " ".join(text.split("\n")[0].split()) or type(err).__name__


def average_checkpoints(paths: Iterable[Path | str]) -> dict[str, Tensor]:
    """Average the weights of several checkpoints (Vaswani et al. 2017 §6.1; fairseq
    ``average_checkpoints.py``).

    Floating-point tensors are summed in float64 and divided by the count, then cast back to
    their dtype. Other tensors (integer buffers) are taken from the last checkpoint. Files are
    read one at a time.

    Args:
        paths: ``.safetensors`` files or checkpoint stems, at least one.

    Returns:
        name -> averaged tensor (CPU, no shared storage).

    Raises:
        ValueError: when ``paths`` is empty, or a file's names or shapes differ from the first
            file's (the message names the file and the keys).
        FileNotFoundError, CheckpointError: when a file is missing or unreadable.
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
