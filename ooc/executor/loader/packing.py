"""The packed data path: a superbatch's misses swept in stored order, packed batch by batch.

The inspector knows every batch of a superbatch and the Belady changesets say what the
cache holds when each batch is gathered, so the rows each batch will miss are known
before the batch runs. :class:`Packer` replays the changesets on a bitset of the
cache's residency (N/8 bytes) over a *window* of consecutive batches, then

1. sweeps the union of the window's misses from ``features.bin`` in stored order with
   its own O_DIRECT reader (rows within ``read_gap`` of each other in one read: where the
   wanted rows are dense the pages are read whole, elsewhere only the rows' sectors), in
   chunks of :data:`SWEEP_ROWS` rows;
2. writes each batch's misses, in stored order, as one *segment* of the window's file
   in the runtime folder (O_DIRECT writes of page-aligned staging blocks, one block per
   batch).

Training reads a batch's segment in a few large reads (:class:`PackedFeature`, the
misses' source behind the feature cache) while the next window is packed; hits still
come from the cache, and the rows of every batch are the ones the direct path reads.

Window file layout: segment t (batch ``first + t``) starts at ``offsets[t]`` (a multiple
of 4096) and holds ``counts[t]`` rows of ``row_bytes`` bytes, sorted by stored row.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.caches._cache_kernels import scatter_rows
from ooc.core.errors import IOFailure
from ooc.executor.loader import _packing_kernels as K
from ooc.storage.direct import DEFAULT_MAX_READ_BYTES
from ooc.storage.features import Feature, FeatureWrapper
from ooc.storage.layout import PAGE, aligned_empty

#: Rows swept per read request (their buffer: this many rows).
SWEEP_ROWS = 1 << 16
#: Pages of the sweep reader's page buffer.
SWEEP_PAGES = 8192
#: The sweep reader's largest read (dense ranges of a window's misses are long).
SWEEP_READ_BYTES = 1 << 20
#: Bytes of a batch's staging block (rounded to whole rows and pages).
STAGE_BYTES = 256 << 10
#: Bytes of one read of a segment.
SEGMENT_READ_BYTES = 8 << 20
#: Batches a window holds at most (a staging block each while it is written).
WINDOW_BATCHES = 64
#: Blocks written behind the sweep at most.
WRITE_BLOCKS = 32


def _round_up(n: int, to: int) -> int:
    return -(-int(n) // to) * to


def stage_rows(row_bytes: int) -> int:
    """Rows of a staging block: a whole number of pages of whole rows, about
    :data:`STAGE_BYTES`."""
    unit = PAGE // int(np.gcd(int(row_bytes), PAGE))  # rows whose bytes are whole pages
    return unit * max(1, STAGE_BYTES // (unit * int(row_bytes)))


def working_bytes(row_bytes: int, num_nodes: int, window_rows: int) -> int:
    """Bytes the packed path holds beside the direct one: the sweep's row buffer and its
    reader's page buffer, a staging block per batch of a window and the blocks written
    behind, the segment read buffer,
    the residency bitset and the window's rows (int32 below 2^31 rows: each batch's, their
    concatenation, the union and its sort's copy: 16 B a row)."""
    return int(SWEEP_ROWS * row_bytes + SWEEP_PAGES * PAGE + (WINDOW_BATCHES + WRITE_BLOCKS)
               * stage_rows(row_bytes) * row_bytes + SEGMENT_READ_BYTES + num_nodes // 8
               + 16 * window_rows)


def _no_bytes(policy, num_nodes: int, row_bytes: int, batches: int) -> int:
    return 0


def _packed_bytes(policy, num_nodes: int, row_bytes: int, batches: int) -> int:
    return working_bytes(row_bytes, num_nodes, int(policy.window_rows))


#: Bytes a superbatch schedule's miss path holds beside the rest of the loop, by the
#: policy's ``misses_from``: ``(policy, num_nodes, row_bytes, batches a superbatch) -> bytes``
#: (the memory planner's ``packing`` stage).
MISS_PATH_BYTES: dict[str, Callable[[Any, int, int, int], int]] = {
    "reads": _no_bytes, "packed": _packed_bytes}


@dataclass
class PackStats:
    """Counters of the packed path since it was made.

    ``sweep_*``: the sweep's requests and the reader's reads, bytes and rows;
    ``segment_*``: reads and bytes of packed segments; ``bytes_written``/``write_ops``:
    segments written; ``rows_packed``: rows written (a row missed by two batches counts
    twice); ``fallback_rows``: misses read directly because no segment matched (0 when the
    replay agrees with the cache); ``pack_s``: seconds of the packer thread;
    ``wait_s``: seconds training waited for a window; ``windows_direct``: windows
    whose misses were read directly (:func:`choose`), ``predicted_*_s``: its predictions.
    """

    windows: int = 0
    windows_direct: int = 0
    predicted_direct_s: float = 0.0
    predicted_packed_s: float = 0.0
    sweep_rows: int = 0
    rows_packed: int = 0
    bytes_written: int = 0
    write_ops: int = 0
    segment_reads: int = 0
    segment_bytes: int = 0
    fallback_rows: int = 0
    pack_s: float = 0.0
    wait_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)
                    if not f.name.startswith("_")}


def _open(path: Path, flags: int) -> tuple[int, bool]:
    """``os.open`` with O_DIRECT where the file system takes it; (fd, direct)."""
    direct = getattr(os, "O_DIRECT", 0)
    try:
        if direct:
            try:
                return os.open(path, flags | direct, 0o600), True
            except OSError:
                pass  # tmpfs and a few others refuse O_DIRECT: the page cache then
        return os.open(path, flags, 0o600), False
    except OSError as e:
        raise IOFailure(f"{path}: {e.strerror or e} (packed segments)") from None


class SegmentWriter:
    """Appends rows to the segments of one window file through page-aligned staging blocks
    (O_DIRECT where the file system takes it). A full block is copied to one of
    :data:`WRITE_BLOCKS` blocks that a writer thread writes behind (the sweep reads on
    meanwhile); the last block of a segment is padded to a whole page by :meth:`finish`,
    which waits for every write."""

    def __init__(self, path: Path, offsets: np.ndarray, row_bytes: int, stats: PackStats):
        self.path, self.rb, self.stats = path, int(row_bytes), stats
        self.fd, _ = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.offsets = offsets
        w = len(offsets) - 1
        self.cap = stage_rows(row_bytes) * self.rb
        self.stage = aligned_empty(w * self.cap).reshape(w, self.cap) if w else \
            aligned_empty(0).reshape(0, 0)
        self.fill = np.zeros(w, np.int64)
        self.written = np.zeros(w, np.int64)
        blocks = aligned_empty(WRITE_BLOCKS * self.cap).reshape(WRITE_BLOCKS, self.cap)
        self._free: queue.Queue = queue.Queue()
        for k in range(WRITE_BLOCKS):
            self._free.put(blocks[k])
        self._todo: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_behind, name="ooc-pack-writer",
                                        daemon=True)
        self._thread.start()

    def append(self, t: int, rows: np.ndarray) -> None:
        """Rows ([m, dim]) to the end of segment ``t``."""
        data = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
        a = 0
        while a < len(data):
            f = int(self.fill[t])
            k = min(self.cap - f, len(data) - a)
            self.stage[t, f:f + k] = data[a:a + k]
            a += k
            self.fill[t] = f + k
            if f + k == self.cap:
                self._flush(t, self.cap)

    def _flush(self, t: int, nbytes: int) -> None:
        if self._error is not None:
            raise self._error
        n = _round_up(nbytes, PAGE)
        block = self._free.get()
        block[:nbytes] = self.stage[t, :nbytes]
        if n > nbytes:
            block[nbytes:n] = 0
        self._todo.put((block, n, int(self.offsets[t] + self.written[t])))
        self.written[t] += n
        self.fill[t] = 0

    def _write_behind(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            block, n, off = item
            try:
                if self._error is None:
                    # numpy's stubs give ndarray __buffer__ only for Python >= 3.12
                    done = os.pwrite(self.fd, memoryview(block[:n]), off)  # type: ignore[arg-type]
                    if done != n:
                        raise IOFailure(f"{self.path}: short write ({done} of {n} bytes; "
                                        f"disk full?)")
                    self.stats.add(bytes_written=n, write_ops=1)
            except OSError as e:
                self._error = IOFailure(f"{self.path}: {e.strerror or e} while writing packed "
                                        f"rows")
            except IOFailure as e:
                self._error = e
            finally:
                self._free.put(block)

    def finish(self) -> None:
        """Write what the staging blocks hold, wait for every write and close the file."""
        try:
            for t in range(len(self.fill)):
                if self.fill[t]:
                    self._flush(t, int(self.fill[t]))
        finally:
            self._todo.put(None)
            self._thread.join()
            os.close(self.fd)
        if self._error is not None:
            raise self._error


@dataclass(frozen=True)
class DiskRates:
    """What reads and writes cost the runtime disk: ``op_s`` seconds a read costs beyond
    its bytes and ``page_s`` a page's transfer, at the readers' queue depth
    (:class:`~ooc.storage.read_cost.ReadCost`), and ``write_bps`` bytes a second of large
    sequential writes (:func:`measure_write_rate`)."""

    op_s: float
    page_s: float
    write_bps: float

    def read_s(self, reads: int, nbytes: int) -> float:
        """Device seconds of ``reads`` reads of ``nbytes`` bytes in all."""
        return reads * self.op_s + nbytes / PAGE * self.page_s


def read_plan(rows: np.ndarray, row_bytes: int, gap_bytes: int,
              max_read_bytes: int = DEFAULT_MAX_READ_BYTES) -> tuple[int, int]:
    """(reads, bytes) of reading stored ``rows`` (sorted, unique, int64) as the O_DIRECT
    reader plans it: rows at most ``gap_bytes`` apart in one read through the gap, reads
    of at most ``max_read_bytes``."""
    if not len(rows):
        return 0, 0
    rows = np.asarray(rows, dtype=np.int64)
    gaps = (np.diff(rows) - 1) * row_bytes
    starts = np.concatenate([[0], np.flatnonzero(gaps > gap_bytes) + 1])
    ends = np.concatenate([starts[1:], [len(rows)]]) - 1
    span = (rows[ends] - rows[starts] + 1) * row_bytes
    return int(np.sum(-(-span // max_read_bytes))), int(span.sum())


@dataclass(frozen=True)
class Choice:
    """A window's predicted device seconds read directly and packed, and which won."""

    packed: bool
    direct_s: float
    packed_s: float


def choose(rows: np.ndarray, ptr: np.ndarray, union: np.ndarray, row_bytes: int,
           gap_bytes: int, rates: DiskRates) -> Choice:
    """Pack a window or read its misses directly, by the disk's time for each: every
    batch's misses read as the direct reader plans them, against the sweep of the union,
    the segments written at ``write_bps`` and read back in :data:`SEGMENT_READ_BYTES`
    reads. ``rows``: each batch's stored rows, sorted within ``ptr``'s slices."""
    direct = 0.0
    seg_reads = seg_bytes = 0
    for t in range(len(ptr) - 1):
        direct += rates.read_s(*read_plan(rows[ptr[t]:ptr[t + 1]], row_bytes, gap_bytes))
        nb = _round_up((ptr[t + 1] - ptr[t]) * row_bytes, PAGE)
        seg_reads += -(-nb // SEGMENT_READ_BYTES)
        seg_bytes += nb
    packed = rates.read_s(*read_plan(union, row_bytes, gap_bytes)) + \
        seg_bytes / rates.write_bps + rates.read_s(seg_reads, seg_bytes)
    return Choice(packed < direct, direct, packed)


def measure_write_rate(folder: Path, nbytes: int = 64 << 20) -> float:
    """Bytes a second of 4 MiB O_DIRECT sequential writes of a scratch file in ``folder``
    (removed after), ``nbytes`` in all."""
    path = Path(folder) / ".write-rate"
    block = aligned_empty(4 << 20)
    block[:] = 0
    fd, _ = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        t0 = time.perf_counter()
        for off in range(0, nbytes, len(block)):
            os.pwrite(fd, memoryview(block), off)  # type: ignore[arg-type]
        os.fsync(fd)
        return nbytes / max(1e-9, time.perf_counter() - t0)
    except OSError as e:
        raise IOFailure(f"{path}: {e.strerror or e} while timing writes") from None
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


@dataclass
class Window:
    """Packed segments of consecutive batches, maybe of several superbatches (see the
    module docstring): ``parts`` are ``(superbatch, first, stop)``, batches ``first ..
    stop - 1`` of each, segment ``t`` the ``t``-th batch of them in order. :meth:`remove`
    deletes the file and gives its room back."""

    path: Path
    parts: list[tuple[Any, int, int]]
    offsets: np.ndarray
    counts: np.ndarray
    #: int64 sum of the stored rows of each segment (what a gather's misses must match)
    checks: np.ndarray
    #: False: the window's misses are read directly (no file; :func:`choose` said so)
    packed: bool = True
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        if self._release is not None:
            self._release()
            self._release = None


class Packer:
    """Packs windows of consecutive batches (see the module docstring): :meth:`start` at
    each superbatch, :meth:`add` its batches (their misses replayed from the changesets),
    :meth:`flush` when :attr:`full` or when the window should end.

    Args:
        sweep: a reader of ``features.bin`` by stored row (its own O_DIRECT reader).
        row_of: node id -> stored row (int [N]), None when rows are in node order.
        num_nodes: N.
        window_rows: misses a window holds at most (its first batch always fits).
        window_bytes: bytes a window's file takes at most (same rule).
        stats: where the counters go.
        rates: the disk's costs: each window is packed only where :func:`choose` finds
            it faster than direct reads (None: every window is packed).
        gap_bytes: the direct reader's read gap (what :func:`choose` plans reads with).
    """

    def __init__(self, sweep: Feature, row_of: np.ndarray | None, num_nodes: int,
                 window_rows: int, window_bytes: int, stats: PackStats,
                 rates: DiskRates | None = None, gap_bytes: int = 0):
        self.sweep, self.row_of, self.stats = sweep, row_of, stats
        self.rates, self.gap_bytes = rates, int(gap_bytes)
        self.dim = int(sweep.shape[1])
        self.dtype = sweep.dtype
        self.row_bytes = self.dim * self.dtype.itemsize
        self.bits = np.zeros(int(num_nodes) // 8 + 1, np.uint8)
        self.window_rows = max(1, min(int(window_rows), int(window_bytes) // self.row_bytes))
        self.chunk = np.empty((SWEEP_ROWS, self.dim), self.dtype)
        self.row_dtype = np.dtype(np.int32 if sweep.shape[0] < 2**31 else np.int64)
        self._rows: list[np.ndarray] = []      # per batch of the window: its sorted rows
        self._count = 0
        self._limit = self.window_rows

    def limit(self, rows: int) -> None:
        """The next window holds at most ``rows`` misses (at most :attr:`window_rows`)."""
        self._limit = max(1, min(self.window_rows, int(rows)))

    def begin(self, rows: int) -> None:
        """An epoch's first window, of at most ``rows`` misses: batches added and not
        flushed (an epoch whose packing was halted mid-window) are dropped."""
        self._rows, self._count = [], 0
        self.limit(rows)

    def start(self, init_ids: np.ndarray) -> None:
        """The cache a superbatch starts from: exactly ``init_ids``."""
        self.bits[:] = 0
        K.set_bits(self.bits, np.asarray(init_ids, dtype=np.int64), True)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Stored rows (int64) of node ``ids``."""
        ids = np.asarray(ids, dtype=np.int64)
        return ids if self.row_of is None else np.asarray(self.row_of[ids], dtype=np.int64)

    @property
    def full(self) -> bool:
        """Whether the window holds its most rows or batches."""
        return self._count >= self._limit or len(self._rows) >= WINDOW_BATCHES

    @property
    def batches(self) -> int:
        """Batches in the window so far."""
        return len(self._rows)

    def add(self, node_ids: np.ndarray, node_ptr: np.ndarray, cs: Any, j0: int) -> int:
        """Batches ``j0, j0+1, ...`` of the superbatch whose ids are ``node_ids`` /
        ``node_ptr`` and whose changesets are ``cs`` (a
        :class:`~ooc.caches.changesets.FlatChangesets`) into the window while it has room
        (one batch at least); returns the first batch not taken. Batches come in order
        from :meth:`start`."""
        t0 = time.perf_counter()
        j1, misses, ptr = K.window_misses(
            self.bits, np.asarray(node_ids, np.int64), np.asarray(node_ptr, np.int64),
            np.asarray(cs.in_ids, np.int64), np.asarray(cs.in_ptr, np.int64),
            np.asarray(cs.out_ids, np.int64), np.asarray(cs.out_ptr, np.int64), int(j0),
            max(0, self._limit - self._count), max(1, WINDOW_BATCHES - len(self._rows)))
        rows = self.rows(misses)
        for t in range(j1 - j0):
            r = rows[ptr[t]:ptr[t + 1]].astype(self.row_dtype)
            r.sort()
            self._rows.append(r)
        self._count += len(rows)
        self.stats.add(pack_s=time.perf_counter() - t0)
        return int(j1)

    def flush(self, path: Path, parts: list[tuple[Any, int, int]],
              release: Callable[[], None] | None = None) -> Window:
        """The window of the batches added since the last flush, written to ``path``
        (``parts``: which batches they are)."""
        t0 = time.perf_counter()
        batches, self._rows, self._count = self._rows, [], 0
        try:
            return self._write(batches, path, parts, release)
        finally:
            self.stats.add(pack_s=time.perf_counter() - t0)

    def _write(self, batches: list[np.ndarray], path: Path, parts, release) -> Window:
        w = len(batches)
        counts = np.array([len(r) for r in batches], np.int64)
        ptr = np.zeros(w + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        checks = np.array([int(r.sum(dtype=np.int64)) for r in batches], np.int64)
        rows = np.concatenate(batches) if w else np.zeros(0, self.row_dtype)
        del batches
        offsets = np.zeros(w + 1, np.int64)
        np.cumsum([_round_up(c * self.row_bytes, PAGE) for c in counts], out=offsets[1:])
        union = np.unique(rows)
        if self.rates is not None:
            c = choose(rows, ptr, union, self.row_bytes, self.gap_bytes, self.rates)
            self.stats.add(predicted_direct_s=c.direct_s, predicted_packed_s=c.packed_s,
                           windows_direct=0 if c.packed else 1)
            if not c.packed:
                return Window(path, parts, offsets, counts, checks, False, release)
        writer = SegmentWriter(path, offsets, self.row_bytes, self.stats)
        try:
            cursors = ptr[:-1].copy()
            for a in range(0, len(union), SWEEP_ROWS):
                cr = union[a:a + SWEEP_ROWS]
                buf = self.sweep.read(cr, out=self.chunk[:len(cr)])
                last = cr[-1]
                for t in range(w):
                    lo, end = int(cursors[t]), int(ptr[t + 1])
                    hi = lo + int(np.searchsorted(rows[lo:end], last, side="right"))
                    if hi > lo:
                        writer.append(t, buf[np.searchsorted(cr, rows[lo:hi])])
                        cursors[t] = hi
        finally:
            writer.finish()
        self.stats.add(windows=1, sweep_rows=len(union), rows_packed=len(rows))
        return Window(path, parts, offsets, counts, checks, True, release)


class PackedFeature(FeatureWrapper):
    """The misses' source of the packed path: a gather's misses come from the segment
    :meth:`expect` names (a few large reads, rows scattered to their places); anything
    else (cache switches, evaluation, a segment that does not match) from ``inner``, the
    direct reader, counted in ``fallback_rows`` when a segment was expected."""

    def __init__(self, inner: Feature, rows: Callable[[np.ndarray], np.ndarray],
                 stats: PackStats):
        super().__init__(inner)
        self._rows = rows
        self.counters = stats
        self._expected: tuple[Window, int] | None = None
        self._buf = aligned_empty(SEGMENT_READ_BYTES)

    def expect(self, window: Window, t: int) -> None:
        """The next read is the misses of segment ``t`` of ``window`` (read directly when
        the window was not packed)."""
        self._expected = (window, t) if window.packed else None

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        got, self._expected = self._expected, None
        if got is None:
            self.inner._read_into(ids, out, rows)
            return
        win, t = got
        stored = self._rows(ids)
        if len(stored) != int(win.counts[t]) or int(stored.sum()) != int(win.checks[t]):
            self.counters.add(fallback_rows=len(ids))
            self.inner._read_into(ids, out, rows)
            return
        order = np.argsort(stored, kind="stable")
        dst = order if rows is None else rows[order]
        self._read_segment(win, t, dst, out)

    def _read_segment(self, win: Window, t: int, dst: np.ndarray, out: np.ndarray) -> None:
        rb = out.shape[1] * out.dtype.itemsize
        per = max(1, SEGMENT_READ_BYTES // rb)
        n = len(dst)
        fd, _ = _open(win.path, os.O_RDONLY)
        reads = nbytes = 0
        try:
            for a in range(0, n, per):
                b = min(n, a + per)
                want = _round_up((b - a) * rb, PAGE)
                view = self._buf[:want]
                got = os.preadv(fd, [memoryview(view)],  # type: ignore[arg-type]
                                int(win.offsets[t]) + a * rb)
                if got < (b - a) * rb:
                    raise IOFailure(f"{win.path}: short read of a packed segment "
                                    f"({got} of {(b - a) * rb} bytes)")
                reads += 1
                nbytes += want
                src = view[:(b - a) * rb].view(out.dtype).reshape(b - a, out.shape[1])
                scatter_rows(src.view(f"u{out.dtype.itemsize}"), dst[a:b],
                             out.view(f"u{out.dtype.itemsize}"))
        except OSError as e:
            raise IOFailure(f"{win.path}: {e.strerror or e} while reading packed rows") from None
        finally:
            os.close(fd)
        self.counters.add(segment_reads=reads, segment_bytes=nbytes)


def predict_packing(trace: list[np.ndarray], changesets: Callable[[list], Any],
                    superbatch_size: int, rows_of: Callable[[np.ndarray], np.ndarray],
                    num_nodes: int, row_bytes: int, gap_bytes: int, rates: DiskRates,
                    window_rows: int) -> dict[str, Any]:
    """The disk's seconds of an epoch's misses read directly and packed, and what
    :func:`choose` picks per window, from the epoch's ``trace`` (int64 node ids per batch)
    and the policy's ``changesets`` function, in superbatches of ``superbatch_size``
    (the cache sizer's prediction; no I/O)."""
    bits = np.zeros(int(num_nodes) // 8 + 1, np.uint8)
    out: dict[str, Any] = {"direct_s": 0.0, "packed_s": 0.0, "auto_s": 0.0, "windows": 0,
                           "windows_packed": 0, "miss_rows": 0}
    s = max(1, int(superbatch_size))
    for a in range(0, len(trace), s):
        part = trace[a:a + s]
        cs = changesets(part)
        flat_ids = np.concatenate(part).astype(np.int64, copy=False)
        ptr_ids = np.concatenate([[0], np.cumsum([len(t) for t in part])]).astype(np.int64)
        bits[:] = 0
        K.set_bits(bits, np.asarray(cs.init_ids, np.int64), True)
        j = 0
        while j < len(part):
            j1, misses, ptr = K.window_misses(
                bits, flat_ids, ptr_ids, np.asarray(cs.in_ids, np.int64),
                np.asarray(cs.in_ptr, np.int64), np.asarray(cs.out_ids, np.int64),
                np.asarray(cs.out_ptr, np.int64), j, int(window_rows), WINDOW_BATCHES)
            rows = rows_of(misses)
            for t in range(j1 - j):
                rows[ptr[t]:ptr[t + 1]].sort()
            c = choose(rows, ptr, np.unique(rows), row_bytes, gap_bytes, rates)
            out["direct_s"] += c.direct_s
            out["packed_s"] += c.packed_s
            out["auto_s"] += min(c.direct_s, c.packed_s)
            out["windows"] += 1
            out["windows_packed"] += int(c.packed)
            out["miss_rows"] += len(rows)
            j = j1
    return out
