"""The background batch prefetcher: order, errors, stopping, its thread's device, and train.prefetch's values."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from transformer.data.prefetch import AUTO_PREFETCH, Prefetcher, resolve_prefetch


def _slow_count(n: int, made: list[int]):
    for i in range(n):
        made.append(i)
        yield i


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_items_come_in_order_and_at_most_depth_ahead(depth):
    made: list[int] = []
    with Prefetcher(_slow_count(20, made), depth) as ahead:
        first = next(ahead)
        time.sleep(0.2)  # the thread fills its queue meanwhile
        assert first == 0 and len(made) <= 1 + depth + 1  # the queue, and the item it is waiting to put
        assert [first, *ahead] == list(range(20))
    assert (depth == 0) == (ahead._thread is None)


def test_an_error_in_the_thread_is_raised_in_order():
    def broken():
        yield 1
        yield 2
        raise ValueError("bad line 7 of train.de")

    ahead = Prefetcher(broken(), 2)
    assert next(ahead) == 1 and next(ahead) == 2
    with pytest.raises(ValueError, match="bad line 7"):
        next(ahead)


def test_close_stops_the_thread_of_an_endless_source():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    ahead = Prefetcher(endless(), 2)
    assert next(ahead) == 0
    ahead.close()
    assert not ahead._thread.is_alive()
    assert "batch-prefetch" not in [t.name for t in threading.enumerate()]


def test_the_thread_makes_a_cuda_device_its_current_one(monkeypatch):
    """On CUDA the thread calls ``torch.cuda.set_device`` before it makes any item (a new thread's
    current device is GPU 0); without an index, the caller's current device. Nothing is set for
    the CPU, for no device, or without a thread."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((d, threading.current_thread().name)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)

    def source():
        yield len(calls)  # what was set when the first item was made

    for device, expected in (
        (torch.device("cuda", 1), [(1, "batch-prefetch")]),
        ("cuda:3", [(3, "batch-prefetch")]),
        ("cuda", [(2, "batch-prefetch")]),
        (torch.device("cpu"), []),
        (None, []),
    ):
        calls.clear()
        with Prefetcher(source(), 2, device=device) as ahead:
            assert list(ahead) == [len(expected)] and calls == expected, device
    calls.clear()
    assert list(Prefetcher(source(), 0, device="cuda:1")) == [0] and calls == []


def test_resolve_prefetch():
    assert resolve_prefetch("auto", "cpu") == AUTO_PREFETCH["cpu"]
    assert resolve_prefetch("auto", "cuda") == AUTO_PREFETCH["cuda"]
    assert resolve_prefetch(0, "cuda") == 0 and resolve_prefetch(5, "cpu") == 5
    for bad in (-1, "two", True):
        with pytest.raises(ValueError, match="train.prefetch"):
            resolve_prefetch(bad, "cpu")
