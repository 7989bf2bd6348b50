"""Measuring this process's memory (imports nothing of ooc; any stage may use it).

Peak RSS is read from ``VmHWM`` in ``/proc/self/status``: it belongs to the
current address space, starts afresh at ``exec`` and can be reset with
``/proc/self/clear_refs`` (so a stage's own peak can be measured).
``ru_maxrss`` cannot be reset and a child started by a large parent reports the
parent's peak; it is only the fallback off Linux.
"""
from __future__ import annotations

import resource


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size since start or the last :func:`reset_peak_rss`, bytes."""
    v = _status_bytes("VmHWM")
    return v if v is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Resident set size now, bytes."""
    v = _status_bytes("VmRSS")
    return v if v is not None else peak_rss_bytes()


def anon_rss_bytes() -> int:
    """Anonymous resident memory (RssAnon): RSS without mapped file pages, bytes."""
    return _status_bytes("RssAnon") or 0


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark to the current RSS; False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


#: Allocations from this size up get their own ``mmap`` and go back to the OS when
#: freed (see :func:`tune_malloc`).
MMAP_THRESHOLD = 256 << 10


def tune_malloc(arenas: int = 2, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Make glibc's malloc hand memory back instead of keeping it resident.

    * ``M_ARENA_MAX = arenas``: memory freed by one of the pipeline's threads
      is reused by the others instead of staying in a per-thread arena.
    * ``M_MMAP_THRESHOLD = mmap_threshold``: by default glibc raises the
      threshold to the size of the largest block it has freed (up to 32 MiB),
      after which batch-sized arrays (rows, reader buffers) come from the heap
      and their memory stays resident after they are freed; a fixed threshold
      keeps every such array in its own mapping, returned at ``free``, which lowers
      an epoch's peak RSS (``docs/benchmarks.md``, the memory budget).

    Call before threads start. Settings given in the environment
    (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``) win. False where
    unsupported (not glibc).
    """
    import ctypes
    import ctypes.util
    import os

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = True
        if "MALLOC_ARENA_MAX" not in os.environ:
            ok = bool(libc.mallopt(-8, int(arenas))) and ok  # M_ARENA_MAX
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            ok = bool(libc.mallopt(-3, int(mmap_threshold))) and ok  # M_MMAP_THRESHOLD
        return ok
    except (OSError, AttributeError):
        return False


def trim_malloc() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``), so RSS
    measures what is live; a no-op where unsupported."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
