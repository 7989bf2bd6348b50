"""``read_ahead``: the items in order, the next produced in a thread while the caller holds
the current one, errors raised in their place, and at most CHUNKS_HELD items alive."""
import threading

import pytest

from ooc.storage.read_ahead import CHUNKS_HELD, read_ahead


def test_items_in_order_each_once():
    assert list(read_ahead(iter(range(100)))) == list(range(100))
    assert list(read_ahead([])) == []


def test_the_next_item_is_produced_while_the_caller_holds_this_one():
    produced = [threading.Event() for _ in range(4)]

    def items():
        for k in range(4):
            produced[k].set()
            yield k

    for k in read_ahead(items()):
        if k + 1 < 4:  # without a thread reading ahead this would wait the full timeout
            assert produced[k + 1].wait(timeout=30), f"item {k + 1} not read ahead"


def test_an_error_producing_an_item_is_raised_in_its_place():
    def items():
        yield 1
        yield 2
        raise OSError("truncated")

    got = []
    with pytest.raises(OSError, match="truncated"):
        for k in read_ahead(items()):
            got.append(k)
    assert got == [1, 2]


def test_stopping_early_finishes_the_thread_and_closes_the_items():
    closed = threading.Event()

    def items():
        try:
            for k in range(1000):
                yield k
        finally:
            closed.set()

    for k in read_ahead(items()):
        if k == 3:
            break
    assert closed.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("ooc-read-ahead")]


def test_at_most_chunks_held_items_alive():
    alive, most = [0], [0]
    lock = threading.Lock()

    class Chunk:
        def __init__(self):
            with lock:
                alive[0] += 1
                most[0] = max(most[0], alive[0])

        def __del__(self):
            with lock:
                alive[0] -= 1

    def items():
        for _ in range(50):
            yield Chunk()

    for chunk in read_ahead(items()):  # noqa: B007 (the loop variable holds the last until rebound)
        pass
    del chunk
    assert 2 <= most[0] <= CHUNKS_HELD
    assert alive[0] == 0
