"""Reading one-sentence-per-line text files, plain or gzip (detected by its magic bytes, not the
name), as a stream of line blocks of about a megabyte. Errors name the file and the 1-based line.

Line rules: only the terminator (``\n`` or ``\r\n``) is removed, other whitespace is kept, a
leading UTF-8 byte-order mark is dropped, and a final line without a terminator counts."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from transformer.data.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
BLOCK_BYTES = 1 << 20
"""Bytes read at a time (a block is then extended to the end of its last line)."""


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """A binary file object for ``path``, a :class:`gzip.GzipFile` when its content is gzip.

    Raises:
        DataError: the file is missing, or named ``.gz`` without being gzip.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError as e:
        raise DataError(f"file not found: {path}") from e
    head = f.read(2)
    f.seek(0)
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if path.name.endswith(".gz"):
        f.close()
        raise DataError(
            f"{path}: the name ends in .gz but the file is not gzip-compressed (it starts with "
            f"{head!r}, not the gzip magic bytes 1f 8b); compress it with gzip or remove the .gz suffix"
        )
    return f


def _decode(path: Path, data: bytes, lines_before: int, first: bool) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}: invalid UTF-8 on line {line} (byte {col} of the line: {e.reason})") from e
    if first and text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines[-1] == "":  # the block ends with a terminator
        lines.pop()
    if "\r" in text:
        lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    return lines


def iter_line_blocks(path: str | os.PathLike, block_bytes: int = BLOCK_BYTES) -> Iterator[list[str]]:
    """Stream a UTF-8 text file (plain or gzip) as lists of consecutive lines, one block in memory.

    Raises:
        DataError: a missing file, a ``.gz`` name on a file that is not gzip, a damaged gzip stream or
            invalid UTF-8 (file and line named).
    """
    path = Path(path)
    lines_before = 0
    first = True
    rest = b""
    with open_binary(path) as f:
        while True:
            try:
                block = f.read(block_bytes)
            except (OSError, EOFError, zlib.error) as e:
                raise DataError(f"{path}: damaged gzip file after line {lines_before} ({e})") from e
            if not block:
                break
            data = rest + block
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            data, rest = data[: cut + 1], data[cut + 1 :]
            lines = _decode(path, data, lines_before, first)
            first = False
            lines_before += len(lines)
            yield lines
    if rest:
        yield _decode(path, rest, lines_before, first)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a whole (small) UTF-8 text file, plain or gzip.

    Raises:
        DataError: as :func:`iter_line_blocks`.
    """
    return [line for block in iter_line_blocks(path) for line in block]


def count_lines(path: str | os.PathLike) -> int:
    """Number of lines of a file as :func:`read_lines` counts them (streamed).

    Raises:
        DataError: as :func:`iter_line_blocks`.
    """
    return sum(len(block) for block in iter_line_blocks(path))


def _lines(path: Path) -> Iterator[str]:
    for block in iter_line_blocks(path):
        yield from block


@dataclass
class ParallelChunk:
    """Consecutive pairs of two line-aligned files.

    Attributes:
        src, tgt: the kept lines (unchanged).
        first_line: 1-based line number of the chunk's first line.
        n_read: lines read (kept + dropped).
        n_dropped: pairs dropped because a side is empty or whitespace only.
    """

    src: list[str]
    tgt: list[str]
    first_line: int
    n_read: int
    n_dropped: int


def iter_parallel(
    src_path: str | os.PathLike,
    tgt_path: str | os.PathLike,
    chunk_lines: int = 20_000,
    *,
    drop_empty: bool = True,
) -> Iterator[ParallelChunk]:
    """Stream two line-aligned files (plain or gzip) in :class:`ParallelChunk` of ``chunk_lines`` pairs.

    ``drop_empty`` drops pairs with an empty or whitespace-only side; False keeps every line (evaluation
    sets stay aligned with their files).

    Raises:
        DataError: different line counts (both files and counts named, when the shorter ends), or an
            unreadable file.
    """
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src_it, tgt_it = _lines(src_path), _lines(tgt_path)
    line = 0
    while True:
        s_chunk: list[str] = []
        t_chunk: list[str] = []
        first, dropped = line + 1, 0
        for s in src_it:
            t = next(tgt_it, None)
            if t is None:
                n_src = line + 1 + sum(1 for _ in src_it)
                raise DataError(
                    f"parallel files have different line counts: {src_path} has {n_src} lines, "
                    f"{tgt_path} has {line} lines"
                )
            line += 1
            if drop_empty and not (s.strip() and t.strip()):
                dropped += 1
            else:
                s_chunk.append(s)
                t_chunk.append(t)
            if line - first + 1 >= chunk_lines:
                break
        else:  # the source file ended
            n_tgt = sum(1 for _ in tgt_it)
            if n_tgt:
                raise DataError(
                    f"parallel files have different line counts: {src_path} has {line} lines, "
                    f"{tgt_path} has {line + n_tgt} lines"
                )
            if line - first + 1 > 0:
                yield ParallelChunk(s_chunk, t_chunk, first, line - first + 1, dropped)
            return
        yield ParallelChunk(s_chunk, t_chunk, first, line - first + 1, dropped)


def read_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike, *, keep_empty: bool = False
) -> tuple[list[str], list[str], int]:
    """``(src_lines, tgt_lines, n_dropped)`` of two line-aligned files, pairs with an empty side
    dropped unless ``keep_empty`` (evaluation splits, which must stay line-aligned).

    Raises:
        DataError: different line counts, or an unreadable file.
    """
    src, tgt, dropped = [], [], 0
    for chunk in iter_parallel(src_path, tgt_path, chunk_lines=1 << 30, drop_empty=not keep_empty):
        src, tgt, dropped = chunk.src, chunk.tgt, chunk.n_dropped
    return src, tgt, dropped


def read_bytes(path: str | os.PathLike) -> bytes:
    """The content of a file, decompressed when it is gzip.

    Raises:
        DataError: missing, damaged gzip, or named ``.gz`` without being gzip.
    """
    out = io.BytesIO()
    with open_binary(path) as f:
        try:
            while block := f.read(BLOCK_BYTES):
                out.write(block)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: damaged gzip file ({e})") from e
    return out.getvalue()


__all__ = [
    "BLOCK_BYTES",
    "GZIP_MAGIC",
    "ParallelChunk",
    "count_lines",
    "iter_line_blocks",
    "iter_parallel",
    "open_binary",
    "read_bytes",
    "read_lines",
    "read_parallel",
]
