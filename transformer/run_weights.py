"""Which weights a run folder means, and reading a weights file: the one home of both, for
loading a run to decode with (:func:`transformer.generation.load_run`) and for training's
checkpoints (:mod:`transformer.training.checkpoint`).

A run folder means the weights its ``results.json`` was tested with (``test_weights``:
``checkpoint_avg.safetensors`` for a ``train.average_last > 0`` run, else
``checkpoint_best.safetensors``); a folder whose ``results.json`` names none (a run from before the
record, or one still training) falls back to ``checkpoint_best``, else ``checkpoint_last``
(:func:`find_checkpoint`). :func:`read_weights` reads one ``.safetensors`` file, tensors and header
metadata, and names a file it cannot parse.

Errors: :class:`LoadError` (a run or checkpoint that cannot be loaded) and its kind
:class:`CheckpointError` (a checkpoint's files that cannot be read or do not belong together), so
that a script loading a run reports either as one line. It sits beside
:mod:`transformer.run_folder` (the names it resolves) and imports only that and :mod:`transformer.io`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch import Tensor

from transformer.io import SafetensorsReadError, read_safetensors
from transformer.run_folder import BEST, LAST, WEIGHTS_SUFFIX, has_checkpoint, weights_path

__all__ = ["CHECKPOINT_NAMES", "CheckpointError", "LoadError", "find_checkpoint", "read_weights"]

CHECKPOINT_NAMES = (BEST, LAST)
"""A run folder whose ``results.json`` names no tested weights is loaded from its best checkpoint, else its last."""


class LoadError(RuntimeError):
    """A run or checkpoint that cannot be loaded (the message says why and what was expected)."""


class CheckpointError(LoadError):
    """A checkpoint that cannot be read or whose files do not belong together."""


def read_weights(path: Path | str, device: str = "cpu") -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read a ``.safetensors`` weights file: every tensor and the header metadata.

    Args:
        path: the ``.safetensors`` file.
        device: where to put the tensors.

    Returns:
        ``(tensors, metadata)``: name -> tensor, and the header's string -> string entries.

    Raises:
        FileNotFoundError: when ``path`` is not a file.
        CheckpointError: when it cannot be parsed (``"<path> is not a safetensors weights file
            (cannot read <path>: <reason>); expected ..."``).
    """
    try:
        return read_safetensors(path, device)
    except SafetensorsReadError as e:
        raise CheckpointError(
            f"{path} is not a safetensors weights file ({e}); expected the checkpoint_*.safetensors written by training"
        ) from e


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """Resolve a run folder, checkpoint file or checkpoint stem to ``(run_dir, weights_file)``.

    A run folder resolves to the weights its ``results.json`` names as ``test_weights`` (the file
    its test scores came from: ``checkpoint_avg.safetensors`` after ``train.average_last > 0``),
    else to ``checkpoint_best``, else ``checkpoint_last``. When the folder has a ``results.json``,
    one line on stderr says which file and why (for a fallback: what ``results.json`` says its
    scores came from instead); a folder without one (a run still training) reports no numbers,
    and its best or last checkpoint is loaded silently, as the callers name the file they load.

    Args:
        path: a run folder, a ``.safetensors`` or ``.pt`` checkpoint file, or a stem such as
            ``runs/x/checkpoint_best``.

    Returns:
        The run folder (the checkpoint's folder) and the ``.safetensors`` weights file.

    Raises:
        LoadError: nothing usable at ``path`` (the message lists what was looked for).
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
    """The weights file ``run_dir/results.json`` names as ``test_weights`` when it is there, and a
    few words on it; else None and why the folder falls back to its best or last checkpoint
    (``""`` when it has no ``results.json``)."""
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
