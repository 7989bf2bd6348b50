"""Entries of a 1-D array on disk read by index without mapping the file.

A numpy memmap indexed at scattered positions maps into the process whatever the kernel
faults in around each position. With large page-cache folios that is up to a whole folio
per entry: 1,024 labels at random out of 111M (an 888 MiB ``labels.npy``) mapped 737 MiB
for the moment of the read. :class:`EntryReader` instead reads the pages holding the
entries through the page cache (a :class:`~ooc.storage.direct.DirectReader` with
``page_cache=True``: many reads in flight, readahead off), each page once per request,
into a buffer of at most :data:`PIECE_ENTRIES` pages, and copies the entries out.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import IdOutOfRange, InvalidValue
from .layout import PAGE

if TYPE_CHECKING:
    from .direct import DirectReader

#: Entries read per request: at most this many pages (16 MiB) in the reader's buffer.
PIECE_ENTRIES = 4096


class EntryReader:
    """``read(ids)`` of the entries of a 1-D array of ``length`` items of ``dtype`` that
    starts ``offset`` bytes into ``path`` (an ``.npy``'s data: ``memmap.offset``).

    ``offset`` must be a multiple of the item size, so no entry straddles a page. The
    entries in the file's last, partial page are read once with ``pread`` and kept (at
    most 4 KiB). The reader (a file descriptor and an io_uring ring, or threads) is
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
        self._first = self.offset // self.dtype.itemsize  # file position of entry 0, in items
        self._lock = threading.Lock()
        self._reader: DirectReader | None = None
        self._tail: np.ndarray | None = None
        self._tail_start = 0                               # first entry on the partial page

    def _open(self) -> "DirectReader":
        from .direct import DirectReader

        reader = DirectReader(self.path, page_cache=True, backend=self.backend)
        whole = reader.num_pages * PAGE // self.dtype.itemsize - self._first
        start = max(0, min(self.length, whole))
        n = self.length - start
        with open(self.path, "rb") as f:
            f.seek(self.offset + start * self.dtype.itemsize)
            tail = np.fromfile(f, dtype=self.dtype, count=n)
        if tail.shape[0] != n:
            reader.close()
            raise InvalidValue(f"{self.path}: truncated (ends before entry {self.length})")
        self._reader, self._tail, self._tail_start = reader, tail, start
        return reader

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Entries ``ids`` (int [n], any order, repeats allowed) as an array [n] of the
        file's dtype. Beside the result it holds the ids' sort order (8 bytes an id) and a
        buffer of at most :data:`PIECE_ENTRIES` pages.

        Raises:
            IdOutOfRange: an id outside ``[0, length)``, naming the file.
        """
        from .direct import read_index_ranges

        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(ids.shape[0], dtype=self.dtype)
        if ids.shape[0] == 0:
            return out
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.length:
            bad = lo if lo < 0 else hi
            raise IdOutOfRange(f"{self.path}: index {bad} outside [0, {self.length})")
        with self._lock:
            reader = self._reader if self._reader is not None else self._open()
            assert self._tail is not None  # set by _open
            if hi < self._tail_start:  # none on the partial page: no selection to hold
                order = np.argsort(ids, kind="stable")
            else:
                in_pages = ids < self._tail_start
                rest = np.flatnonzero(~in_pages)
                out[rest] = self._tail[ids[rest] - self._tail_start]
                sel = np.flatnonzero(in_pages)
                order = sel[np.argsort(ids[sel], kind="stable")]
            for a in range(0, order.shape[0], PIECE_ENTRIES):
                part = order[a:a + PIECE_ENTRIES]
                pos = ids[part] + self._first
                vals, offs = read_index_ranges(reader, pos, pos + 1, self.dtype)
                out[part] = vals[offs]
        return out

    def close(self) -> None:
        """Release the file descriptor and ring (idempotent); a later read reopens."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
