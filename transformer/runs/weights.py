"""Which weights a run folder means (docs/decoding.md#which-weights-checkpointrun-loads), and reading
a weights file: the one home of both, for decoding and for training's checkpoints. Its errors,
:class:`LoadError` and its kind :class:`CheckpointError`, are one line in a script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch import Tensor

from transformer.runs.folder import BEST, LAST, WEIGHTS_SUFFIX, has_checkpoint, weights_path
from transformer.runs.io import SafetensorsReadError, read_safetensors

__all__ = ["CHECKPOINT_NAMES", "CheckpointError", "LoadError", "find_checkpoint", "read_weights"]

CHECKPOINT_NAMES = (BEST, LAST)
"""A run folder whose ``results.json`` names no tested weights is loaded from its best checkpoint, else its last."""


class LoadError(RuntimeError):
    """A run or checkpoint that cannot be loaded (the message says why and what was expected)."""


class CheckpointError(LoadError):
    """A checkpoint that cannot be read or whose files do not belong together."""


def read_weights(path: Path | str, device: str = "cpu") -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a ``.safetensors`` file: name -> tensor on ``device``, and the header's
    string entries.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        CheckpointError: it cannot be parsed (named).
    """
    try:
        return read_safetensors(path, device)
    except SafetensorsReadError as e:
        raise CheckpointError(
            f"{path} is not a safetensors weights file ({e}); expected the checkpoint_*.safetensors written by training"
        ) from e


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(run_dir, weights_file)`` of a run folder, checkpoint file (``.safetensors`` / ``.pt``) or stem.

    A folder resolves to its ``results.json``'s ``test_weights``, else ``checkpoint_best``, else
    ``checkpoint_last``; with a ``results.json``, one line on stderr says which and why.

    Raises:
        LoadError: nothing usable at ``path`` (what was looked for listed).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        tested, why = _tested_weights(p)
        if tested is not None:
            print(f"{p}: loading {tested.name}, {why}", file=sys.stderr, flush=True)
            return p, tested
        for name in CHECKPOINT_NAMES:
            if has_checkpoint(p, name):
                if why:  # a folder without results.json reports no numbers: nothing to tell apart
                    print(
                        f"{p}: loading {name}{WEIGHTS_SUFFIX}, the best checkpoint else the last: {why}",
                        file=sys.stderr,
                        flush=True,
                    )
                return p, weights_path(p / name)
        found = sorted(x.name for x in p.glob(f"*{WEIGHTS_SUFFIX}"))
        hint = f"; it holds {', '.join(found)} (pass one of them)" if found else ""
        raise LoadError(
            f"no checkpoint in {p}: expected {' or '.join(n + WEIGHTS_SUFFIX for n in CHECKPOINT_NAMES)}{hint}"
        )
    w = weights_path(p)  # a checkpoint's file or stem -> its weights
    if not w.is_file():
        if p.is_file():
            raise LoadError(
                f"{p} is not a checkpoint of this project: expected a run folder or a .safetensors "
                f"weights file (with its .pt training state), and there is no {w.name} next to it"
            )
        raise LoadError(f"checkpoint not found: {p} (no such file or folder)")
    return w.parent, w


def _tested_weights(run_dir: Path) -> tuple[Path | None, str]:
    """The ``test_weights`` file of ``run_dir/results.json`` and a few words on it, or None and why the
    folder falls back (``""`` without ``results.json``)."""
    try:
        results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as e:
        return None, f"results.json is unreadable, {' '.join(str(e).split())}"
    if not isinstance(results, dict):
        return None, "results.json is not a record of a run"
    named = results.get("test_weights")
    tested = results.get("final_model") or "unrecorded weights"
    if not isinstance(named, str) or not named:
        if "test_weights" in results:  # written by this version: the tested weights were never saved
            return None, f"results.json's test scores came from weights never saved as a file, {tested}"
        return None, (f"results.json, older than its test_weights record, says its test scores came from {tested}")
    f = run_dir / named
    if Path(named).name != named or not named.endswith(WEIGHTS_SUFFIX):
        return None, f"results.json's test_weights {named!r} is not a weights file name in the run folder"
    if not f.is_file():
        return None, f"results.json's test weights {named} are missing, its scores came from {tested}"
    return f, f"the weights of results.json's test scores ({tested})"
