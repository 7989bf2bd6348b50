"""Entries of a 1-D array on disk read by index without mapping the file.

A numpy memmap indexed at scattered positions maps into the process whatever the kernel
faults in around each position. With large page-cache folios that is up to a whole folio
per entry: 1,024 labels at random out of 111M (an 888 MiB ``labels.npy``) mapped 737 MiB
for the moment of the read. :class:`EntryReader` instead reads the pages holding the
entries through the page cache (a :class:`~ooc.storage.direct.DirectReader` with
``page_cache=True``: many reads in flight, readahead off), each page once per request,
into a buffer of at most :data:`PIECE_ENTRIES` pages, and copies the entries out.
``read(ids, width)`` reads ``width`` consecutive entries from each id in the same request
(``indptr[v]`` and ``indptr[v + 1]``: a node's offsets, each page read once).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.storage.direct import DirectReader, read_index_ranges
from ooc.storage.layout import PAGE

#: Entries read per request: at most this many pages (16 MiB) in the reader's buffer.
PIECE_ENTRIES = 4096
#: Ids sorted at once: a read of more holds their int64 copy and sort order (16 bytes an
#: id) for this many at a time, whatever its length.
IDS_PER_READ = 1 << 20


class EntryReader:
    """``read(ids)`` of the entries of a 1-D array of ``length`` items of ``dtype`` that
    starts ``offset`` bytes into ``path`` (an ``.npy``'s data: ``memmap.offset``).

    ``offset`` must be a multiple of the item size, so no entry straddles a page. The
    entries on the file's last, partial page, and the page's worth before them, are read
    once with ``pread`` and kept (at most 8 KiB): a run of entries that reaches the partial
    page is served from them. The reader (a file descriptor and an io_uring ring, or threads) is
    opened on the first read; ``read`` may be called from several threads (serialised).
    """

    def __init__(self, path: str | os.PathLike, offset: int, dtype, length: int,
                 backend: str = "auto"):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.length = int(length)
        self.offset = int(offset)
        self.backend = backend
        if self.offset % self.dtype.itemsize or PAGE % self.dtype.itemsize:
            raise InvalidValue(f"{self.path}: entries of {self.dtype.itemsize} bytes at offset "
                               f"{self.offset} would straddle pages")
        self._per_page = PAGE // self.dtype.itemsize
        self._first = self.offset // self.dtype.itemsize  # file position of entry 0, in items
        self._lock = threading.Lock()
        self._reader: DirectReader | None = None
        self._tail: np.ndarray | None = None               # entries from _kept_from on
        self._kept_from = 0
        self._tail_start = 0                               # first entry on the partial page

    def _open(self) -> DirectReader:
        reader = DirectReader(self.path, page_cache=True, backend=self.backend)
        whole = reader.num_pages * self._per_page - self._first
        start = max(0, min(self.length, whole))
        kept = max(0, start - self._per_page + 1)
        n = self.length - kept
        with open(self.path, "rb") as f:
            f.seek(self.offset + kept * self.dtype.itemsize)
            tail = np.fromfile(f, dtype=self.dtype, count=n)
        if tail.shape[0] != n:
            reader.close()
            raise InvalidValue(f"{self.path}: truncated (ends before entry {self.length})")
        self._reader, self._tail, self._kept_from, self._tail_start = reader, tail, kept, start
        return reader

    def read(self, ids: np.ndarray, width: int = 1) -> np.ndarray:
        """Entries ``ids`` (int [n], any order, repeats allowed) as an array [n] of the
        file's dtype; with ``width`` > 1 (at most a page of entries), entries ``ids[i] ..
        ids[i] + width - 1`` as row ``i`` of an array [n, width]. Beside the result it
        holds, for :data:`IDS_PER_READ` ids at a time, their int64 copy and sort order (16
        bytes an id), and a buffer of at most :data:`PIECE_ENTRIES` pages.

        Raises:
            IdOutOfRange: an entry outside ``[0, length)``, naming the file.
        """
        width = int(width)
        if not 1 <= width <= self._per_page:
            raise InvalidValue(f"width must be in [1, {self._per_page}], got {width}")
        ids = np.asarray(ids).reshape(-1)
        out = np.empty((ids.shape[0], width), dtype=self.dtype)
        if ids.shape[0]:
            lo, hi = int(ids.min()), int(ids.max()) + width - 1
            if lo < 0 or hi >= self.length:
                bad = lo if lo < 0 else hi
                raise IdOutOfRange(f"{self.path}: index {bad} outside [0, {self.length})")
            for a in range(0, ids.shape[0], IDS_PER_READ):
                part = np.asarray(ids[a:a + IDS_PER_READ], dtype=np.int64)
                self._read(part, int(part.max()) + width - 1, out[a:a + part.shape[0]])
        return out[:, 0] if width == 1 else out

    def _read(self, ids: np.ndarray, hi: int, out: np.ndarray) -> None:
        """Fill ``out`` [n, width] from the pages (runs that end before the partial page)
        and from the kept entries; ``hi``: the largest entry asked for."""
        cols = np.arange(out.shape[1])
        with self._lock:
            reader = self._reader if self._reader is not None else self._open()
            assert self._tail is not None  # set by _open
            if hi < self._tail_start:  # none reaches the partial page: no selection to hold
                order = np.argsort(ids, kind="stable")
            else:
                in_pages = ids < self._tail_start - (out.shape[1] - 1)
                rest = np.flatnonzero(~in_pages)
                out[rest] = self._tail[(ids[rest] - self._kept_from)[:, None] + cols]
                sel = np.flatnonzero(in_pages)
                order = sel[np.argsort(ids[sel], kind="stable")]
            for a in range(0, order.shape[0], PIECE_ENTRIES):
                part = order[a:a + PIECE_ENTRIES]
                pos = ids[part] + self._first
                vals, offs = read_index_ranges(reader, pos, pos + out.shape[1], self.dtype)
                out[part] = vals[offs[:, None] + cols]

    def close(self) -> None:
        """Release the file descriptor and ring (idempotent); a later read reopens."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
