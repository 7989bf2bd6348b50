"""The machine's side of a measurement, shared by every benchmark: the page cache (drop a
file's pages, or every page) and peak RSS. Memory cgroups are in :mod:`bench.memcg`, the
disk's fio rates in :mod:`bench.fio`."""
from __future__ import annotations

import os
import resource
from pathlib import Path

from ooc.executor.sizing import memcg
from ooc.storage.pagecache import drop_page_cache, release_mapped

__all__ = ["drop_page_cache", "drop_all_caches", "release_mapped", "peak_rss_bytes",
           "children_peak_rss_bytes"]


def drop_all_caches() -> bool:
    """Write back dirty pages and drop the whole page cache (root only); False when refused."""
    return memcg.drop_page_cache()


def drop_files(paths: list[Path] | list[str]) -> int:
    """Drop the cached pages of every file in ``paths`` (folders: every file under them);
    the number of files advised."""
    return sum(drop_page_cache(os.fspath(p)) for p in paths)


def peak_rss_bytes() -> int:
    """This process's peak resident set, bytes (``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def children_peak_rss_bytes() -> int:
    """The largest peak resident set of this process's waited-for children, bytes."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
