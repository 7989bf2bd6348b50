"""Process-wide settings ooc's CLIs make, opt-in for a library user: :func:`configure_process`.

Nothing here runs on ``import ooc``. A script that trains with ooc on a few cores calls
``ooc.configure_process()`` first thing, before it imports torch (the OpenMP setting is read
when torch's and numba's thread pools start, the huge-page one at torch's first large
allocation).
"""
from __future__ import annotations

import os
import sys

from ooc.core.memory import tune_malloc

__all__ = ["configure_process", "die_with_launcher"]

#: Set by ``ooc.train --workers`` in its workers' environment: the launcher's pid.
LAUNCHER_ENV = "OOC_LAUNCHER_PID"


def die_with_launcher(pid: int) -> None:
    """End this process (SIGKILL from the kernel) when the launcher ``pid`` dies, also
    while it is still starting up; exit at once if it is gone already. Linux only (a
    no-op elsewhere)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != pid:  # the launcher died before the request was made
        os._exit(1)


def configure_process(omp_passive: bool = True, malloc: bool = True,
                      huge_pages: bool = True) -> dict[str, object]:
    """Apply the process-wide settings ooc's own commands run with; returns what was set.

    Args:
        omp_passive: set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already sets it.
            numba's and torch's OpenMP pools busy-wait between parallel regions by default;
            interleaved (sample, then compute) on a few cores they starve each other.
            Effective only before torch
            and numba start their pools: ``torch_loaded`` in the result says whether torch
            was imported already.
        malloc: two malloc arenas and a fixed mmap threshold (:func:`ooc.core.memory.tune_malloc`),
            so batch-sized arrays go back to the OS when freed and RSS stays within a memory
            budget; also applied by a loader or trainer given a memory budget.
        huge_pages: set ``THP_MEM_ALLOC_ENABLE=1`` unless the environment already sets it:
            torch's CPU allocator then asks the kernel for transparent huge pages for each
            allocation of 2 MiB or more (``madvise(MADV_HUGEPAGE)``; a kernel set to
            ``never`` ignores it). With the fixed mmap threshold every large tensor is a
            fresh mapping, first touched page by page; huge pages take a training step far
            fewer page faults. Effective before torch's first allocation of 2 MiB or more.
    """
    done: dict[str, object] = {"torch_loaded": "torch" in sys.modules}
    if omp_passive:
        done["OMP_WAIT_POLICY"] = os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if malloc:
        done["malloc_tuned"] = tune_malloc()
    if huge_pages:
        done["THP_MEM_ALLOC_ENABLE"] = os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return done
