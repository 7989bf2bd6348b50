"""Feature rows copied out of a memmap of ``features.bin`` by a pool of threads.

The ``baseline`` preset's reader (the papers' PyG+ given its best shot): the OS
page cache is the only cache, readahead is off (``MADV_RANDOM``) and ``threads``
threads (more than the cores) copy rows with a nogil numba kernel, so that many
page faults are in flight at once.
"""
from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ooc.storage import _mmap_kernels as MK
from ooc.storage.bus_guard import check_size, watch
from ooc.storage.features import Feature
from ooc.storage.layout import FeatureLayout, RowTable
from ooc.storage.pagecache import advise

#: Rows one copy task reads before it drops their pages from the process.
MMAP_CHUNK_ROWS = 32
#: The kernel's fault-around window (``fault_around_bytes``, 64 KiB by default).
FAULT_AROUND_BYTES = 64 << 10


class ThreadedMmapFeatures(RowTable, Feature):
    """Rows of ``features.bin`` copied out of a memmap by ``threads`` threads.

    ``read(ids, out=None)`` → [len(ids), dim] in the file dtype (a
    :class:`~ooc.storage.features.Feature`). ``stats()`` gives requests
    and rows; the bytes the kernel read show in the process's ``/proc/self/io``.
    """

    def __init__(self, path: str | Path, layout: FeatureLayout, threads: int = 16):
        self.path = Path(path)
        self.what = str(self.path)
        self.layout = layout
        self.threads = int(threads)
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(layout.file_bytes,))
        watch(self.path)
        advise(self.buf, mmap.MADV_RANDOM)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-mmap")
        self.requests = 0
        self.rows = 0

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        if rows is not None:  # into chosen rows: copied into rows of their own first
            out[rows] = self.read(ids)
            return
        lay = self.layout
        n = ids.shape[0]
        check_size(self.buf, self.path, lay.file_bytes)  # shrunk: an error, not SIGBUS
        offs = lay.row_offsets(ids)
        order = np.argsort(offs, kind="stable")
        ob = out.view(np.uint8).reshape(n, lay.row_bytes)
        futs = [self.pool.submit(self._copy, offs, order, ob, a, min(n, a + MMAP_CHUNK_ROWS))
                for a in range(0, n, MMAP_CHUNK_ROWS)]
        for f in futs:
            f.result()
        self.requests += 1
        self.rows += n

    def _copy(self, offs, order, ob, a: int, b: int) -> None:
        """Copy rows ``order[a:b]`` (one region of the file), then drop the region's
        pages from this process (the page cache keeps them): a fault maps the
        page-cache pages around it too (fault-around, 64 KiB), so at most
        ``threads x MMAP_CHUNK_ROWS x (row + 64 KiB)`` of the file is mapped at once
        (the bound :func:`mapped_bytes_bound` gives the memory planner)."""
        MK.copy_rows(self.buf, offs, order, self.layout.row_bytes, ob, a, b)
        w = FAULT_AROUND_BYTES
        lo = int(offs[order[a]]) // w * w
        hi = min(len(self.buf), -(-(int(offs[order[b - 1]]) + self.layout.row_bytes) // w) * w)
        # np.memmap keeps its mmap.mmap in the private _mmap, which numpy's stubs omit
        self.buf._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)  # type: ignore[attr-defined]

    def stats(self) -> dict:
        return {"requests": self.requests, "rows": self.rows}

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def mapped_bytes_bound(layout: FeatureLayout, threads: int) -> int:
    """The most of ``features.bin`` a :class:`ThreadedMmapFeatures` maps at once (bytes)."""
    return int(threads) * MMAP_CHUNK_ROWS * (layout.row_bytes + FAULT_AROUND_BYTES)
