"""Direct page readers: batched whole-page reads of one file into aligned buffers.

:class:`DirectReader` reads whole 4 KiB pages of one file into page-aligned
buffers. A request is a sorted array of unique page ids; adjacent pages are
coalesced into one larger read (up to ``max_read_bytes``) and the reads are
handed to a *backend* (:mod:`ooc.storage.io_backends`): O_DIRECT + io_uring,
``preadv`` threads, or mmap, chosen by ``backend=`` (``"auto"``: the first
that works here; a native one is probed in a child process first, and a
fallback is one ``ooc: note:`` line).

On top of the reader:

* :class:`DirectFeatures` — ``read(ids)`` of feature rows of ``features.bin``
  (GraphBolt's ``Feature.read``), pages deduplicated within the request.
  Rows of whole pages are read straight into the returned rows (no copy);
  smaller rows are read into a page buffer and copied out.
* :func:`read_ranges` / :func:`read_index_ranges` — byte ranges (neighbour
  lists of ``indices.bin``) read with each page once.

Threads: ``read_pages`` and ``close`` hold a per-reader lock, so concurrent
calls are serialised and closing waits for a read in progress.
:meth:`DirectFeatures.read` may be called from several threads (its page
buffer is filled and copied out under a lock of its own); :func:`read_ranges`
hands out the reader's reusable scratch buffer: one thread per reader for it.
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ooc.core.errors import IdOutOfRange, InvalidValue, IOFailure
from ooc.storage import _direct_kernels as K
from ooc.storage.features import Also, Feature
from ooc.storage.io_backends import AUTO_ORDER, CHOICES, ReadBackend, check_choice, open_backend
from ooc.storage.layout import PAGE, FeatureLayout, RowTable, aligned_empty, aligned_part

__all__ = [
    "AUTO_ORDER", "CHOICES", "DirectFeatures", "DirectReader", "ReadStats", "aligned_empty",
    "read_index_ranges", "read_ranges",
]

#: Largest single read when adjacent pages are coalesced.
DEFAULT_MAX_READ_BYTES = 256 << 10
#: Gaps of a request read through, at most: one read of both sides and the gap instead of
#: two reads (bytes between small feature rows; whole pages between pages). An SSD's read
#: has a fixed cost of several times a page's transfer at a deep queue (fio's rates by
#: read size: ``docs/benchmarks.md``, reading through short gaps), so a gap of up to about
#: three pages costs less than a read.
DEFAULT_MAX_GAP_BYTES = 12 << 10
#: Pages of a page buffer (64 MiB): a larger request is read in pieces of at most this many
#: pages, so a batch of scattered small rows (a 4 KiB page for each 512 B row) does not hold
#: a page buffer of its whole request.
DEFAULT_MAX_BUFFER_PAGES = 16384
_MAX_QUEUE_DEPTH = 4096
#: ``lo``/``hi`` of a read plan that reads whole pages (see ``_direct_kernels.plan_runs``)
_WHOLE = np.empty(0, np.int64)


def gap_room(max_pages: int, max_gap_pages: int) -> int:
    """Wanted pages a request of a ``max_pages`` page buffer takes at once so that the
    gaps read through beside them (at most ``max_gap_pages`` each) fit too: at least 1."""
    return max(1, max_pages // (1 + max_gap_pages))


def grown(buf: np.ndarray, nbytes: int, cap: int) -> np.ndarray:
    """``buf`` (page-aligned uint8) when it holds ``nbytes``, else a new one of ``nbytes``,
    or of twice ``buf``'s size where that is larger but not past ``cap`` bytes: a reused
    page buffer grows in few steps and stays near ``cap`` unless one request needs more."""
    if buf.size >= nbytes:
        return buf
    return aligned_empty(max(int(nbytes), min(2 * buf.size, int(cap))))


def _is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % PAGE == 0


@dataclass
class ReadStats:
    """Counters of one reader since it was opened (or since :meth:`reset`)."""

    requests: int = 0     #: batched reads with at least one page
    read_ops: int = 0     #: syscall-level reads (io_uring SQEs, preadv calls, mmap runs)
    pages: int = 0        #: pages read from, whole or in part
    bytes_read: int = 0   #: bytes read
    rows_direct: int = 0  #: feature rows read straight into the caller's rows
    rows_copied: int = 0  #: feature rows read into the page buffer and copied out

    def reset(self) -> None:
        self.requests = self.read_ops = self.pages = self.bytes_read = 0
        self.rows_direct = self.rows_copied = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _close_backend(holder: list) -> None:
    if holder:
        holder.pop().close()


class DirectReader:
    """Batched whole-page reads of one file through a read backend.

    Args:
        path: the file.
        queue_depth: reads in flight (io_uring queue depth, or preadv threads).
        backend: ``"auto"`` or one of :data:`ooc.storage.io_backends.REGISTRY`
            (``"liburing"``, ``"preadv"``, ``"mmap"``, ...). An explicit backend
            that cannot be used raises :class:`OocError` with the reason.
        max_read_bytes: adjacent pages are coalesced into reads of at most this.
        max_gap_bytes: the planners of requests that may read pages nobody asked for
            (:class:`DirectFeatures`, :func:`read_ranges`) read through gaps of at most
            this between wanted pages (0: never); :meth:`read_pages` reads only the
            pages it is given.
        page_cache: read through the kernel's page cache instead of ``O_DIRECT``
            (readahead off): for a file likely still cached, such as one this process
            wrote a moment ago; the reads still go many at a time.
        max_buffer_pages: the scratch buffer doubles as requests grow, but not past this
            many pages unless one request needs more.
        page_reads: read whole pages even where the backend and device take
            :data:`~ooc.storage.layout.SECTOR`-sized reads (see :attr:`read_align`).

    Attributes:
        max_gap_bytes: as given; ``max_gap_pages``: in whole pages (the page planners').
        backend: name of the backend in use. ``o_direct``: whether the page cache is
            bypassed. ``read_align``: what reads of part of a page are rounded out to
            (``SECTOR``, 512, where the backend and the device take it, else ``PAGE``):
            :class:`DirectFeatures` reads a small row's sectors, not its page.
            ``stats``: :class:`ReadStats`. ``size``: file size in bytes; ``num_pages``:
            pages readable (a partial last page is not readable: a short read).
    """

    def __init__(self, path, queue_depth: int = 64, backend: str = "auto",
                 max_read_bytes: int = DEFAULT_MAX_READ_BYTES, page_cache: bool = False,
                 max_buffer_pages: int = DEFAULT_MAX_BUFFER_PAGES, page_reads: bool = False,
                 max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES):
        self.path = os.fspath(path)
        self.max_buffer_pages = max(1, int(max_buffer_pages))
        if int(max_gap_bytes) < 0:
            raise InvalidValue(f"max_gap_bytes must be >= 0, got {max_gap_bytes}")
        self.max_gap_bytes = int(max_gap_bytes)
        self.max_gap_pages = self.max_gap_bytes // PAGE
        check_choice(backend)
        if not 1 <= int(queue_depth) <= _MAX_QUEUE_DEPTH:
            raise InvalidValue(f"queue_depth must be in [1, {_MAX_QUEUE_DEPTH}], got {queue_depth}")
        self.queue_depth = int(queue_depth)
        self.max_run_pages = max(1, int(max_read_bytes) // PAGE)
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._scratch = aligned_empty(0)
        try:
            self.size = os.stat(self.path).st_size
        except OSError as e:
            raise IOFailure(f"{self.path}: cannot open for reading: {e.strerror}") from None
        self.num_pages = self.size // PAGE
        self._io: ReadBackend = open_backend(self.path, self.size, self.queue_depth, backend,
                                             page_cache)
        self._holder = [self._io]
        self._finalizer = weakref.finalize(self, _close_backend, self._holder)
        self.backend: str = self._io.name
        self.o_direct: bool = self._io.o_direct
        self.read_align: int = PAGE if page_reads else self._io.read_align

    @property
    def backend_label(self) -> str:
        """The backend in words, e.g. ``preadv threads (O_DIRECT)``."""
        return self._io.describe()

    def engine_stats(self) -> dict[str, float]:
        """The native io_uring engine's counters since the reader opened: runs read
        (``engine_runs``; ``engine_reads_plain`` of them into unregistered buffers), seconds
        spent in the engine (``engine_busy_s``) and buffer registrations
        (``engine_registrations``); empty for the other backends."""
        io: Any = self._io   # the counters are the native engine's own (io_uring.py)
        if not hasattr(io, "busy_s"):
            return {}
        return {"engine_runs": io.reads_fixed + io.reads_plain, "engine_busy_s": io.busy_s,
                "engine_reads_plain": io.reads_plain, "engine_registrations": io.registrations}

    # ------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Release the file descriptor, ring and threads (idempotent).

        Waits for a read in progress on another thread (reads and ``close`` take
        the same lock): the ring's memory is never unmapped under a running read,
        and a read that starts after ``close`` raises :class:`OocError`.
        """
        with self._lock:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "DirectReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DirectReader({self.path!r}, backend={self.backend!r}, "
                f"queue_depth={self.queue_depth}, o_direct={self.o_direct})")

    # ------------------------------------------------------------------ read
    def scratch(self, nbytes: int) -> np.ndarray:
        """The reader's reusable page-aligned buffer, grown to ``nbytes`` (contents undefined)."""
        self._scratch = grown(self._scratch, nbytes, self.max_buffer_pages * PAGE)
        return self._scratch[:nbytes]

    @property
    def fresh_buffers(self) -> bool:
        """Whether the backend reads into any page-aligned memory it is given (rather than
        only into memory it keeps: see :class:`~ooc.storage.io_backends.ReadBackend`)."""
        return self._io.fresh_buffers

    def read_runs_into_scratch(self, offs: np.ndarray, lens: np.ndarray, bufs: np.ndarray,
                               npages: int, nbytes: int) -> np.ndarray:
        """:meth:`read_runs` into the scratch buffer; its first ``npages`` pages. The caller
        serialises its uses of the buffer (see the module docstring)."""
        buf = self.scratch(npages * PAGE)
        self.read_runs(offs, lens, bufs, self._scratch, npages, reuse=True, nbytes=nbytes)
        return buf

    def _read_into_scratch(self, pages: np.ndarray, lo: np.ndarray = _WHOLE,
                           hi: np.ndarray = _WHOLE) -> np.ndarray:
        """:meth:`read_pages` into the scratch buffer; its first ``len(pages)`` pages.

        The backend is handed the whole buffer, not the slice: a backend that
        registers it then does so once per growth, not once per larger request.
        """
        buf = self.scratch(pages.shape[0] * PAGE)
        self.read_pages(pages, self._scratch, lo, hi)
        return buf

    def read_pages(self, pages: np.ndarray, out: np.ndarray, lo: np.ndarray = _WHOLE,
                   hi: np.ndarray = _WHOLE) -> None:
        """Read ``pages`` (int64 sorted unique page ids) into ``out``.

        Page ``pages[k]`` lands at ``out[k*4096:(k+1)*4096]``; only its bytes
        ``[lo[k], hi[k])`` when those are given (int64 [len(pages)], multiples of
        :attr:`read_align`). ``out`` is a C-contiguous, page-aligned uint8 array of at
        least ``len(pages)*4096`` bytes. Raises :class:`OocError` naming the file on a
        page past the end of the file, a short read or an I/O error.
        """
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        n = pages.shape[0]
        if n == 0:
            return
        if self.closed:
            raise InvalidValue(f"{self.path}: reader is closed")
        if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous:
            raise InvalidValue("out must be a 1-D C-contiguous uint8 array")
        if out.size < n * PAGE:
            raise InvalidValue(f"out has {out.size} bytes, {n} pages need {n * PAGE}")
        if not _is_aligned(out) and self.o_direct:
            raise InvalidValue("out must be page aligned (use aligned_empty)")
        offs, lens, bufs, nbytes, status = K.plan_runs(pages, lo, hi, self.max_run_pages)
        if status == 1:
            raise InvalidValue("pages must be sorted and unique")
        if status == 2:
            raise InvalidValue(f"{self.path}: negative page id requested")
        last = int(pages[-1])
        if last >= self.num_pages:
            tail = self.size - self.num_pages * PAGE
            what = (f"partial last page ({tail} of {PAGE} bytes): the file is truncated "
                    f"or not padded to 4 KiB") if last == self.num_pages and tail else "past the end"
            raise InvalidValue(f"{self.path}: page {last} requested but the file has "
                           f"{self.size} bytes ({self.num_pages} whole pages): {what}")
        self.read_runs(offs, lens, bufs, out, n, reuse=True, nbytes=nbytes)

    def read_runs(self, offs: np.ndarray, lens: np.ndarray, bufs: np.ndarray,
                  out: np.ndarray, npages: int, reuse: bool, nbytes: int | None = None) -> None:
        """Hand planned runs (int64 ``[nruns]`` byte offsets, lengths, offsets in
        ``out``, multiples of :attr:`read_align`) from ``npages`` pages in all to the
        backend and count them (``nbytes``: their bytes, when not whole pages).
        ``reuse``: whether ``out`` will be read into again (a backend may register it)."""
        with self._lock:
            if self.closed:
                raise InvalidValue(f"{self.path}: reader is closed")
            self._io.read_runs(offs, lens, bufs, out, reuse=reuse)
            self.stats.read_ops += offs.shape[0]
            self.stats.requests += 1
            self.stats.pages += npages
            self.stats.bytes_read += npages * PAGE if nbytes is None else nbytes


# ---------------------------------------------------------------- helpers
def read_ranges(reader: DirectReader, byte_starts: np.ndarray, byte_ends: np.ndarray,
                out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read byte ranges ``[byte_starts[i], byte_ends[i])`` of the reader's file.

    Every page is read once even when ranges share it, in one batched
    request, and of a page only the :attr:`~DirectReader.read_align` multiples
    that the ranges cover; gaps of at most :attr:`~DirectReader.max_gap_pages` between
    those pages are read through (within ``out``, or the scratch buffer's usual size).
    Returns ``(buf, offsets)``: range i's bytes are
    ``buf[offsets[i] : offsets[i] + byte_ends[i] - byte_starts[i]]``.
    ``buf`` is ``out`` when given (page-aligned uint8, large enough), else the
    reader's scratch buffer, which the next call on the same reader reuses.
    """
    starts = np.ascontiguousarray(byte_starts, dtype=np.int64)
    ends = np.ascontiguousarray(byte_ends, dtype=np.int64)
    if starts.shape != ends.shape or starts.ndim != 1:
        raise InvalidValue("byte_starts and byte_ends must be 1-D arrays of equal length")
    pages, lo, hi, offsets, bad = K.range_pages(starts, ends, reader.read_align)
    if bad >= 0:
        raise InvalidValue(f"bad byte range {bad}: [{starts[bad]}, {ends[bad]})")
    limit = reader.max_buffer_pages if out is None else out.size // PAGE
    pages, lo, hi, pos = K.fill_gaps(pages, lo, hi, reader.max_gap_pages, limit)
    if pos.shape[0] != pages.shape[0]:  # gaps added: each range moves with its first page
        K.move_offsets(offsets, starts, ends, pos)
    need = pages.shape[0] * PAGE
    if out is None:
        return reader._read_into_scratch(pages, lo, hi), offsets
    if out.size < need:
        raise InvalidValue(f"out has {out.size} bytes, the ranges need {need}")
    reader.read_pages(pages, out, lo, hi)
    return out, offsets


def read_index_ranges(reader: DirectReader, starts: np.ndarray, ends: np.ndarray,
                      dtype=np.int32, out: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Read element ranges of a raw array file (neighbour lists of ``indices.bin``).

    ``starts``/``ends`` are element positions (``indptr[v]``, ``indptr[v+1]``).
    Returns ``(values, offsets)``: list i is
    ``values[offsets[i] : offsets[i] + ends[i] - starts[i]]``, with ``values``
    a view of type ``dtype`` over the page buffer (see :func:`read_ranges`).
    """
    dt = np.dtype(dtype)
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    buf, off = read_ranges(reader, s * dt.itemsize, e * dt.itemsize, out)
    return buf.view(dt), off // dt.itemsize


class DirectFeatures(RowTable, Feature):
    """Feature rows of ``features.bin`` read with a :class:`DirectReader`.

    ``read(ids)`` returns ``[len(ids), dim]`` rows in the file's dtype, in the
    order of ``ids`` (ids may repeat, any order), read in one batched
    submission with each page read once:

    * rows of whole pages (``row_bytes`` a multiple of 4096) are read straight
      into the returned array: a new page-aligned one, or ``out`` when it is
      page-aligned or the backend does not bypass the page cache. A repeated
      id is read once and copied.
    * other rows (several per page, or padded to whole pages), and whole-page
      rows for an ``out`` off a page boundary, are read into the reader's page
      buffer and copied out (``extract_rows``); a request of more than
      ``max_pages`` pages is read in pieces of at most that many, in file order,
      so the buffer stays at most ``max_pages * 4096`` bytes. Of a page shared by
      rows, only the sectors (512 B) its wanted rows occupy are read where the
      device takes such reads (``reader.read_align``; ``page_reads=True``: whole
      pages): a 512 B row costs 512 B of the disk's bandwidth, not 4 KiB. Two such
      rows in file order go in one read when at most ``max_gap_bytes`` lie between
      them, on one page or across pages (0: only the rows' own sectors are read).

    ``stats()["rows_direct"]`` / ``stats()["rows_copied"]`` count the rows of each way
    (``reader.stats``, a :class:`ReadStats`, holds them).

    ``read_into(ids, out, rows)`` reads into chosen rows of a larger array (a
    batch's misses into the batch's rows) the same two ways.
    """

    def __init__(self, path, layout: FeatureLayout, queue_depth: int = 64,
                 backend: str = "auto", max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
                 max_pages: int = DEFAULT_MAX_BUFFER_PAGES, page_reads: bool = False,
                 max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES):
        self.path = Path(path)
        self.what = str(self.path)
        self.layout = layout
        self.max_pages = max(1, int(max_pages), layout.pages_per_row)
        self._scratch_lock = threading.Lock()  # the page buffer: filled, then copied out
        self.reader = DirectReader(path, queue_depth=queue_depth, backend=backend,
                                   max_read_bytes=max_read_bytes, max_buffer_pages=self.max_pages,
                                   page_reads=page_reads, max_gap_bytes=max_gap_bytes)
        if self.reader.size < layout.file_bytes:
            size = self.reader.size
            self.reader.close()
            raise InvalidValue(f"{self.path}: {size} bytes, the feature layout needs "
                           f"{layout.file_bytes} (truncated?)")

    @property
    def backend(self) -> str:
        return self.reader.backend

    def stats(self) -> dict:
        """The reader's counters (:class:`ReadStats`) as a dict."""
        return self.reader.stats.as_dict()

    def _new_out(self, n: int) -> np.ndarray:
        """Rows of whole pages: a page-aligned array, so they are read straight into it."""
        lay = self.layout
        if n and lay.row_bytes % PAGE == 0:
            return aligned_part(np.empty(n * lay.row_bytes + PAGE, np.uint8), n * lay.row_bytes
                                ).view(lay.dtype).reshape(n, lay.dim)
        return np.empty((n, lay.dim), dtype=lay.dtype)

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        """The misses of a batch straight into the batch's row array: whole-page rows
        land there with no copy when ``out`` is page-aligned (see the class docstring)."""
        self._read(ids, np.arange(ids.shape[0], dtype=np.int64) if rows is None else rows, out)

    def _read_also(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                   also: Also) -> None:
        """Both reads in one request, so a page that holds rows of both is read once (rows
        smaller than a page; whole-page rows share no page and are read one after the
        other)."""
        if self.layout.row_bytes % PAGE == 0:
            super()._read_also(ids, out, rows, also)
            return
        ids2, out2, rows2 = also
        dst = np.arange(ids.shape[0], dtype=np.int64) if rows is None else rows
        dst2 = np.arange(ids2.shape[0], dtype=np.int64) if rows2 is None else rows2
        # one request; a negative target -1 - j is row j of out2
        self._read(np.concatenate((ids, ids2)), np.concatenate((dst, -1 - dst2)), out, out2)

    def _read(self, ids: np.ndarray, dst: np.ndarray, out: np.ndarray,
              out2: np.ndarray | None = None) -> None:
        """``out[dst[i]] = row ids[i]``, ``out2[-1 - dst[i]]`` where ``dst[i] < 0`` (ids,
        dst int64 [n], n > 0; ``out`` and ``out2`` checked; ``out2`` only for rows
        smaller than a page)."""
        lay = self.layout
        r = self.reader
        rows = out.view(np.uint8).reshape(out.shape[0], lay.row_bytes)
        rows2 = (np.empty((0, lay.row_bytes), np.uint8) if out2 is None
                 else out2.view(np.uint8).reshape(out2.shape[0], lay.row_bytes))
        if lay.row_bytes % PAGE == 0 and r.fresh_buffers \
                and (_is_aligned(out) or not r.o_direct):
            offs, lens, bufs, dup_dst, dup_src, bad = K.plan_row_reads(
                ids, dst, lay.pages_per_row, lay.num_rows, r.max_run_pages)
            self._check_ids(ids, bad)
            r.read_runs(offs, lens, bufs, rows.reshape(-1),
                         (ids.shape[0] - dup_dst.shape[0]) * lay.pages_per_row, reuse=False)
            if dup_dst.shape[0]:  # rare (batch ids are unique): numpy, no kernel to compile
                rows[dup_dst] = rows[dup_src]
            r.stats.rows_direct += ids.shape[0]
            return
        with self._scratch_lock:
            for part, pdst in self._pieces(ids, dst):
                if lay.rows_per_page:  # rows within pages: gaps counted in bytes
                    offs, lens, bufs, slot, npages, nbytes, bad = K.plan_sector_reads(
                        part, lay.rows_per_page, lay.row_bytes, lay.num_rows,
                        r.max_run_pages, r.read_align, r.max_gap_bytes, self.max_pages)
                else:
                    offs, lens, bufs, slot, npages, nbytes, bad = K.plan_page_reads(
                        part, lay.pages_per_row, lay.num_rows, r.max_run_pages,
                        r.max_gap_pages, self.max_pages)
                self._check_ids(part, bad)
                buf = r.read_runs_into_scratch(offs, lens, bufs, npages, nbytes)
                K.extract_rows(buf, part, slot, lay.rows_per_page, lay.row_bytes, pdst, rows,
                               rows2)
            r.stats.rows_copied += ids.shape[0]

    def _pieces(self, ids: np.ndarray, dst: np.ndarray):
        """``(ids, dst)`` pieces of a request whose pages number at most
        :attr:`max_pages` each with room for the gaps read through (a piece's wanted pages
        at most ``max_pages / (1 + max_gap_pages)``): the whole request when its rows cannot
        need more, else its rows in file order cut at page boundaries (ids checked first,
        so a bad one fails before anything is read)."""
        lay = self.layout
        n = ids.shape[0]
        room = max(lay.pages_per_row, gap_room(self.max_pages, self.reader.max_gap_pages))
        if n * lay.pages_per_row <= room:
            yield ids, dst
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= lay.num_rows:
            self._check_ids(ids, int(np.argmax((ids < 0) | (ids >= lay.num_rows))))
        o = np.argsort(ids, kind="stable")
        sids = ids[o]
        # the index of each row's page (several rows a page) or of each distinct row
        first = sids // lay.rows_per_page if lay.rows_per_page else sids
        fresh = np.empty(n, dtype=np.int64)
        fresh[0] = 0
        fresh[1:] = first[1:] != first[:-1]
        per = room if lay.rows_per_page else max(1, room // lay.pages_per_row)
        piece = np.cumsum(fresh) // per
        cuts = np.flatnonzero(piece[1:] != piece[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [n]])
        for a, z in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            yield sids[a:z], dst[o[a:z]]

    def _check_ids(self, ids: np.ndarray, bad: int) -> None:
        if bad >= 0:
            raise IdOutOfRange(f"{self.path}: row id {ids[bad]} out of range "
                             f"[0, {self.layout.num_rows})")

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "DirectFeatures":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
