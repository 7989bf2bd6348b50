"""Process-wide settings ooc's CLIs make, opt-in for a library user: :func:`configure_process`.

Nothing here runs on ``import ooc``. A script that trains with ooc on a few cores calls
``ooc.configure_process()`` first thing, before it imports torch (the OpenMP setting is read
when torch's and numba's thread pools start).
"""
from __future__ import annotations

import os
import sys

from .memory import tune_malloc

__all__ = ["configure_process"]


def configure_process(omp_passive: bool = True, malloc: bool = True) -> dict[str, object]:
    """Apply the process-wide settings ooc's own commands run with; returns what was set.

    Args:
        omp_passive: set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already sets it.
            numba's and torch's OpenMP pools busy-wait between parallel regions by default;
            interleaved (sample, then compute) on a few cores they starve each other
            (measured: forward+backward 3-4x slower on 2 cores). Effective only before torch
            and numba start their pools: ``torch_loaded`` in the result says whether torch
            was imported already.
        malloc: two malloc arenas and a fixed mmap threshold (:func:`ooc.memory.tune_malloc`),
            so batch-sized arrays go back to the OS when freed and RSS stays within a memory
            budget; also applied by a loader or trainer given a memory budget.
    """
    done: dict[str, object] = {"torch_loaded": "torch" in sys.modules}
    if omp_passive:
        done["OMP_WAIT_POLICY"] = os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if malloc:
        done["malloc_tuned"] = tune_malloc()
    return done
