"""Crash-safe file writing, the one safetensors reader/writer of the package, and the run folder's lock.

:func:`atomic_write` writes to an fsync-ed temporary file next to the destination, then
``os.replace`` moves it into place (atomic on POSIX): a crash leaves the previous file or nothing,
never half a file. :func:`atomic_write_all` stages several files completely before the first moves."""

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
    """Write several ``(destination, write)`` files so that none is replaced before all are complete.

    ``write`` receives an empty temporary path to fill (it may replace it, e.g. with a hard link).
    Whatever a ``write`` raises leaves the destinations unchanged and no temporary file."""
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
    """Write ``path`` atomically (its folder created when missing) with ``write(tmp)``; return it.

    Whatever ``write`` raises leaves ``path`` unchanged and no temporary file."""
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
    """A new dict safetensors accepts: detached, contiguous, no shared storage (a tensor whose storage
    appeared under an earlier name, a tied weight, is cloned; nothing else is copied).

    Raises:
        TypeError: a value is not a tensor (its key named).
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
    """A ``write`` for :func:`atomic_write` saving prepared ``tensors`` with string header ``metadata``."""
    return lambda tmp: save_file(tensors, str(tmp), metadata=metadata)


def write_safetensors(path: Path | str, state: dict[str, Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Write ``state`` atomically as a safetensors file; returns ``path``.

    Raises:
        TypeError: a value is not a tensor.
    """
    return atomic_write(path, safetensors_writer(weights_for_safetensors(state), metadata))


def read_safetensors(path: Path | str, device: str | torch.device = "cpu") -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file: name -> tensor on ``device``, and the header's
    string entries.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        SafetensorsReadError: the file cannot be parsed (named).
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
    """An exclusive lock on a folder (created when absent): one writer per run folder.

    ``fcntl.flock`` on ``<folder>/.lock``, released by the OS when the holder ends in any way (kill -9
    included), so no stale lock is left. The holder writes its host, pid and start time into the file;
    another process raises :class:`FolderLocked` naming them, having written nothing."""

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
