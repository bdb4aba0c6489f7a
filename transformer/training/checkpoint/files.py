"""Reading and writing checkpoints (see :mod:`transformer.training.checkpoint` for the format):
all three files of a save are staged before any is moved into place (:func:`transformer.runs.io.atomic_write_all`).
"""

from __future__ import annotations

import json
import pickle
import re
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.runs.folder import FORMAT, META_SUFFIX, STATE_SUFFIX, WEIGHTS_SUFFIX, checkpoint_file, weights_path
from transformer.runs.io import atomic_write_all, safetensors_writer, weights_for_safetensors
from transformer.runs.weights import CheckpointError, read_weights
from transformer.training.checkpoint.format import check_plain

__all__ = ["load_checkpoint", "load_weights", "save_checkpoint"]


def load_weights(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """name -> tensor of a ``.safetensors`` file or checkpoint stem, on ``map_location``.

    Raises:
        FileNotFoundError: the file is missing.
        CheckpointError: it cannot be parsed.
    """
    return read_weights(weights_path(Path(path)), str(map_location))[0]


def save_checkpoint(
    path_dir: Path | str, name: str, model_state: dict[str, Tensor], train_state: dict[str, Any]
) -> Path:
    """Write checkpoint ``name`` (``.safetensors``, ``.pt``, ``.json``) atomically into ``path_dir``;
    return the stem ``path_dir / name``.

    ``train_state`` is plain data (optimizer, scheduler, scaler, rng, sampler, update, epoch,
    best_metric, config) that ``torch.load(weights_only=True)`` reads.

    Raises:
        TypeError: ``train_state`` holds anything else, or ``model_state`` a non-tensor; nothing is written.
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
    """``(model_state, train_state)`` of checkpoint ``name`` in ``path_dir``.

    Raises:
        FileNotFoundError: a file is missing.
        CheckpointError: a file cannot be parsed (never unpickled) or the two come from different saves.
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
    """Why ``torch.load`` refused a training state, without torch's advice to unpickle it (a foreign or
    damaged file)."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (
            f"it holds Python objects{what} besides tensors, numbers and strings, so it is not a "
            "training state written by this project (such files are never unpickled)"
        )
    return " ".join(text.split("\n")[0].split()) or type(err).__name__
