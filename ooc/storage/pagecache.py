"""Dropping files from the kernel's page cache (for cold-cache measurements)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ooc.storage.layout import PAGE

if TYPE_CHECKING:
    import mmap


def drop_page_cache(path: str | os.PathLike) -> int:
    """``posix_fadvise(DONTNEED)`` on a file, or on every file under a folder.

    Clean pages are dropped at once; returns the number of files advised
    (unreadable files are skipped).
    """
    p = Path(path)
    files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
    n = 0
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def mapping_of(arr) -> "mmap.mmap | None":
    """The ``mmap`` behind a numpy memmap (or a view of one), else None."""
    import mmap

    mm = getattr(arr, "_mmap", None)
    base = getattr(arr, "base", None)
    while mm is None and base is not None:
        mm = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
        base = getattr(base, "base", None)
    return mm


def release_mapped(arr) -> bool:
    """Drop the pages of a read-only memmap this process touched from its RSS
    (``MADV_DONTNEED``; the page cache keeps them). False when ``arr`` is not a map."""
    import mmap

    return advise(arr, mmap.MADV_DONTNEED)


def touch_pages(arr) -> None:
    """Fault in every page of the 1-D memmap ``arr``, as an epoch of scattered reads does,
    so that the RSS measured next holds it."""

    step = max(1, PAGE // arr.itemsize)
    int(arr[::step].sum())


def advise(arr, advice: int) -> bool:
    """``madvise`` the whole mapping behind a numpy memmap; False when ``arr``
    is not a map (or the kernel refuses the advice)."""
    mm = mapping_of(arr)
    if mm is None:
        return False
    try:
        mm.madvise(advice)
        return True
    except (OSError, ValueError):
        return False
