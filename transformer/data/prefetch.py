"""Batches prepared ahead of the training step in a background thread (torchtitan's and fairseq's
prefetching iterators; PyTorch's ``DataLoader`` pin-memory thread).

Collating a batch is Python work on the host; an accelerator can train on the previous batch
meanwhile, but only if the host is not busy collating. :class:`Prefetcher` runs any iterator (the
trainer's: sample, collate, pin) in a daemon thread and keeps up to ``depth`` items ready in a
bounded queue, in order. An exception in the thread is raised by the ``next()`` that would have
returned its item. With ``depth=0`` the iterator runs in the caller's thread (no thread at all).
Given a CUDA device, the thread makes it its current device first, as ``DataLoader``'s pinning
thread does: a new thread's current device is GPU 0, where its CUDA work (pinning before the
rank's own GPU holds a context, an event, a stream) would otherwise go, with a context of every rank.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

import torch

__all__ = ["AUTO_PREFETCH", "Prefetcher", "resolve_prefetch"]

T = TypeVar("T")
_END = object()


class _Raised:
    """An exception of the producing thread, queued in order with the items."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[T]):
    """Iterate ``source`` up to ``depth`` items ahead, in a background thread.

    Args:
        source: the iterator to run ahead (its items are yielded in the same order).
        depth: items kept ready; 0 iterates ``source`` in the calling thread.
        device: the device the items are for; a CUDA one becomes the thread's current device
            (without an index: the caller's current device). ``None`` or another type: nothing set.

    Raises:
        ValueError: ``depth < 0``.

    Use :meth:`close` (or ``with``) to stop the thread; the items not consumed are dropped.
    """

    def __init__(self, source: Iterator[T], depth: int, device: torch.device | str | None = None) -> None:
        if depth < 0:
            raise ValueError(f"depth={depth} must be >= 0")
        self.source, self.depth = source, depth
        self._cuda_index: int | None = None
        if depth > 0 and device is not None and torch.device(device).type == "cuda":
            index = torch.device(device).index
            self._cuda_index = torch.cuda.current_device() if index is None else index
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name="batch-prefetch", daemon=True)
            self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self._cuda_index is not None:
                torch.cuda.set_device(self._cuda_index)
            for item in self.source:
                if not self._put(item):
                    return
        except BaseException as err:  # handed to the consumer, which raises it
            self._put(_Raised(err))
            return
        self._put(_END)

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._thread is None:
            return next(self.source)
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # every later next() ends too
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the background thread (it ends after the item it is preparing)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            while True:  # unblock a producer waiting on a full queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=10)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


AUTO_PREFETCH: dict[str, int] = {"cpu": 0, "cuda": 4}
"""Batches ``train.prefetch=auto`` collates ahead, by device type: on CUDA the host prepares the
next micro-batches while the device computes; on a CPU the same cores would do both (measured in
``docs/benchmarks/``). A device type not listed takes the CUDA value."""


def resolve_prefetch(value: int | str, device_type: str) -> int:
    """``train.prefetch`` as a number of batches (``auto``: :data:`AUTO_PREFETCH` for the device type).

    Raises:
        ValueError: neither ``auto`` nor an integer >= 0.
    """
    if value == "auto":
        return AUTO_PREFETCH.get(device_type, AUTO_PREFETCH["cuda"])
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"train.prefetch={value!r} must be auto or an integer >= 0")
    return value
