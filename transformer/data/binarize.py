"""Binarized splits: flat token arrays plus offsets on disk, read back memory-mapped (fairseq's
``.bin``/``.idx``, Ott et al. 2019). The folder layout and why: docs/design.md#binarized-splits."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from transformer.data.errors import DataError
from transformer.data.reading import ParallelChunk, iter_parallel

FORMAT = "transformer-zoo/binarized-split"
VERSION = 1
CHUNK_LINES = 50_000
"""Pairs per encoding task (a worker's unit of work)."""

SIDES = ("src", "tgt")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` for a vocabulary of up to 65,536 pieces (specials included), else ``int32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


class TokenSequences(Sequence[list[int]]):
    """Read-only sequence of id lists over a flat token array and its offsets.

    ``seqs[i]`` is a small ``list[int]`` copy, :attr:`lengths` a numpy array, and :meth:`write_rows`
    copies many sequences into a padded array at once.

    Args:
        tokens: ``(n_tokens,)`` flat ids (usually a read-only memory map).
        offsets: ``(n + 1,)`` int64; sequence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.
        rows: optional ``(m,)`` row numbers selecting (and ordering) a subset.
    """

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, rows: np.ndarray | None = None) -> None:
        self.tokens, self.offsets, self.rows = tokens, offsets, rows
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        """Number of sequences."""
        return len(self.rows) if self.rows is not None else len(self.offsets) - 1

    def __getitem__(self, i: int | slice) -> Any:
        """Ids of sequence ``i``; a slice gives a list of id lists.

        Raises:
            IndexError: ``i`` out of range.
        """
        n = len(self)
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(n))]
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for {n} sequences")
        r = int(self.rows[i]) if self.rows is not None else i
        return self.tokens[self.offsets[r] : self.offsets[r + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        """Every sequence in order."""
        for i in range(len(self)):
            yield self[i]

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> TokenSequences:
        """``n`` id lists flattened into new int64 tokens and offsets."""
        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(offsets[-1]))
        return cls(tokens, offsets)

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` int64 length of each sequence (computed once)."""
        if self._lengths is None:
            if self.rows is None:
                self._lengths = np.diff(self.offsets)
            else:  # only the rows' offsets: a batch's subset reads a few, not the whole index
                self._lengths = self.offsets[self.rows + 1] - self.offsets[self.rows]
        return self._lengths

    def write_rows(self, out: np.ndarray, columns: int | np.ndarray = 0) -> None:
        """Copy sequence ``r`` into ``out[r, columns[r] : columns[r] + lengths[r]]`` for every ``r`` at
        once, without a Python loop; the padding is left to the caller.

        Args:
            out: ``(len(self), width)`` array (e.g. a numpy view of a tensor).
            columns: where each row's sequence starts: one column for all, or ``(n,)``.

        Raises:
            ValueError: ``out`` is not ``(len(self), width)``, or a sequence does not fit its row.
        """
        n = len(self)
        if out.ndim != 2 or out.shape[0] != n:
            raise ValueError(f"out of shape {tuple(out.shape)} for {n} sequences: expected ({n}, width)")
        lengths = self.lengths
        columns = np.asarray(columns, dtype=np.int64).reshape(-1, 1)  # (1, 1) or (n, 1)
        if n == 0 or not len(self.tokens):
            return
        first, last = int(columns.min()), int((lengths[:, None] + columns).max())
        if first < 0 or last > out.shape[1]:
            raise ValueError(f"sequences up to column {last} do not fit a width of {out.shape[1]}")
        starts = self.offsets[self.rows] if self.rows is not None else self.offsets[:-1]
        within = np.arange(first, last) - columns  # (n, w) or (1, w): position in the row's sequence
        # one comparison: a negative position, read as unsigned, is past every length
        inside = within.view(np.uint64) < lengths[:, None].view(np.uint64)  # (n, w)
        # outside a sequence the looked-up position may leave the array: clipped, and not written
        flat = np.take(self.tokens, starts[:, None] + within, mode="clip")
        np.copyto(out[:, first:last], flat, where=inside)

    def subset(self, indices: Sequence[int] | np.ndarray) -> TokenSequences:
        """A view of the sequences ``indices`` (in that order, negative ones from the end); tokens are shared.

        Raises:
            IndexError: an index out of range.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"indices from {int(idx.min())} to {int(idx.max())} out of range for {n} sequences")
        if len(idx) and int(idx.min()) < 0:  # counted from the end, as seqs[i] counts them
            idx = np.where(idx < 0, idx + n, idx)
        return TokenSequences(self.tokens, self.offsets, self.rows[idx] if self.rows is not None else idx)

    def tolist(self) -> list[list[int]]:
        """Every sequence as a list of ints (materialises everything: small splits only)."""
        return list(self)


# ----------------------------------------------------------------------------- encoding

_WORKER: dict[str, Any] = {}


def _init_worker(src_proto: bytes, tgt_proto: bytes, dtypes: tuple[str, str]) -> None:
    src = spm.SentencePieceProcessor(model_proto=src_proto)
    tgt = src if tgt_proto == src_proto else spm.SentencePieceProcessor(model_proto=tgt_proto)
    _WORKER.update(procs=(src, tgt), dtypes=tuple(np.dtype(d) for d in dtypes))


def _to_arrays(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def _encode_chunk(src: list[str], tgt: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Worker task: encode one chunk with the worker's processors -> ``[(flat, lengths)] * 2``."""
    procs, dtypes = _WORKER["procs"], _WORKER["dtypes"]
    return [
        _to_arrays(sp.encode(lines, out_type=int, num_threads=1), dt)
        for sp, lines, dt in zip(procs, (src, tgt), dtypes)
    ]


def _encoded_chunks(
    chunks: Iterator[ParallelChunk], tokenizers: Sequence[Any], dtypes: Sequence[np.dtype], workers: int
) -> Iterator[tuple[ParallelChunk, list[tuple[np.ndarray, np.ndarray]]]]:
    """Encode chunks in order: in this process for a single chunk or ``workers <= 1``, else in a
    pool of ``workers`` spawned processes with at most ``2 * workers`` chunks in flight."""
    first = next(chunks, None)
    if first is None:
        return
    second = next(chunks, None)
    if second is None or workers <= 1:
        for chunk in itertools.chain([first], [second] if second else [], chunks):
            yield (
                chunk,
                [
                    _to_arrays(tok.encode_batch(lines), dt)
                    for tok, lines, dt in zip(tokenizers, (chunk.src, chunk.tgt), dtypes)
                ],
            )
        return
    protos = (tokenizers[0]._proto, tokenizers[1]._proto)
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(*protos, tuple(d.str for d in dtypes)),
    )
    try:
        pending: collections.deque = collections.deque()
        for chunk in itertools.chain([first, second], chunks):
            pending.append((chunk, pool.submit(_encode_chunk, chunk.src, chunk.tgt)))
            if len(pending) >= 2 * workers:
                done, fut = pending.popleft()
                yield done, fut.result()
        while pending:
            done, fut = pending.popleft()
            yield done, fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- writing


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def binarize_split(
    src_path: str | os.PathLike,
    tgt_path: str | os.PathLike,
    tokenizers: Sequence[Any],
    dest: str | os.PathLike,
    *,
    keep_text: bool,
    drop_empty: bool = True,
    workers: int = 1,
    chunk_lines: int | None = None,
    inputs: list[dict[str, Any]] | None = None,
    options: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Encode a pair of line-aligned files (plain or gzip) into the split folder ``dest``, atomically.

    The files are streamed in chunks of ``chunk_lines`` pairs (default :data:`CHUNK_LINES`), encoded in
    ``workers`` processes, and written to a temporary folder renamed to ``dest`` once the manifest is
    written.

    Args:
        tokenizers: ``(src, tgt)`` tokenizers (the same object twice for a joint vocabulary).
        keep_text: also store the original lines.
        inputs, options: recorded in the manifest.

    Returns:
        The manifest (also in ``dest/manifest.json``).

    Raises:
        DataError: different line counts, invalid UTF-8 (file and line named) or an unreadable file;
            nothing is left behind.
    """
    t0 = time.perf_counter()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dtypes = [token_dtype(len(tok)) for tok in tokenizers]
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        bins = [open(tmp / f"{side}.bin", "wb") for side in SIDES]
        texts = [open(tmp / f"{side}.txt", "w", encoding="utf-8", newline="\n") for side in SIDES] if keep_text else []
        lengths: list[list[np.ndarray]] = [[], []]
        lines_read = dropped = 0
        try:
            chunks = iter_parallel(src_path, tgt_path, chunk_lines or CHUNK_LINES, drop_empty=drop_empty)
            for chunk, encoded in _encoded_chunks(chunks, tokenizers, dtypes, workers):
                lines_read += chunk.n_read
                dropped += chunk.n_dropped
                for k, (flat, lens) in enumerate(encoded):
                    bins[k].write(memoryview(flat))
                    lengths[k].append(lens)
                for f, lines in zip(texts, (chunk.src, chunk.tgt)):
                    f.write("".join(line + "\n" for line in lines))
            for f in bins + texts:
                f.flush()
                os.fsync(f.fileno())
        finally:
            for f in bins + texts:
                f.close()
        files: dict[str, Any] = {}
        counts: dict[str, Any] = {"lines": lines_read, "pairs": lines_read - dropped}
        for k, side in enumerate(SIDES):
            lens = np.concatenate(lengths[k]) if lengths[k] else np.zeros(0, np.int64)
            offsets = np.zeros(len(lens) + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            with open(tmp / f"{side}.idx.npy", "wb") as f:
                np.save(f, offsets)
                f.flush()
                os.fsync(f.fileno())
            counts[f"{side}_tokens"] = int(offsets[-1])
            counts[f"{side}_max_len"] = int(lens.max()) if len(lens) else 0
            files[f"{side}.bin"] = {"dtype": dtypes[k].str, "count": int(offsets[-1])}
            files[f"{side}.idx.npy"] = {"dtype": "<i8", "count": len(offsets)}
            if keep_text:
                files[f"{side}.txt"] = {}
        for name, meta in files.items():
            meta["bytes"] = (tmp / name).stat().st_size
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "inputs": inputs or [{"path": str(src_path)}, {"path": str(tgt_path)}],
            "options": {**(options or {}), "keep_text": keep_text, "drop_empty": drop_empty},
            "vocab_size": {side: len(tok) for side, tok in zip(SIDES, tokenizers)},
            "counts": counts,
            "dropped": {"empty_side": dropped},
            "files": files,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        _fsync_write(tmp / "manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private; readable like any other folder
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log:
        log(
            f"[data] binarized {src_path} + {tgt_path}: {counts['pairs']} pairs ({dropped} dropped), "
            f"{counts['src_tokens']}+{counts['tgt_tokens']} tokens in {manifest['seconds']:.1f}s -> {dest}"
        )
    return manifest


# ----------------------------------------------------------------------------- reading


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a complete split folder, or None when it is missing, incomplete or damaged."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        return None
    for name, meta in manifest.get("files", {}).items():
        try:
            if (folder / name).stat().st_size != meta["bytes"]:
                return None
        except OSError:
            return None
    return manifest


def _map(path: Path, dtype: str, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,)).view(np.ndarray)


def _read_text(path: Path, n: int) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")
    lines.pop()  # every line ends with "\n"
    if len(lines) != n:
        raise DataError(f"{path}: {len(lines)} lines, the manifest says {n}; delete {path.parent} to rebuild it")
    return lines


def load_split(folder: str | os.PathLike) -> tuple[list[TokenSequences], list[list[str]] | None, dict[str, Any]]:
    """Map a split folder written by :func:`binarize_split`.

    Returns:
        ``([src, tgt], texts, manifest)``: :class:`TokenSequences` over read-only memory maps, the
        original ``[src_lines, tgt_lines]`` (None when not stored), and the manifest.

    Raises:
        DataError: the folder is missing, incomplete or damaged.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise DataError(
            f"{folder} is not a complete binarized split (missing or damaged manifest.json or files); "
            "run scripts/preprocess.py again (or delete the folder) to rebuild it"
        )
    files = manifest["files"]
    seqs = []
    for side in SIDES:
        b, idx = files[f"{side}.bin"], files[f"{side}.idx.npy"]
        offsets = np.load(folder / f"{side}.idx.npy", mmap_mode="r")
        tokens = _map(folder / f"{side}.bin", b["dtype"], int(b["count"]))
        seqs.append(TokenSequences(tokens, np.asarray(offsets).view(np.ndarray)))
        if len(offsets) != idx["count"]:
            raise DataError(f"{folder / (side + '.idx.npy')}: damaged index; delete {folder} to rebuild it")
    n = manifest["counts"]["pairs"]
    texts = [_read_text(folder / f"{side}.txt", n) for side in SIDES] if manifest["options"]["keep_text"] else None
    return seqs, texts, manifest


__all__ = [
    "CHUNK_LINES",
    "FORMAT",
    "TokenSequences",
    "VERSION",
    "binarize_split",
    "load_split",
    "read_manifest",
    "token_dtype",
]
