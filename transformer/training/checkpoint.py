"""Crash-safe checkpoints: weights in safetensors, training state in a ``weights_only`` torch file.

A checkpoint called ``name`` in folder ``d`` is three files sharing the stem ``d / name``:

- ``{name}.safetensors``: the model's ``state_dict()`` (safetensors; loads without pickle).
- ``{name}.pt``: the training state (optimizer, scheduler, grad scaler, RNG states, sampler
  state, update count, epoch, best metric, config as a plain dict) written with ``torch.save``
  and read with ``torch.load(weights_only=True)``, so it may hold only tensors, Python numbers,
  strings, ``None`` and dicts/lists/tuples of these (checked before writing).
- ``{name}.json``: human-readable metadata (the top-level numbers/strings of the training state).

Atomicity: every file is written to a temporary file in the same folder, flushed and
``fsync``-ed, and only when all three are complete are they moved into place with ``os.replace``
(atomic on POSIX). A crash while writing leaves the previous checkpoint untouched. The weights and
the training state carry the same random ``checkpoint_id``; a crash in the microseconds between
the renames would pair files from two saves, and :func:`load_checkpoint` then refuses them.

Tied (shared) weights: safetensors refuses tensors that share storage, so every tensor whose
storage was already written is stored as a clone under its own name. Loading with
``model.load_state_dict(state, strict=True)`` copies each name into the model's existing
parameters in place, so a tied parameter is filled (twice, with equal values) and stays tied.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.io import (
    SafetensorsReadError,
    atomic_write,
    atomic_write_all,
    read_safetensors,
    safetensors_writer,
    weights_for_safetensors,
)
from transformer.io import write_safetensors as save_weights

WEIGHTS_SUFFIX = ".safetensors"
STATE_SUFFIX = ".pt"
META_SUFFIX = ".json"
_FORMAT = "transformer-zoo-checkpoint/1"
_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or whose files do not belong together."""


# ----------------------------------------------------------------------------- weights


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
    return _read_weights(_weights_path(Path(path)), str(map_location))[0]


def _read_weights(path: Path, device: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        return read_safetensors(path, device)
    except SafetensorsReadError as e:
        raise CheckpointError(str(e)) from e


def _weights_path(path: Path) -> Path:
    return path if path.suffix == WEIGHTS_SUFFIX else path.with_name(path.name + WEIGHTS_SUFFIX)


# ----------------------------------------------------------------------------- training state


def _check_plain(obj: Any, where: str) -> None:
    """Raise TypeError unless ``obj`` loads with ``torch.load(weights_only=True)``."""
    if isinstance(obj, Tensor) or type(obj) in _PLAIN_SCALARS:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in _PLAIN_SCALARS:
                raise TypeError(f"{where} has a key of type {type(k).__name__}; use str or int keys")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; the training state may hold only "
        "tensors, numbers, strings, None and dicts/lists/tuples of these (torch.load(weights_only=True)); "
        "convert configs with OmegaConf.to_container / dataclasses.asdict and arrays with torch.as_tensor"
    )


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
    _check_plain(train_state, "train_state")
    tensors = weights_for_safetensors(model_state)
    checkpoint_id = uuid.uuid4().hex
    meta = {"format": _FORMAT, "checkpoint_id": checkpoint_id}
    payload = {"format": _FORMAT, "checkpoint_id": checkpoint_id, "train_state": train_state}
    info = {
        **{k: v for k, v in train_state.items() if isinstance(v, (bool, int, float, str, type(None)))},
        **meta,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_tensors": len(tensors),
        "num_elements": sum(t.numel() for t in tensors.values()),
    }
    stem = path_dir / name
    atomic_write_all(
        [
            (stem.with_name(name + STATE_SUFFIX), lambda tmp: torch.save(payload, tmp)),
            (stem.with_name(name + WEIGHTS_SUFFIX), safetensors_writer(tensors, meta)),
            (stem.with_name(name + META_SUFFIX), lambda tmp: tmp.write_text(json.dumps(info, indent=1) + "\n")),
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
        CheckpointError: when a file cannot be parsed or the two files come from different saves.
    """
    stem = Path(path_dir) / name
    weights_path, state_path = stem.with_name(name + WEIGHTS_SUFFIX), stem.with_name(name + STATE_SUFFIX)
    model_state, meta = _read_weights(weights_path, str(map_location))
    if not state_path.is_file():
        raise FileNotFoundError(f"no training state file {state_path}")
    try:
        payload = torch.load(state_path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {state_path}: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise CheckpointError(f"{state_path} is not a {_FORMAT} training state")
    if payload["checkpoint_id"] != meta.get("checkpoint_id"):
        raise CheckpointError(
            f"{weights_path} and {state_path} come from different saves (checkpoint_id "
            f"{meta.get('checkpoint_id')} vs {payload['checkpoint_id']}); the save was interrupted "
            "between its renames, use another checkpoint"
        )
    return model_state, payload["train_state"]


# ----------------------------------------------------------------------------- RNG


def get_rng_state() -> dict[str, Tensor]:
    """Capture the random number generators as tensors (storable with ``weights_only``).

    Returns:
        ``{"python": int64 (625,) [version, Mersenne Twister state...], "python_gauss": float64
        (2,) [has_value, value], "numpy": int64 (626,) [pos, has_gauss, keys...], "numpy_gauss":
        float64 (1,), "torch": uint8 CPU state, "cuda": uint8 (devices, state) when CUDA is
        initialised}``; the numpy entries are present when numpy is installed.
    """
    version, internal, gauss = random.getstate()
    state = {
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        _, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64)
        state["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Tensor]) -> None:
    """Restore generators captured by :func:`get_rng_state`; entries that are absent are skipped.

    CUDA states are restored for ``min(saved, visible)`` devices.

    Args:
        state: the dict returned by :func:`get_rng_state` (tensors on any device).
    """
    if "python" in state:
        values = [int(v) for v in state["python"].tolist()]
        gauss = None
        if "python_gauss" in state and state["python_gauss"][0].item():
            gauss = float(state["python_gauss"][1].item())
        random.setstate((values[0], tuple(values[1:]), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
    if "numpy" in state:
        import numpy as np

        values = [int(v) for v in state["numpy"].tolist()]
        cached = float(state["numpy_gauss"][0].item()) if "numpy_gauss" in state else 0.0
        np.random.set_state(("MT19937", np.array(values[2:], dtype=np.uint32), values[0], values[1], cached))
    if "cuda" in state and torch.cuda.is_available():
        for i in range(min(state["cuda"].shape[0], torch.cuda.device_count())):
            torch.cuda.set_rng_state(state["cuda"][i].cpu().to(torch.uint8), i)


# ----------------------------------------------------------------------------- manager

_NUMBERED = re.compile(r"^checkpoint_(\d+)" + re.escape(WEIGHTS_SUFFIX) + "$")


def _link_or_copy_all(src: Path, dst: Path) -> None:
    """Make checkpoint ``dst`` a copy of ``src`` (hard links when possible), atomically per file."""

    def copier(suffix: str) -> Callable[[Path], None]:
        def write(tmp: Path) -> None:
            tmp.unlink()
            try:
                os.link(src.with_name(src.name + suffix), tmp)
            except OSError:
                shutil.copyfile(src.with_name(src.name + suffix), tmp)

        return write

    atomic_write_all([(dst.with_name(dst.name + s), copier(s)) for s in (STATE_SUFFIX, WEIGHTS_SUFFIX, META_SUFFIX)])


def _remove_checkpoint(stem: Path) -> None:
    for suffix in (WEIGHTS_SUFFIX, STATE_SUFFIX, META_SUFFIX):
        stem.with_name(stem.name + suffix).unlink(missing_ok=True)


class CheckpointManager:
    """The checkpoints of one run: ``checkpoint_last``, ``checkpoint_best`` and numbered
    ``checkpoint_{update}`` files (fairseq names), all in ``run_dir``.

    Each :meth:`save` serialises once (into ``checkpoint_last``) and makes ``checkpoint_best`` /
    ``checkpoint_{update}`` hard links of it (copies where links are not supported); every
    replacement is atomic, so a crash leaves the previous files loadable.

    Args:
        run_dir: the folder holding the checkpoints (created when missing).
        keep_last: how many numbered checkpoints to keep (the newest); 0 keeps all.

    Raises:
        ValueError: when ``keep_last < 0``.
    """

    LAST = "checkpoint_last"
    BEST = "checkpoint_best"

    def __init__(self, run_dir: Path | str, keep_last: int = 5) -> None:
        if keep_last < 0:
            raise ValueError(f"keep_last={keep_last} must be >= 0 (0 keeps every numbered checkpoint)")
        self.run_dir = Path(run_dir)
        self.keep_last = int(keep_last)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def save(
        self,
        update: int,
        model_state: dict[str, Tensor],
        train_state: dict[str, Any],
        is_best: bool = False,
        numbered: bool = False,
    ) -> Path:
        """Write ``checkpoint_last``; also ``checkpoint_best`` when ``is_best`` and
        ``checkpoint_{update}`` when ``numbered`` (then prune to the newest ``keep_last``).

        Args:
            update: the number of completed updates (names the numbered checkpoint).
            model_state: ``model.state_dict()``.
            train_state: the plain training state (see :func:`save_checkpoint`).
            is_best: whether this is the best validation result so far.
            numbered: whether to keep this state as ``checkpoint_{update}``.

        Returns:
            The stem of ``checkpoint_last``.

        Raises:
            TypeError: see :func:`save_checkpoint`.
        """
        last = save_checkpoint(self.run_dir, self.LAST, model_state, train_state)
        if is_best:
            _link_or_copy_all(last, self.run_dir / self.BEST)
        if numbered:
            _link_or_copy_all(last, self.run_dir / f"checkpoint_{int(update)}")
            self._prune()
        return last

    def _prune(self) -> None:
        if self.keep_last > 0:
            for stem in self.numbered()[: -self.keep_last]:
                _remove_checkpoint(stem)

    def latest(self) -> Path | None:
        """The stem of ``checkpoint_last``, or None when there is none."""
        stem = self.run_dir / self.LAST
        return stem if stem.with_name(stem.name + WEIGHTS_SUFFIX).is_file() else None

    def best(self) -> Path | None:
        """The stem of ``checkpoint_best``, or None when there is none."""
        stem = self.run_dir / self.BEST
        return stem if stem.with_name(stem.name + WEIGHTS_SUFFIX).is_file() else None

    def numbered(self) -> list[Path]:
        """Stems of the numbered checkpoints, oldest (lowest update) first."""
        return numbered_checkpoints(self.run_dir)


def numbered_checkpoints(folder: Path | str) -> list[Path]:
    """Stems of the ``checkpoint_{update}`` checkpoints in ``folder``, oldest (lowest update) first.

    Args:
        folder: a checkpoint folder (see :class:`CheckpointManager`); a missing folder has none.

    Returns:
        ``[folder / "checkpoint_{update}", ...]`` for every ``checkpoint_{update}.safetensors``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), m.group(1)) for m in map(_NUMBERED.match, os.listdir(folder)) if m]
    return [folder / f"checkpoint_{digits}" for _, digits in sorted(found)]


# ----------------------------------------------------------------------------- averaging


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
    files = [_weights_path(Path(p)) for p in paths]
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


__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_write",
    "average_checkpoints",
    "get_rng_state",
    "load_checkpoint",
    "load_weights",
    "numbered_checkpoints",
    "save_checkpoint",
    "save_weights",
    "set_rng_state",
    "weights_for_safetensors",
]
