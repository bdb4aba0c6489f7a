"""The background batch prefetcher: order, errors, stopping, and train.prefetch's values."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_resolve_prefetch():
    assert resolve_prefetch("auto", "cpu") == AUTO_PREFETCH["cpu"]
    assert resolve_prefetch("auto", "cuda") == AUTO_PREFETCH["cuda"]
    assert resolve_prefetch(0, "cuda") == 0 and resolve_prefetch(5, "cpu") == 5
    for bad in (-1, "two", True):
        with pytest.raises(ValueError, match="train.prefetch"):
            resolve_prefetch(bad, "cpu")
