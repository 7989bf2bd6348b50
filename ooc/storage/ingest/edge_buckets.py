"""Stored entries routed once to files by target, for the scatter windows to read.

Without them, each scatter window reads the whole edge source again and scans every edge
for the few whose target falls in the window: ``1 + W`` reads of the input for ``W``
windows (at papers100M's shape under 4 GiB, W is about 9 and the input 26 GB). Routed, the
input is read twice (the count pass and the routing) and each window reads only its own
entries: (target, source) id pairs, 2 ids an entry, written and read once with
``O_DIRECT`` (:mod:`~ooc.storage.direct_files`). The files take 2 ids a stored entry on
disk while they last, and each is removed once read.

A window's entries go to several files, each for a range of its targets whose lists take
about :data:`RANGE_BYTES` (:func:`range_ends`): placing one file's entries then touches
only that range's cursors and lists, which stay in cache, where a window's entries in
input order would miss it on almost every entry (``docs/benchmarks.md``, ingest).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ooc.core.errors import IOFailure
from ooc.storage.direct_files import DirectAppender, WriteBehind, open_direct
from ooc.storage.ingest import _kernels as K
from ooc.storage.layout import PAGE, aligned_empty
from ooc.storage.read_ahead import CHUNKS_HELD

#: Fewest windows for which routing reads less than scanning the input once a window: the
#: routing writes and reads two ids an entry, about what two more scans of an int64 edge
#: list read.
MIN_WINDOWS = 3
#: A node's range is looked up in a table of 2 ** LOOKUP_BITS entries (256 KiB).
LOOKUP_BITS = 16
#: Bytes of in-neighbour lists a file's target range covers, at least.
RANGE_BYTES = 16 << 20
#: Most nodes in one range (their cursors: 8 bytes a node).
RANGE_NODES = 1 << 18
#: Most files routed to (ranges grow beyond :data:`RANGE_BYTES` to keep to it).
MAX_FILES = 256


def range_ends(counts: np.ndarray, windows: list[tuple[int, int]], itemsize: int
               ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The target ranges entries are routed to: ``(ends, files)`` with ``ends`` int64 [R]
    each range's end (consecutive, from node 0, the last ``len(counts)``) and
    ``files[w]`` the first and last-plus-one range of window ``w`` (ranges never
    straddle windows). ``counts``: int64 [N], every node's stored entries."""
    total = int(counts.sum()) * itemsize
    cap = max(RANGE_BYTES, -(-total // MAX_FILES)) // itemsize
    ends: list[np.ndarray] = []
    files = []
    r = 0
    for lo, hi in windows:
        out = np.empty(2 * int(counts[lo:hi].sum()) // max(1, cap) + (hi - lo) // RANGE_NODES
                       + 2, dtype=np.int64)
        k = int(K.window_ends(counts[lo:hi], cap, RANGE_NODES, out))
        ends.append(out[:k] + lo)
        files.append((r, r + k))
        r += k
    return np.concatenate(ends), files


class EdgeBuckets:
    """One file of (target, source) entries per target range, under ``folder``.

    Args:
        folder: where the files go (the dataset writer's temp folder: removed with it
            after an error).
        ends: int64 [R], each range's end (ranges are consecutive, from node 0).
        id_dtype: the stored ids' dtype (int32 or int64).
        staging_bytes: the buffer the entries are gathered into on their way to the files,
            in two halves: one filled while the other is written (:class:`WriteBehind`).
    """

    def __init__(self, folder: Path, ends: np.ndarray, id_dtype: np.dtype,
                 staging_bytes: int):
        self.ends = np.ascontiguousarray(ends, dtype=np.int64)
        self.dtype = np.dtype(id_dtype)
        self.names = [Path(folder) / f".edges-{k}" for k in range(self.ends.shape[0])]
        self.staging: WriteBehind | None = WriteBehind(staging_bytes)
        self.outs = [DirectAppender(name, self.staging) for name in self.names]
        #: entries routed to each range
        self.counts = np.zeros(self.ends.shape[0], dtype=np.int64)
        n = int(self.ends[-1])
        self.shift = max(0, (n - 1).bit_length() - LOOKUP_BITS)
        self.first = np.empty(((n - 1) >> self.shift) + 1 if n else 0, dtype=np.int32)
        K.window_lookup(self.ends, self.shift, self.first)

    @property
    def direct(self) -> bool:
        """Whether the files were written with ``O_DIRECT``."""
        return all(f.direct for f in self.outs)

    def route(self, src: np.ndarray, dst: np.ndarray, undirected: bool,
              drop_self: bool) -> int:
        """Append the entries of the edges ``src -> dst`` (int64 [k]) to their ranges'
        files; returns -1, or the first edge with an id outside the graph (nothing of
        these edges is then appended)."""
        k = src.shape[0]
        win = np.empty(2 * k, dtype=np.int32)
        out = np.empty((2 * k, 2), dtype=self.dtype)
        counts = np.zeros_like(self.counts)
        m = K.route_entries(src, dst, self.ends, self.first, self.shift, undirected,
                            drop_self, counts, win, out)
        if m < 0:
            return -m - 1
        del win
        begin = 0
        for w, c in enumerate(counts.tolist()):
            if c:
                self.outs[w].append(out[begin:begin + c])
            begin += c
        self.counts += counts
        return -1

    def finish(self) -> None:
        """Write what is left of every file (call once, after the last :meth:`route`)."""
        for f in self.outs:
            f.close()
        if self.staging is not None:
            self.staging.close()
            self.staging = None

    def entries(self, w: int, piece_bytes: int) -> Iterator[np.ndarray]:
        """Range ``w``'s entries (ids [k, 2]: target, source), read a piece of at most
        ``piece_bytes`` at a time into :data:`~ooc.storage.read_ahead.CHUNKS_HELD` buffers
        taken in turn (a piece stays valid while the next two are read: as
        :func:`~ooc.storage.read_ahead.read_ahead` keeps them); the file is removed once
        read."""
        yield from self.window_entries(w, w + 1, piece_bytes)

    def window_entries(self, r0: int, r1: int, piece_bytes: int) -> Iterator[np.ndarray]:
        """The entries of ranges ``r0 .. r1 - 1`` in turn, as :meth:`entries` reads them
        (the same buffers across the ranges)."""
        entry = 2 * self.dtype.itemsize
        step = max(PAGE, int(piece_bytes) // PAGE * PAGE)
        bufs = [aligned_empty(step) for _ in range(CHUNKS_HELD)]
        k = 0
        for w in range(r0, r1):
            name = self.names[w]
            total = int(self.counts[w]) * entry
            fd, _ = open_direct(name, os.O_RDONLY)
            try:
                pos = 0
                while pos < total:
                    buf = bufs[k % CHUNKS_HELD]
                    k += 1
                    want = min(step, -(-(total - pos) // PAGE) * PAGE)
                    got = os.preadv(fd, [buf[:want].data], pos)
                    got = min(got, total - pos)
                    if got <= 0 or got % entry:
                        raise IOFailure(f"{name}: ended after {pos} of {total} bytes (removed "
                                        "or truncated while ingest ran?)")
                    yield buf[:got].view(self.dtype).reshape(-1, 2)
                    pos += got
            finally:
                os.close(fd)
            name.unlink()

    def close(self) -> None:
        """Remove every file left (after an error too)."""
        for f in self.outs:
            f.abandon()
        if self.staging is not None:  # nothing in flight: abandon waited for it
            self.staging.close()
            self.staging = None
        for name in self.names:
            name.unlink(missing_ok=True)
