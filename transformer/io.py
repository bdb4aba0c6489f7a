"""Crash-safe file writing and the one safetensors reader/writer of the package.

Every file the project writes that a later run reads back (checkpoints, results, caches,
tokenizers, downloads) goes through :func:`atomic_write`: the content is written to a temporary
file in the destination's folder, flushed and ``fsync``-ed, then moved into place with
``os.replace`` (atomic on POSIX). A crash while writing leaves the previous file untouched and no
half-written file under the destination's name. :func:`atomic_write_all` does the same for several
files that belong together: all are staged completely before the first is moved into place.

A run folder has one writer at a time: :class:`FolderLock` (an OS file lock released when its
process dies). Safetensors files are read with :func:`read_safetensors` (tensors and header metadata, one error
type naming the file) and written with :func:`write_safetensors` (atomic; tied or non-contiguous
tensors made acceptable by :func:`weights_for_safetensors`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

__all__ = [
    "LOCK_NAME",
    "FolderLock",
    "FolderLocked",
    "SafetensorsReadError",
    "atomic_write",
    "atomic_write_all",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_unlocked",
    "folder_locked_by_other",
    "read_safetensors",
    "safetensors_writer",
    "weights_for_safetensors",
    "write_safetensors",
]


class SafetensorsReadError(RuntimeError):
    """A file that the safetensors library cannot parse (the message names the file)."""


# ----------------------------------------------------------------------------- atomic files


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _stage(path: Path, write: Callable[[Path], None]) -> Path:
    """Write ``path``'s content to a fsync-ed temporary file next to it; return the temporary path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_all(writes: Sequence[tuple[Path | str, Callable[[Path], None]]]) -> None:
    """Write several files so that none is replaced before all are complete.

    Each ``write(tmp)`` fills a temporary file next to its destination; only when every one has
    been written and fsync-ed are they moved into place (``os.replace``, in the given order).

    Args:
        writes: ``(destination, write)`` pairs; ``write`` receives the temporary path to fill (it
            exists and is empty; ``write`` may replace it, e.g. with a hard link).

    Raises:
        Whatever a ``write`` raises; the destinations are then unchanged and the temporary files
        removed.
    """
    pairs = [(Path(path), write) for path, write in writes]
    staged: list[tuple[Path, Path]] = []
    try:
        for path, write in pairs:
            staged.append((_stage(path, write), path))
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for folder in {path.parent for path, _ in pairs}:
        _fsync_dir(folder)


def atomic_write(path: Path | str, write: Callable[[Path], None]) -> Path:
    """Write a file atomically: ``write(tmp)`` fills a temporary file in the same folder, which is
    fsync-ed and moved onto ``path`` with ``os.replace``.

    Args:
        path: the destination; its folder is created when missing.
        write: a function that writes the whole content to the path it receives.

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        Whatever ``write`` raises; ``path`` is then unchanged and the temporary file removed.
    """
    path = Path(path)
    atomic_write_all([(path, write)])
    return path


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """:func:`atomic_write` of ``data``; returns ``path`` as a :class:`Path`."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path | str, text: str, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write` of ``text`` encoded with ``encoding``; returns ``path`` as a :class:`Path`."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding=encoding))


# ----------------------------------------------------------------------------- safetensors


def weights_for_safetensors(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Make a state dict acceptable to safetensors: detached, contiguous, no shared storage.

    Tensors are not copied unless needed: a tensor is cloned when its storage already appeared
    under an earlier name (tied weights, views of one buffer) or made contiguous when it is not.

    Args:
        state: name -> tensor (e.g. ``model.state_dict()``), any devices and dtypes.

    Returns:
        A new dict with the same names and values.

    Raises:
        TypeError: when a value is not a tensor (the message names the key).
    """
    out: dict[str, Tensor] = {}
    seen: set[tuple[str, int]] = set()
    for name, t in state.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"model state {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach()
        key = (str(t.device), t.untyped_storage().data_ptr())
        if key in seen:
            t = t.clone(memory_format=torch.contiguous_format)
        else:
            t = t.contiguous()
        seen.add((str(t.device), t.untyped_storage().data_ptr()))
        out[name] = t
    return out


def safetensors_writer(tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> Callable[[Path], None]:
    """A ``write`` function for :func:`atomic_write` that saves already prepared ``tensors``
    (see :func:`weights_for_safetensors`) with the string header ``metadata``."""
    return lambda tmp: save_file(tensors, str(tmp), metadata=metadata)


def write_safetensors(path: Path | str, state: dict[str, Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Write ``state`` atomically as a safetensors file (see :func:`weights_for_safetensors`).

    Args:
        path: the ``.safetensors`` file to write.
        state: name -> tensor.
        metadata: optional string -> string header entries.

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        TypeError: when a value is not a tensor.
    """
    return atomic_write(path, safetensors_writer(weights_for_safetensors(state), metadata))


def read_safetensors(path: Path | str, device: str | torch.device = "cpu") -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read every tensor and the header metadata of a safetensors file.

    Args:
        path: the ``.safetensors`` file.
        device: where to put the tensors.

    Returns:
        ``(tensors, metadata)``: name -> tensor, and the header's string -> string entries
        (empty when the file has none).

    Raises:
        FileNotFoundError: when ``path`` is not a file.
        SafetensorsReadError: when the file cannot be parsed (``"cannot read {path}: {reason}"``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file {path}")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types without the file name
        raise SafetensorsReadError(f"cannot read {path}: {type(e).__name__}: {e}") from e


# ----------------------------------------------------------------------------- one writer per folder

LOCK_NAME = ".lock"
"""The lock file of a run folder (see :class:`FolderLock`)."""


class FolderLocked(RuntimeError):
    """Another live process holds the folder's lock (the message names the folder and the holder)."""

    run_folder_untouched = True  # nothing was written by the process that got this error


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process (it has not written its name yet)"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, running since {info.get('started', '?')}"


class FolderLock:
    """An exclusive lock on a folder: one writer per run folder.

    ``fcntl.flock`` on ``<folder>/.lock``: the operating system releases it when the holding process
    ends in any way (kill -9 included), so no stale lock is ever left to clean by hand. The holder
    writes its host, pid and start time into the file; a second process that finds the folder
    locked raises :class:`FolderLocked` naming them, having written nothing (it opens an existing
    lock file without changing it).

    Args:
        folder: the run folder (created when absent).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise :class:`FolderLocked` at once (never waits)."""
        existed = self.path.exists()
        if not existed:
            self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise FolderLocked(_locked_message(self.folder)) from None
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the lock go (the lock file stays; it means nothing without a holder)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_unlocked(folder: str | os.PathLike) -> None:
    """Raise :class:`FolderLocked` (naming the holder) when another live process holds ``folder``'s
    lock; writes nothing."""
    if folder_locked_by_other(folder):
        raise FolderLocked(_locked_message(Path(folder)))


def _locked_message(folder: Path) -> str:
    return (
        f"{folder} is in use by {_holder(folder / LOCK_NAME)}: one process writes a run folder at a time. "
        "Wait for it to finish (or stop it), or give this run another folder (hydra.run.dir=...)"
    )


def folder_locked_by_other(folder: str | os.PathLike) -> bool:
    """Whether another live process holds ``folder``'s lock (probes without writing anything)."""
    path = Path(folder) / LOCK_NAME
    if not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
