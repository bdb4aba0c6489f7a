"""Crash-safe file writing and the one safetensors reader/writer of the package.

Every file the project writes that a later run reads back (checkpoints, results, caches,
tokenizers, downloads) goes through :func:`atomic_write`: the content is written to a temporary
file in the destination's folder, flushed and ``fsync``-ed, then moved into place with
``os.replace`` (atomic on POSIX). A crash while writing leaves the previous file untouched and no
half-written file under the destination's name. :func:`atomic_write_all` does the same for several
files that belong together: all are staged completely before the first is moved into place.

Safetensors files are read with :func:`read_safetensors` (tensors and header metadata, one error
type naming the file) and written with :func:`write_safetensors` (atomic; tied or non-contiguous
tensors made acceptable by :func:`weights_for_safetensors`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

__all__ = [
    "SafetensorsReadError",
    "atomic_write",
    "atomic_write_all",
    "atomic_write_bytes",
    "atomic_write_text",
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
