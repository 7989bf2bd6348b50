"""Parallel numba kernels launched from several threads at once, on any threading layer.

ooc launches parallel kernels from more than one thread: the gather thread copies rows
through the feature cache (``nogil`` kernels) while the inspector samples the next
superbatch, and ``NodeLoader(num_workers=...)`` samples on several threads. numba runs a
parallel kernel on its threading layer: ``tbb`` and ``omp`` (the system's libgomp) take
launches from several threads at once; ``workqueue``, numba's fallback where neither
library is installed (``python:*-slim`` images have no libgomp), aborts the process on
such a launch ("The workqueue threading layer is not threadsafe ..."). Each of ooc's
``parallel=True`` kernels is a :class:`ParallelKernel`: on a thread-safe layer a call
goes straight to the numba dispatcher; on another, calls take one process-wide lock, so
launches run one at a time (each still on every thread of the layer), and a note says
how to get the fast layer: a launch on ``workqueue`` also costs far more than on omp
(a training epoch of ``python -m bench modes``' dataset takes several times as long).

This module imports nothing of ooc: kernel modules of every package use it.
"""
from __future__ import annotations

import threading
from typing import Any

from ooc.core.notes import note

#: numba threading layers that take parallel launches from several threads at once
THREAD_SAFE_LAYERS = ("omp", "tbb")

_LAUNCH_LOCK = threading.Lock()
_thread_safe: bool | None = None


def layer_is_thread_safe() -> bool:
    """Whether numba's threading layer (chosen on the first call: numba starts its
    threads then, as it does on a first parallel launch) is in :data:`THREAD_SAFE_LAYERS`."""
    global _thread_safe
    if _thread_safe is None:
        import numba
        from numba.np.ufunc import parallel

        parallel._launch_threads()  # idempotent, under numba's own lock
        layer = numba.threading_layer()
        _thread_safe = layer in THREAD_SAFE_LAYERS
        if not _thread_safe:
            note(f"numba's threading layer is {layer!r}, not omp or tbb (numba found "
                 f"neither libgomp nor tbb, or NUMBA_THREADING_LAYER chose it): ooc runs "
                 f"its parallel kernels one at a time and each launch is slow; install the "
                 f"OpenMP runtime (Debian/Ubuntu: apt-get install libgomp1) for the fast path")
    return _thread_safe


class ParallelKernel:
    """A ``parallel=True`` numba dispatcher whose calls serialise where the threading
    layer is not thread-safe. Attributes (``signatures``, ``py_func``, ...) are the
    dispatcher's; :attr:`dispatcher` is the dispatcher itself."""

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        self.__doc__ = dispatcher.__doc__
        self.__name__ = dispatcher.__name__
        self.__wrapped__ = dispatcher.py_func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _thread_safe or layer_is_thread_safe():
            return self.dispatcher(*args, **kwargs)
        with _LAUNCH_LOCK:
            return self.dispatcher(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "dispatcher":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __repr__(self) -> str:
        return f"ParallelKernel({self.dispatcher!r})"


def parallel_kernel(dispatcher: Any) -> ParallelKernel:
    """Decorator over ``numba.njit(parallel=True, ...)``: see :class:`ParallelKernel`."""
    if not dispatcher.targetoptions.get("parallel"):
        raise TypeError(f"{dispatcher.__name__} is not a parallel=True kernel")
    return ParallelKernel(dispatcher)


def dispatcher_of(obj: Any) -> Any:
    """The numba dispatcher ``obj`` is or wraps (``obj`` itself when it is neither)."""
    return obj.dispatcher if isinstance(obj, ParallelKernel) else obj
