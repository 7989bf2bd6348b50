"""Dropping files from the kernel's page cache (for cold-cache measurements)."""
from __future__ import annotations

import os
from pathlib import Path


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
