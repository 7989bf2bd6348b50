"""Direct page readers: O_DIRECT + io_uring, with preadv-thread and mmap fallbacks.

:class:`DirectReader` reads whole 4 KiB pages of one file into page-aligned
buffers. A request is a sorted array of unique page ids; adjacent pages are
coalesced into one larger read (up to ``max_read_bytes``), the reads are
streamed through an io_uring submission queue kept at ``queue_depth``
in-flight reads, and completions are reaped in batches.

Backends, tried in this order by ``backend="auto"``:

``io_uring``  ``O_DIRECT`` file, python ``liburing`` ring (page cache bypassed).
``preadv``    a thread pool calling ``os.preadv`` (``O_DIRECT`` when the file
              system accepts it, else buffered), ``queue_depth`` threads.
``mmap``      a read-only memory map of the file (page cache).

When a faster backend is refused (tmpfs without O_DIRECT, io_uring disabled by
``kernel.io_uring_disabled`` or seccomp) one warning line names the backend in
use and why (a :class:`DirectIOFallbackWarning`, once per process and reason).

On top of the reader:

* :class:`DirectFeatures` — ``read(ids)`` of feature rows of ``features.bin``
  (GraphBolt's ``Feature.read``), pages deduplicated within the request.
* :func:`read_ranges` / :func:`read_index_ranges` — byte ranges (neighbour
  lists of ``indices.bin``) read with each page once.

Threads: ``read_pages`` holds a per-reader lock, so concurrent calls are
serialised, but :class:`DirectFeatures` and :func:`read_ranges` hand out the
reader's reusable scratch buffer: give each thread its own reader.

Cost model (measured by ``tools/bench_reader.py``): the io_uring path spends
about 1 µs of Python per read (get_sqe, Iovec, prep_readv, one CQE check) on
top of the kernel's own submission cost; the binding has no bulk SQE API,
so random 4 KiB reads cost one Python iteration each, and adjacent pages are
coalesced into one read of up to ``max_read_bytes``. The ring's CQEs are
reaped in batches straight from the CQ ring (``cq_ready`` + ``cq_advance``).
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _direct_kernels as K
from .errors import OocError
from .layout import PAGE, FeatureLayout, RowTable

__all__ = [
    "BACKENDS", "DirectFeatures", "DirectIOFallbackWarning", "DirectReader", "ReadStats",
    "aligned_empty", "read_index_ranges", "read_ranges",
]

BACKENDS = ("io_uring", "preadv", "mmap")
#: Largest single read when adjacent pages are coalesced.
DEFAULT_MAX_READ_BYTES = 256 << 10
_MAX_QUEUE_DEPTH = 4096

try:  # the package is a hard dependency, but the reader must degrade if it breaks
    import liburing as _L
except Exception as _exc:  # pragma: no cover - exercised via monkeypatch
    _L = None
    _LIBURING_IMPORT_ERROR = repr(_exc)
else:
    _LIBURING_IMPORT_ERROR = ""


class DirectIOFallbackWarning(UserWarning):
    """A direct reader fell back to a slower backend."""


_warned: set[tuple[str, str]] = set()


def _warn_fallback(path: str, backend: str, reason: str) -> None:
    key = (backend, reason.split(":")[0])
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"ooc direct reader: using {backend} for {path}: {reason}",
                  DirectIOFallbackWarning, stacklevel=3)


def aligned_empty(nbytes: int, align: int = PAGE) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data is ``align``-aligned."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError("nbytes must be >= 0")
    raw = np.empty(nbytes + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]


def _is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % PAGE == 0


@dataclass
class ReadStats:
    """Counters of one reader since it was opened (or since :meth:`reset`)."""

    requests: int = 0    #: read_pages calls with at least one page
    read_ops: int = 0    #: syscall-level reads (io_uring SQEs, preadv calls, mmap runs)
    pages: int = 0       #: pages delivered
    bytes_read: int = 0  #: bytes delivered

    def reset(self) -> None:
        self.requests = self.read_ops = self.pages = self.bytes_read = 0

    def as_dict(self) -> dict:
        return {"requests": self.requests, "read_ops": self.read_ops,
                "pages": self.pages, "bytes_read": self.bytes_read}


class _Handles:
    """OS resources of a reader; closed by close() or by the GC finalizer."""

    def __init__(self):
        self.fd = -1
        self.ring = None
        self.efd = -1  # eventfd signalled on io_uring completions
        self.pool: ThreadPoolExecutor | None = None
        self.mm: mmap.mmap | None = None

    def close(self) -> None:
        if self.ring is not None and _L is not None:
            ring, self.ring = self.ring, None
            try:
                _L.io_uring_queue_exit(ring)
            except Exception:
                pass
        if self.efd >= 0:
            efd, self.efd = self.efd, -1
            os.close(efd)
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.shutdown(wait=True)
        if self.mm is not None:
            mm, self.mm = self.mm, None
            try:
                mm.close()
            except BufferError:  # an exported view is alive; the GC frees it
                pass
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# liburing's ``Iovec`` keeps a reference to, and a buffer export of, every
# memoryview it is given and never gives them back (checked on liburing
# 2026.3.30: a fresh slice per read leaked the slice and pinned its buffer,
# RSS grew ~30 MB per epoch). So each page of a buffer gets one memoryview,
# made once and reused by every read into that page: the leaked references
# then cost nothing. Single-page reads (most reads of random rows) also reuse
# one ``Iovec`` per page, built on first use. Buffers read into stay allocated
# for the life of the process, so callers should reuse them
# (``DirectReader.scratch`` does).
_PAGES: dict[int, tuple[list, list]] = {}
_PINNED: list = []


def _page_slots(out: np.ndarray) -> tuple[list, list]:
    """Per 4 KiB page of ``out`` (keyed by address): one reusable memoryview, and a slot
    for its single-page ``Iovec`` (None until first used)."""
    addr = out.ctypes.data
    npages = out.size // PAGE
    entry = _PAGES.get(addr)
    if entry is None or len(entry[0]) < npages:
        mv = memoryview(out)
        if entry is not None:
            _PINNED.append(entry)  # may hold leaked exports: never free them
        entry = ([mv[k * PAGE:(k + 1) * PAGE] for k in range(npages)], [None] * npages)
        _PAGES[addr] = entry
    return entry


class DirectReader:
    """Batched whole-page reads of one file with O_DIRECT + io_uring.

    Falls back to ``preadv`` threads, then to mmap (see the module doc).

    Args:
        path: the file.
        queue_depth: reads in flight (io_uring queue depth, or preadv threads).
        backend: ``"auto"``, ``"io_uring"``, ``"preadv"`` or ``"mmap"``. An
            explicit backend that cannot be used raises :class:`OocError`.
        max_read_bytes: adjacent pages are coalesced into reads of at most this.

    Attributes:
        backend: the backend in use. ``o_direct``: whether the page cache is bypassed.
        stats: :class:`ReadStats`. ``size``: file size in bytes; ``num_pages``:
            pages readable (a partial last page is not readable: a short read).
    """

    def __init__(self, path, queue_depth: int = 64, backend: str = "auto",
                 max_read_bytes: int = DEFAULT_MAX_READ_BYTES):
        self.path = os.fspath(path)
        if backend not in ("auto",) + BACKENDS:
            raise ValueError(f"backend must be auto, io_uring, preadv or mmap, not {backend!r}")
        if not 1 <= int(queue_depth) <= _MAX_QUEUE_DEPTH:
            raise ValueError(f"queue_depth must be in [1, {_MAX_QUEUE_DEPTH}], got {queue_depth}")
        self.queue_depth = int(queue_depth)
        self.max_run_pages = max(1, int(max_read_bytes) // PAGE)
        self.stats = ReadStats()
        self.o_direct = False
        self._lock = threading.Lock()
        self._h = _Handles()
        self._finalizer = weakref.finalize(self, self._h.close)
        self._scratch = aligned_empty(0)
        try:
            self.size = os.stat(self.path).st_size
        except OSError as e:
            raise OocError(f"{self.path}: cannot open for reading: {e.strerror}") from None
        self.num_pages = self.size // PAGE
        try:
            self._open(backend)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- setup
    def _open(self, backend: str) -> None:
        tried: list[str] = []
        order = BACKENDS if backend == "auto" else (backend,)
        for b in order:
            try:
                getattr(self, f"_open_{b}")()
            except _Refused as r:
                self._h.close()  # reusable: close() resets the handles
                tried.append(f"{b} refused ({r})")
                if backend != "auto":
                    raise OocError(f"{self.path}: backend {b} unavailable: {r}") from None
                continue
            self.backend = b
            if tried or (b == "preadv" and not self.o_direct):
                why = "; ".join(tried) if tried else "O_DIRECT refused"
                if b == "preadv" and not self.o_direct and tried:
                    why += "; O_DIRECT refused, buffered reads"
                if backend == "auto":
                    _warn_fallback(self.path, b if b != "preadv" else
                                   f"preadv threads ({'O_DIRECT' if self.o_direct else 'buffered'})",
                                   why)
            return
        raise OocError(f"{self.path}: no read backend works: " + "; ".join(tried))

    def _open_fd(self, direct: bool) -> bool:
        """Open the file, with O_DIRECT when ``direct`` and accepted; probe one read."""
        if direct:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise OocError(f"{self.path}: cannot open for reading: {e.strerror}") from None
                fd = -1
            if fd >= 0:
                # Some file systems accept the flag but fail the reads: probe one page.
                if self.num_pages == 0 or self._probe(fd):
                    self._h.fd = fd
                    return True
                os.close(fd)
        try:
            self._h.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise OocError(f"{self.path}: cannot open for reading: {e.strerror}") from None
        return False

    @staticmethod
    def _probe(fd: int) -> bool:
        if not hasattr(os, "preadv"):
            return True  # cannot probe; read errors surface as OocError later
        buf = aligned_empty(PAGE)
        try:
            return os.preadv(fd, [memoryview(buf)], 0) == PAGE
        except OSError:
            return False

    def _open_io_uring(self) -> None:
        if _L is None:
            raise _Refused(f"liburing not importable: {_LIBURING_IMPORT_ERROR}")
        if not self._open_fd(direct=True):
            raise _Refused("O_DIRECT refused by the file system (EINVAL)")
        self.o_direct = True
        entries = _pow2(self.queue_depth)
        ring = _L.Ring()
        try:
            _L.io_uring_queue_init(entries, ring)
        except OSError as e:
            raise _Refused(f"io_uring_queue_init failed: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001 - the binding raises assorted types
            raise _Refused(f"io_uring_queue_init failed: {e}") from None
        self._h.ring = ring
        # Completions are waited for on an eventfd, not in io_uring_submit_and_wait: the
        # binding holds the GIL through that call, which stalls every other Python thread
        # (the training loop) for as long as the reads take; os.eventfd_read releases it.
        try:
            self._h.efd = os.eventfd(0, os.EFD_CLOEXEC)
            _L.io_uring_register_eventfd(ring, self._h.efd)
        except Exception as e:  # noqa: BLE001 - OSError or the binding's own types
            raise _Refused(f"io_uring_register_eventfd failed: {e}") from None
        self._cq_entries = 2 * entries
        self._cq_head = 0
        self._cqe = _L.Cqe()

    def _open_preadv(self) -> None:
        if not hasattr(os, "preadv"):
            raise _Refused("os.preadv not available")
        self.o_direct = self._open_fd(direct=True)
        if self.num_pages and not self._probe(self._h.fd):
            raise _Refused("preadv probe read failed")
        self._threads = min(self.queue_depth, 64)
        if self.queue_depth > 1:
            self._h.pool = ThreadPoolExecutor(max_workers=self._threads,
                                              thread_name_prefix="ooc-preadv")

    def _open_mmap(self) -> None:
        self.o_direct = False
        if self.size == 0:
            self._pages_view = np.zeros((0, PAGE), np.uint8)
            return
        try:
            with open(self.path, "rb") as f:
                self._h.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise _Refused(f"mmap failed: {e}") from None
        self._h.mm.madvise(mmap.MADV_RANDOM)
        arr = np.frombuffer(self._h.mm, dtype=np.uint8)
        self._pages_view = arr[: self.num_pages * PAGE].reshape(self.num_pages, PAGE)

    # ------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Release the file descriptor, ring and threads (idempotent)."""
        self._pages_view = None
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "DirectReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DirectReader({self.path!r}, backend={getattr(self, 'backend', None)!r}, "
                f"queue_depth={self.queue_depth}, o_direct={self.o_direct})")

    # ------------------------------------------------------------------ read
    def scratch(self, nbytes: int) -> np.ndarray:
        """The reader's reusable page-aligned buffer, grown to ``nbytes`` (contents undefined)."""
        if self._scratch.size < nbytes:
            self._scratch = aligned_empty(max(int(nbytes), 2 * self._scratch.size))
        return self._scratch[:nbytes]

    def read_pages(self, pages: np.ndarray, out: np.ndarray) -> None:
        """Read ``pages`` (int64 sorted unique page ids) into ``out``.

        Page ``pages[k]`` lands at ``out[k*4096:(k+1)*4096]``. ``out`` is a
        C-contiguous, page-aligned uint8 array of at least ``len(pages)*4096``
        bytes. Raises :class:`OocError` naming the file on a page past the end
        of the file, a short read or an I/O error.
        """
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        n = pages.shape[0]
        if n == 0:
            return
        if self.closed:
            raise OocError(f"{self.path}: reader is closed")
        if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous:
            raise ValueError("out must be a 1-D C-contiguous uint8 array")
        if out.size < n * PAGE:
            raise ValueError(f"out has {out.size} bytes, {n} pages need {n * PAGE}")
        if not _is_aligned(out) and self.o_direct:
            raise ValueError("out must be page aligned (use aligned_empty)")
        first, npg, slot, status = K.plan_runs(pages, self.max_run_pages)
        if status == 1:
            raise ValueError("pages must be sorted and unique")
        if status == 2:
            raise OocError(f"{self.path}: negative page id requested")
        last = int(pages[-1])
        if last >= self.num_pages:
            tail = self.size - self.num_pages * PAGE
            what = (f"partial last page ({tail} of {PAGE} bytes): the file is truncated "
                    f"or not padded to 4 KiB") if last == self.num_pages and tail else "past the end"
            raise OocError(f"{self.path}: page {last} requested but the file has "
                           f"{self.size} bytes ({self.num_pages} whole pages): {what}")
        with self._lock:
            if self.backend == "io_uring":
                self._read_uring(first, npg, slot, out)
            elif self.backend == "preadv":
                self._read_preadv(first, npg, slot, out)
            else:
                out[: n * PAGE].reshape(n, PAGE)[:] = self._pages_view[pages]
                self.stats.read_ops += first.shape[0]
            self.stats.requests += 1
            self.stats.pages += n
            self.stats.bytes_read += n * PAGE

    def _short(self, off: int, want: int, got: int) -> OocError:
        if got < 0:
            return OocError(f"{self.path}: read of {want} bytes at offset {off} failed: "
                            f"{os.strerror(-got)} (errno {-got})")
        return OocError(f"{self.path}: short read at offset {off}: got {got} of {want} bytes "
                        f"(file truncated or changed while reading?)")

    def _read_uring(self, first, npg, slot, out) -> None:
        L = _L
        ring = self._h.ring
        fd = self._h.fd
        cqe = self._cqe
        get_sqe = L.io_uring_get_sqe
        prep = L.io_uring_prep_readv
        Iovec = L.Iovec
        offs = (first * PAGE).tolist()
        lens = (npg * PAGE).tolist()
        slots = slot.tolist()
        npgs = npg.tolist()
        nruns = len(offs)
        views, one = _page_slots(out)
        iovs = [None] * nruns  # kept alive until completion
        qd = self.queue_depth
        cq_mask = self._cq_entries - 1
        i = 0
        inflight = 0
        err: OocError | None = None
        try:
            while inflight or (i < nruns and err is None):
                if err is None:
                    while inflight < qd and i < nruns:
                        sqe = get_sqe(ring)
                        if sqe is None:  # SQ full (cannot happen while inflight <= entries)
                            break
                        b = slots[i]
                        if npgs[i] == 1:
                            iov = one[b]
                            if iov is None:
                                iov = one[b] = Iovec(views[b:b + 1])
                        else:
                            iov = Iovec(views[b:b + npgs[i]])
                        iovs[i] = iov
                        prep(sqe, fd, iov, offs[i])
                        sqe.user_data = i
                        i += 1
                        inflight += 1
                self._submit_and_wait(ring)
                ready = L.io_uring_cq_ready(ring)
                while ready:
                    L.io_uring_wait_cqe(ring, cqe)  # sets cqe to the CQ head, no syscall
                    head = self._cq_head & cq_mask
                    m = min(ready, self._cq_entries - head)  # cqe[j] does not wrap
                    for j in range(m):
                        c = cqe[j]
                        u = c.user_data
                        try:
                            res = c.res
                        except OSError as e:  # the binding raises on a negative res
                            res = -(e.errno or errno.EIO)
                        if res != lens[u] and err is None:
                            err = self._short(offs[u], lens[u], res)
                        iovs[u] = None
                    L.io_uring_cq_advance(ring, m)
                    self._cq_head += m
                    inflight -= m
                    ready -= m
        except BaseException:
            # Never leave reads in flight into buffers we hand back: drain, then close.
            self._drain(inflight)
            raise
        self.stats.read_ops += i
        if err is not None:
            raise err

    def _submit_and_wait(self, ring) -> None:
        """Submit queued SQEs, then sleep (GIL released) until a completion is posted.

        The eventfd counts completions since it was last read: one posted
        between the ``cq_ready`` check and the read makes the read return at
        once, so no wake-up is lost; a stale count only costs one more check.
        """
        _L.io_uring_submit(ring)
        efd = self._h.efd
        while not _L.io_uring_cq_ready(ring):
            os.eventfd_read(efd)

    def _drain(self, inflight: int) -> None:
        try:
            while inflight > 0:
                self._submit_and_wait(self._h.ring)
                ready = _L.io_uring_cq_ready(self._h.ring)
                if ready:
                    _L.io_uring_cq_advance(self._h.ring, ready)
                    self._cq_head += ready
                    inflight -= ready
        except BaseException:
            pass
        finally:
            if inflight > 0:  # cannot account for them: the ring is unusable
                self.close()

    def _read_preadv(self, first, npg, slot, out) -> None:
        fd = self._h.fd
        offs = (first * PAGE).tolist()
        lens = (npg * PAGE).tolist()
        bufs = (slot * PAGE).tolist()
        mv = memoryview(out)
        preadv = os.preadv
        nruns = len(offs)

        def work(t: int, step: int):
            for j in range(t, nruns, step):
                b = bufs[j]
                try:
                    got = preadv(fd, [mv[b:b + lens[j]]], offs[j])
                except OSError as e:
                    return self._short(offs[j], lens[j], -(e.errno or errno.EIO))
                if got != lens[j]:
                    return self._short(offs[j], lens[j], got)
            return None

        pool = self._h.pool
        if pool is None or nruns == 1:
            errs = [work(0, 1)]
        else:
            step = min(self._threads, nruns)
            errs = list(pool.map(work, range(step), [step] * step))
        self.stats.read_ops += nruns
        for e in errs:
            if e is not None:
                raise e


class _Refused(Exception):
    """A backend cannot be used here (the reason is the message)."""


# ---------------------------------------------------------------- helpers
def read_ranges(reader: DirectReader, byte_starts: np.ndarray, byte_ends: np.ndarray,
                out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read byte ranges ``[byte_starts[i], byte_ends[i])`` of the reader's file.

    Every page is read once even when ranges share it, in one batched
    request. Returns ``(buf, offsets)``: range i's bytes are
    ``buf[offsets[i] : offsets[i] + byte_ends[i] - byte_starts[i]]``.
    ``buf`` is ``out`` when given (page-aligned uint8, large enough), else the
    reader's scratch buffer, which the next call on the same reader reuses.
    """
    starts = np.ascontiguousarray(byte_starts, dtype=np.int64)
    ends = np.ascontiguousarray(byte_ends, dtype=np.int64)
    if starts.shape != ends.shape or starts.ndim != 1:
        raise ValueError("byte_starts and byte_ends must be 1-D arrays of equal length")
    pages, offsets, bad = K.range_pages(starts, ends)
    if bad >= 0:
        raise ValueError(f"bad byte range {bad}: [{starts[bad]}, {ends[bad]})")
    need = pages.shape[0] * PAGE
    if out is None:
        buf = reader.scratch(need)
    else:
        if out.size < need:
            raise ValueError(f"out has {out.size} bytes, the ranges need {need}")
        buf = out
    reader.read_pages(pages, buf)
    return buf, offsets


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


class DirectFeatures(RowTable):
    """Feature rows of ``features.bin`` read with a :class:`DirectReader`.

    ``read(ids)`` returns ``[len(ids), dim]`` rows in the file's dtype, in the
    order of ``ids`` (ids may repeat, any order); the pages of a request are
    deduplicated and read in one batched submission into a reused buffer.
    """

    def __init__(self, path, layout: FeatureLayout, queue_depth: int = 64,
                 backend: str = "auto", max_read_bytes: int = DEFAULT_MAX_READ_BYTES):
        self.path = Path(path)
        self.layout = layout
        self.reader = DirectReader(path, queue_depth=queue_depth, backend=backend,
                                   max_read_bytes=max_read_bytes)
        if self.reader.size < layout.file_bytes:
            size = self.reader.size
            self.reader.close()
            raise OocError(f"{self.path}: {size} bytes, the feature layout needs "
                           f"{layout.file_bytes} (truncated?)")

    @property
    def backend(self) -> str:
        return self.reader.backend

    @property
    def stats(self) -> ReadStats:
        return self.reader.stats

    def pages_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted unique pages of ``ids``, slot of each id's first page)."""
        lay = self.layout
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        pages, slot, bad = K.feature_pages(ids, lay.rows_per_page, lay.pages_per_row,
                                           lay.num_rows)
        if bad >= 0:
            raise IndexError(f"{self.path}: row id {ids[bad]} out of range [0, {lay.num_rows})")
        return pages, slot

    def read(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``ids`` as ``[len(ids), dim]`` in the file's dtype (into ``out`` if given)."""
        lay = self.layout
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        n = ids.shape[0]
        if out is None:
            out = np.empty((n, lay.dim), dtype=lay.dtype)
        elif out.shape != (n, lay.dim) or out.dtype != np.dtype(lay.dtype) \
                or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous {lay.dtype} of shape {(n, lay.dim)}")
        if n == 0:
            return out
        pages, slot = self.pages_of(ids)
        buf = self.reader.scratch(pages.shape[0] * PAGE)
        self.reader.read_pages(pages, buf)
        K.extract_rows(buf, ids, slot, lay.rows_per_page, lay.row_bytes,
                       out.view(np.uint8).reshape(n, lay.row_bytes))
        return out

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "DirectFeatures":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
