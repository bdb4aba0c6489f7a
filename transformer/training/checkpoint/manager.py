"""The checkpoints of one run: ``checkpoint_last``, ``checkpoint_best`` and numbered
``checkpoint_{update}`` (fairseq names), linked rather than rewritten, pruned to the newest few."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer.runs.folder import BEST, LAST, META_SUFFIX, STATE_SUFFIX, SUFFIXES, WEIGHTS_SUFFIX, checkpoint_file
from transformer.runs.folder import numbered as numbered_name
from transformer.runs.io import atomic_write_all
from transformer.training.checkpoint.files import save_checkpoint

__all__ = ["CheckpointManager", "numbered_checkpoints", "remove_stale_temporaries"]

_NUMBERED = re.compile(r"^checkpoint_(\d+)" + re.escape(WEIGHTS_SUFFIX) + "$")
# a temporary file of transformer.runs.io.atomic_write: "." + destination name + "." + random + ".tmp"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp$")
_RUN_FILES = re.compile(
    r"^(checkpoint_\w+\.(safetensors|pt|json)|results\.json|config\.yaml|spm(\.src|\.tgt)?\.model|metrics\.jsonl)$"
)


def _link_or_copy_all(src: Path, dst: Path) -> None:
    """Make checkpoint ``dst`` a copy of ``src`` (hard links when possible), atomically per file."""

    def copier(suffix: str) -> Callable[[Path], None]:
        def write(tmp: Path) -> None:
            tmp.unlink()
            try:
                os.link(checkpoint_file(src, suffix), tmp)
            except OSError:
                shutil.copyfile(checkpoint_file(src, suffix), tmp)

        return write

    atomic_write_all([(checkpoint_file(dst, s), copier(s)) for s in SUFFIXES])


def _remove_checkpoint(stem: Path) -> None:
    for suffix in (WEIGHTS_SUFFIX, STATE_SUFFIX, META_SUFFIX):  # weights first: the checkpoint disappears at once
        checkpoint_file(stem, suffix).unlink(missing_ok=True)


class CheckpointManager:
    """The checkpoints of one run in ``run_dir``: ``checkpoint_last``, ``checkpoint_best`` and numbered
    ``checkpoint_{update}`` (fairseq names); ``keep_last`` numbered ones kept (0: all).

    Each :meth:`save` serialises once and hard-links the others (copies where links fail),
    ``checkpoint_last`` last, each replacement atomic: a crash leaves the previous files loadable, and
    ``checkpoint_last`` never exists without its save's numbered and best checkpoints.

    Raises:
        ValueError: ``keep_last < 0``.
    """

    LAST = LAST
    BEST = BEST

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
        """Write ``checkpoint_last``, also ``checkpoint_best`` when ``is_best`` and ``checkpoint_{update}``
        when ``numbered`` (then prune); return the stem of ``checkpoint_last``.

        Raises:
            TypeError: see :func:`save_checkpoint`.
        """
        # checkpoint_last goes last: a crash between the writes leaves the previous checkpoint_last,
        # whose resume repeats this update and writes the numbered / best files again (were
        # checkpoint_last first, a resume from it would never write the numbered one it lacks)
        names = [numbered_name(update)] * numbered + [self.BEST] * is_best + [self.LAST]
        first = save_checkpoint(self.run_dir, names[0], model_state, train_state)
        for name in names[1:]:
            _link_or_copy_all(first, self.run_dir / name)
        if numbered:
            self._prune()
        return self.run_dir / self.LAST

    def _prune(self) -> None:
        if self.keep_last > 0:
            for stem in self.numbered()[: -self.keep_last]:
                _remove_checkpoint(stem)

    def latest(self) -> Path | None:
        """The stem of ``checkpoint_last``, or None when there is none."""
        stem = self.run_dir / self.LAST
        return stem if checkpoint_file(stem, WEIGHTS_SUFFIX).is_file() else None

    def best(self) -> Path | None:
        """The stem of ``checkpoint_best``, or None when there is none."""
        stem = self.run_dir / self.BEST
        return stem if checkpoint_file(stem, WEIGHTS_SUFFIX).is_file() else None

    def numbered(self) -> list[Path]:
        """Stems of the numbered checkpoints, oldest (lowest update) first."""
        return numbered_checkpoints(self.run_dir)


def numbered_checkpoints(folder: Path | str) -> list[Path]:
    """Stems of the ``checkpoint_{update}`` checkpoints in ``folder``, lowest update first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), m.group(1)) for m in map(_NUMBERED.match, os.listdir(folder)) if m]
    return [folder / f"checkpoint_{digits}" for _, digits in sorted(found)]


def remove_stale_temporaries(run_dir: Path | str) -> list[Path]:
    """Delete and return the temporaries an interrupted save left in ``run_dir`` (named like
    :func:`transformer.runs.io.atomic_write`'s for a run's files, and the old ``results.json.tmp``); nothing
    else. Only when no other process writes there."""
    folder = Path(run_dir)
    if not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        m = _TEMPORARY.match(entry.name)
        stale = (m is not None and _RUN_FILES.match(m.group("name")) is not None) or entry.name == "results.json.tmp"
        if stale and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
