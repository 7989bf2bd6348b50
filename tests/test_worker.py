"""ooc.core.worker.Worker: a producer thread handing items to a consumer through a bounded queue."""
from __future__ import annotations

import time
import weakref

import pytest

from ooc.core.worker import Worker


class _Item:
    def __init__(self, k: int):
        self.k = k


def test_items_arrive_in_order_and_an_error_reaches_the_consumer():
    def produce(put, stopped):
        for k in range(5):
            if not put(_Item(k)):
                return
        raise ValueError("producer failed")

    got = []
    with pytest.raises(ValueError, match="producer failed"):
        for item in Worker(produce, 2, "test-order"):
            got.append(item.k)
    assert got == [0, 1, 2, 3, 4]


def test_an_item_the_consumer_drops_is_freed_before_it_asks_for_the_next():
    """Iterating keeps no reference to the item it handed over: a consumer that drops a
    large item (a superbatch's samples) frees it while the next is still being made."""
    def produce(put, stopped):
        for k in range(3):
            item = _Item(k)
            if not put(item):
                return
            del item

    it = iter(Worker(produce, 1, "test-drop"))
    first = next(it)
    assert first.k == 0
    ref = weakref.ref(first)
    del first
    deadline = time.monotonic() + 2.0  # the producer drops its own reference after put
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ref() is None
    assert [i.k for i in it] == [1, 2]
