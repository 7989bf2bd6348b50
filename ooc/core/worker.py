"""One background stage: a thread that produces items, and the iterator that consumes them.

Every background thread of ooc's data path is a :class:`Worker`: the loader's
gather threads (:mod:`ooc.executor.loader.pipelines`) and the inspector's
sampling and changeset threads (:mod:`ooc.sampling.pipeline`), chained one
into the next. A stage halts when its consumer stops (closing the iterator
or :meth:`Worker.halt`), and halting a stage halts the stage it consumes.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generator

_END = object()

#: ``produce(put, stopped)``: calls ``put(item)`` for each item (False once halted: stop
#: then) and may poll ``stopped()`` between steps.
Produce = Callable[[Callable[[Any], bool], Callable[[], bool]], None]


class Worker:
    """Runs ``produce(put, stopped)`` on a thread; iterating yields what it put, in order.

    Args:
        produce: the stage's work (see :data:`Produce`).
        depth: items queued ahead of the consumer (at least 1).
        name: the thread's name (``ooc-...``).
        upstream: the worker this one consumes, halted with it.

    Exceptions on the thread are re-raised in the consumer. Closing the
    iterator early, or :meth:`halt` from any thread, stops the thread
    (``stopped()`` turns true, ``put`` returns False) and waits for it; a
    consumer whose worker was halted sees the iteration end.
    """

    def __init__(self, produce: Produce, depth: int, name: str,
                 upstream: "Worker | None" = None):
        self.q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.produce = produce
        self.name = name
        self.upstream = upstream
        self.thread: threading.Thread | None = None

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def halt(self) -> None:
        """Stop the thread (and the upstream's) and wait for them to end; each ends after
        its current step. Items still queued are dropped."""
        self.stop.set()
        if self.upstream is not None:
            self.upstream.stop.set()  # a thread waiting on the upstream's items sees it
        t = self.thread
        while t is not None and t.is_alive():
            try:
                self.q.get_nowait()  # a put waiting for room sees the stop
            except queue.Empty:
                pass
            t.join(timeout=0.05)
        if self.upstream is not None:
            self.upstream.halt()

    def start(self) -> "Worker":
        """Start the thread (once); iterating starts it too."""
        if self.thread is not None:
            return self

        def run() -> None:
            try:
                self.produce(self.put, self.stop.is_set)
                self.put(_END)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                self.put(e)

        self.thread = threading.Thread(target=run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def __iter__(self) -> Generator[Any, None, None]:
        self.start()
        try:
            while True:
                try:
                    item = self.q.get(timeout=0.1)
                except queue.Empty:
                    if self.stop.is_set():  # halted: nothing more comes
                        return
                    continue
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                # handed over without a reference kept here while the caller holds it: an
                # item the caller drops (a superbatch's samples) is freed at once
                box = [item]
                del item
                yield box.pop()
        finally:
            self.halt()
