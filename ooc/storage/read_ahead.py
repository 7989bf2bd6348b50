"""Pieces of an input produced one ahead, in a thread, while the caller works on the last.

Ingest alternates between reading a chunk (a ``pread``, or parsing text) and a kernel over
it; both release the GIL, so with the next chunk read in a thread the disk and the cores
work at once. Up to three chunks are alive at once (the caller's, the next, and the one
after it being read while the caller still holds its last): the callers take chunks a third
of the size they would otherwise, and their memory plans (:mod:`.ingest.limits`,
:func:`.reorder.reorder_phases`) charge :data:`CHUNKS_HELD`.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

#: Chunks alive at once in a pass that reads through :func:`read_ahead`.
CHUNKS_HELD = 3

_END = object()


def read_ahead(items: Iterable[T]) -> Iterator[T]:
    """The items of ``items`` in order, each next one produced by a thread while the
    caller works on the current one (at most :data:`CHUNKS_HELD` alive: see the module's
    note). An exception raised producing an item is raised here, in its place. The
    thread is finished, and ``items`` closed, when the caller stops early."""
    it = iter(items)
    with ThreadPoolExecutor(1, thread_name_prefix="ooc-read-ahead") as pool:
        try:
            nxt = pool.submit(next, it, _END)
            while True:
                item = nxt.result()
                if item is _END:
                    return
                nxt = pool.submit(next, it, _END)
                yield item  # type: ignore[misc]
                del item
        finally:
            # the pending read ends before its iterator is closed (a generator cannot be
            # closed while it runs in another thread)
            nxt.cancel() or nxt.exception()
            close = getattr(it, "close", None)
            if close is not None:
                close()
