"""Say when numba's on-disk kernel cache is cold, before the compile starts.

Every kernel is ``cache=True``: the first run on a machine compiles them
(tens of seconds on two cores), later runs load them. Without a word the
first epoch looks hung, so entry points call :func:`note_if_cold` first.
"""
from __future__ import annotations

import importlib
import os

from .storage.notes import note


def kernels_cached(module: str) -> bool | None:
    """Whether any cached kernel of ``module`` has an index file on disk (None: unknown)."""
    try:
        import numba

        mod = importlib.import_module(module)
        seen = False
        for obj in vars(mod).values():
            if isinstance(obj, numba.core.registry.CPUDispatcher) and obj._cache is not None:
                seen = True
                if os.path.exists(obj._cache._cache_file._index_path):
                    return True
        return False if seen else None
    except Exception:  # noqa: BLE001 - numba internals: no note rather than a failure
        return None


def note_if_cold(modules: tuple[str, ...], what: str = "the kernels") -> bool:
    """One note when none of ``modules`` has a cached kernel yet; returns whether it was cold."""
    cold = all(kernels_cached(m) is False for m in modules)
    if cold:
        note(f"first run on this machine: compiling {what} (once, 10-60 s; numba caches them "
             f"on disk for later runs)", key="jit-cold")
    return cold
