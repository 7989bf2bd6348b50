"""Neighbour sources: where the sampler gets neighbour ids from.

The sampler decides *which* positions of each neighbour list it wants from
``indptr`` alone; a source only returns the ids stored at those positions.
One call per hop covers the whole frontier of every batch sampled together,
so a disk-backed source can batch its reads (one submission per hop).

Sources:

- :class:`InMemoryNeighbors` — an indices array or memmap.
- :class:`CachedNeighbors` — the Ginex neighbor cache, misses from a fallback.
- :class:`DirectNeighbors` — ``indices.bin`` read with O_DIRECT sector or page reads
  through :class:`ooc.storage.direct.DirectReader`, all pages of a request
  submitted together.
- :class:`MmapNeighbors` — the ``indices.bin`` memmap copied by a pool of
  threads with readahead off (the ``baseline`` preset's sampling I/O).
"""
from __future__ import annotations

import mmap
import os
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from ooc.core.errors import DatasetError, IdOutOfRange, InvalidValue
from ooc.storage import _neighbors_kernels as NK
from ooc.storage._direct_kernels import fill_gaps
from ooc.storage.bus_guard import check_size
from ooc.storage.direct import DEFAULT_MAX_BUFFER_PAGES, DirectReader, aligned_empty, gap_room, grown
from ooc.storage.layout import PAGE
from ooc.storage.pagecache import advise

#: ``lo``/``hi`` of whole pages (see :func:`~ooc.storage._direct_kernels.fill_gaps`).
_WHOLE = np.empty(0, np.int64)

__all__ = ["NeighborRequest", "NeighborSource", "InMemoryNeighbors",
           "DirectNeighbors", "MmapNeighbors", "source_path"]


@dataclass
class NeighborRequest:
    """Which neighbour ids the sampler wants at one hop.

    Attributes:
        nodes: int64 [f] frontier node ids (may repeat across batches).
        offsets: int64 [f+1]; node i's wanted positions are
            ``rel_pos[offsets[i]:offsets[i+1]]`` (possibly none).
        rel_pos: int64 [m] positions inside each node's neighbour list.
        edge_pos: int64 [m] the same positions in ``indices``
            (``indptr[node] + rel_pos``).
    """

    nodes: np.ndarray
    offsets: np.ndarray
    rel_pos: np.ndarray
    edge_pos: np.ndarray

    @property
    def size(self) -> int:
        return int(self.edge_pos.shape[0])

    def subset(self, which: np.ndarray) -> tuple["NeighborRequest", np.ndarray]:
        """The request restricted to the frontier entries ``which`` (int64, ascending),
        and the positions (int64) of its wanted ids inside this request."""
        starts = self.offsets[which]
        counts = self.offsets[which + 1] - starts
        offs = np.zeros(which.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=offs[1:])
        sel = np.empty(int(offs[-1]), dtype=np.int64)
        NK.expand_ranges(starts, offs, sel)
        return NeighborRequest(self.nodes[which], offs, self.rel_pos[sel], self.edge_pos[sel]), sel


class NeighborSource(ABC):
    """Where the sampler gets neighbour ids from (an abstract class with a template method).

    :meth:`gather` checks the request's positions once, then calls the one hook a source
    implements, :meth:`_gather`.
    """

    @property
    @abstractmethod
    def num_edges(self) -> int:
        """Positions of ``indices`` this source reads: ``[0, num_edges)``."""

    @abstractmethod
    def _gather(self, req: NeighborRequest) -> np.ndarray:
        """int64 [req.size], the ids at ``req.edge_pos`` (checked: in range, size > 0)."""

    def gather(self, req: NeighborRequest) -> np.ndarray:
        """int64 [req.size], the ids stored at the request's positions.

        Raises:
            IdOutOfRange: a position outside ``[0, num_edges)``, named with the file.
        """
        if req.size == 0:
            return np.empty(0, dtype=np.int64)
        lo, hi = int(req.edge_pos.min()), int(req.edge_pos.max())
        if lo < 0 or hi >= self.num_edges:
            raise IdOutOfRange(f"{source_path(self)}: edge position {lo if lo < 0 else hi} "
                               f"out of range [0, {self.num_edges})")
        return self._gather(req)

    def stats(self) -> dict:
        """Counters of the reads so far."""
        return {}

    def close(self) -> None:
        """Release what the source holds; closing twice is fine."""
        return None  # a reader holding nothing has nothing to release


class InMemoryNeighbors(NeighborSource):
    """Neighbour ids from an indices array (int32/int64 ndarray or memmap)."""

    def __init__(self, indices: np.ndarray):
        indices = np.asarray(indices) if not isinstance(indices, np.memmap) else indices
        if indices.ndim != 1 or indices.dtype not in (np.int32, np.int64):
            raise InvalidValue("indices must be a 1-D int32 or int64 array")
        self.indices = indices

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def check_length(self, num_edges: int) -> None:
        """Refuse an indices array shorter than ``indptr[-1]`` (the gather kernel
        indexes it with positions up to there)."""
        if self.indices.shape[0] < num_edges:
            raise DatasetError(source_path(self), f"holds {self.indices.shape[0]} ids, but indptr "
                                                  f"has {num_edges} edges")

    def _gather(self, req: NeighborRequest) -> np.ndarray:
        out = np.empty(req.size, dtype=np.int64)
        NK.gather_in_memory(req.edge_pos, self.indices, out)
        return out


class DirectNeighbors(NeighborSource):
    """Neighbour ids read from ``indices.bin`` with page-aligned direct reads.

    All pages holding the wanted positions of a request are deduplicated and
    submitted together (in chunks of at most ``max_pages`` pages, so the page
    buffer stays bounded), then the ids are extracted from the page buffer. Of a
    page only the sectors holding wanted positions are read where the reader reads
    sectors (its ``read_align``; a reader without one reads whole pages).

    Args:
        indices_path: the dataset's ``indices.bin``.
        indptr: int64 [N+1] (gives the index dtype and the edge count).
        reader: an object with ``read_pages(pages, out[, lo, hi])`` (e.g.
            ``ooc.storage.direct.DirectReader``); by default one is opened on
            ``indices_path``.
        owns_reader: whether :meth:`close` closes the reader (default: when this
            source opened it).
        max_pages: pages per submission (default
            :data:`~ooc.storage.direct.DEFAULT_MAX_BUFFER_PAGES`, 64 MiB), gaps included.
        max_gap_pages: gaps of at most this many pages between wanted pages are read
            through (one read instead of two; see
            :data:`~ooc.storage.direct.DEFAULT_MAX_GAP_BYTES`); default: the reader's
            ``max_gap_pages``, else 0.
    """

    def __init__(self, indices_path, indptr: np.ndarray, reader=None,
                 max_pages: int = DEFAULT_MAX_BUFFER_PAGES, dtype=None,
                 owns_reader: bool | None = None, max_gap_pages: int | None = None):
        self.path = os.fspath(indices_path)
        n = int(np.asarray(indptr).shape[0]) - 1
        self.dtype = np.dtype(dtype) if dtype is not None else (
            np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64))
        self._num_edges = int(indptr[-1])
        self._own = reader is None if owns_reader is None else bool(owns_reader)
        if reader is None:
            reader = DirectReader(self.path)
        self.reader = reader
        self.max_pages = max(1, int(max_pages))
        self.max_gap_pages = int(getattr(reader, "max_gap_pages", 0) if max_gap_pages is None
                                 else max_gap_pages)
        #: what a read of part of a page is rounded out to (``PAGE``: whole pages, for a
        #: reader that reads only whole pages)
        self.read_align = int(getattr(reader, "read_align", PAGE))
        if not (self.dtype.itemsize <= self.read_align <= PAGE
                and self.read_align & (self.read_align - 1) == 0):
            raise InvalidValue(f"{self.path}: reads rounded to {self.read_align} bytes; "
                               f"a power of two from {self.dtype.itemsize} to {PAGE} is needed")
        # ids a page (a power of two too) and a read's piece, as shifts of a position
        self._per_page = PAGE // self.dtype.itemsize
        self._shift = self._per_page.bit_length() - 1
        self._piece_shift = (self.read_align // self.dtype.itemsize).bit_length() - 1
        self._buf = aligned_empty(0)
        self._lock = threading.Lock()  # one page buffer: filled, then extracted from
        self.submissions = 0
        self.pages_read = 0

    @property
    def num_edges(self) -> int:
        return self._num_edges

    def _buffer(self, npages: int) -> np.ndarray:
        self._buf = grown(self._buf, npages * PAGE, self.max_pages * PAGE)
        return self._buf[:npages * PAGE]

    def _gather(self, req: NeighborRequest) -> np.ndarray:
        out = np.empty(req.size, dtype=np.int64)
        mark = np.zeros(-(-self.num_edges // self._per_page), dtype=np.uint8)
        NK.mark_sectors(req.edge_pos, self._shift, self._piece_shift, mark)
        pages = np.flatnonzero(mark).astype(np.int64)   # sorted, unique
        lo, hi = _WHOLE, _WHOLE
        if self.read_align < PAGE:  # of a page only the sectors of its wanted positions
            lo, hi = np.empty_like(pages), np.empty_like(pages)
            NK.sector_spans(mark, pages, self.read_align, lo, hi)
        per = gap_room(self.max_pages, self.max_gap_pages)
        with self._lock:  # samplers of several loaders may share this source
            for a in range(0, pages.shape[0], per):
                chunk, clo, chi, _ = fill_gaps(pages[a:a + per], lo[a:a + per], hi[a:a + per],
                                               self.max_gap_pages, self.max_pages)
                buf = self._buffer(chunk.shape[0])
                if self.read_align < PAGE:
                    self.reader.read_pages(chunk, buf, clo, chi)
                else:
                    self.reader.read_pages(chunk, buf)
                self.submissions += 1
                self.pages_read += int(chunk.shape[0])
                vals = buf.view(self.dtype)
                NK.extract_from_pages(req.edge_pos, chunk, self._shift, vals, out,
                                      numba.get_num_threads())
        return out

    def stats(self) -> dict:
        """Requests and pages asked for, and the reader's device reads and bytes
        (``direct_read_ops``, ``direct_bytes_read``; one reader per source)."""
        st = getattr(self.reader, "stats", None)
        return {"direct_submissions": self.submissions, "direct_pages_read": self.pages_read,
                "direct_read_ops": getattr(st, "read_ops", 0),
                "direct_bytes_read": getattr(st, "bytes_read", 0)}

    def close(self) -> None:
        if self._own and self.reader is not None:
            close = getattr(self.reader, "close", None)
            if close is not None:
                close()
            self.reader = None


class MmapNeighbors(NeighborSource):
    """Neighbour ids from the ``indices.bin`` memmap, copied by ``threads`` threads
    (readahead off, ``MADV_RANDOM``) with a nogil kernel, so page faults overlap.
    After each request the map's pages leave the process (the page cache keeps
    them): a request maps at most one fault-around window per wanted id."""

    def __init__(self, indices: np.ndarray, threads: int = 16):
        self.indices = indices
        self.threads = int(threads)
        advise(indices, mmap.MADV_RANDOM)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-mmap-nbr")

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def _gather(self, req: NeighborRequest) -> np.ndarray:
        out = np.empty(req.size, dtype=np.int64)
        ind = self.indices
        if isinstance(ind, np.memmap):  # shrunk since it was mapped: an error, not SIGBUS
            check_size(ind, source_path(self), ind.offset + ind.nbytes)
        k = max(1, min(self.threads * 4, -(-req.size // 1024)))
        step = -(-req.size // k)
        futs = [self.pool.submit(NK.gather_ids, self.indices, req.edge_pos, out, a,
                                 min(req.size, a + step)) for a in range(0, req.size, step)]
        for f in futs:
            f.result()
        advise(self.indices, mmap.MADV_DONTNEED)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def source_path(source) -> str:
    """The indices file a neighbour source reads, for error messages: its
    ``path``, its memmap's file name, or those of its ``fallback``."""
    for obj in (source, getattr(source, "fallback", None)):
        p = getattr(obj, "path", None) or getattr(getattr(obj, "indices", None), "filename", None)
        if p:
            return os.fspath(p)
    return "indices.bin"
