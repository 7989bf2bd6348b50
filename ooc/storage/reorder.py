"""A locality order of a graph's nodes: neighbours close together, so that the rows a
mini-batch gathers share pages (rows smaller than a page are read a page at a time).

:func:`locality_order` runs size-capped label propagation over the CSC in-neighbour lists
(a node counts the labels of at most :data:`VOTES` of its in-neighbours), streamed window
by window from ``indices.bin`` (so the adjacency never has to fit in memory), then groups
nodes by label: each group of at most ``cap`` nodes is contiguous in the new order. A
sweep takes blocks of :data:`BLOCK` nodes, each block's choices made on every core from the
labels as they stood when it began, then applied in id order: the order is the same on any
number of cores. Memory: 4 B/node for the labels and 4 B/node for
the label sizes while propagating, then 4 B/node of counts and the order itself (int32
when N < 2^31, else int64), plus one window of ``indices``.

Ingest stores ``features.bin`` in that order (:class:`~ooc.storage.writer.DatasetWriter`'s
``reorder``): a :class:`RowPlacer` places the rows as they stream in once the adjacency is
written (or :func:`permute_rows` rewrites a finished file) in bounded memory, and the dataset
keeps ``feature_rows.npy`` (node id -> row, :func:`rows_of`); readers are addressed by
node id through :class:`~ooc.storage.features.NodeRows`, so every id a user sees is
unchanged.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numba
import numpy as np
from numpy.typing import DTypeLike

from ooc.core.errors import InvalidValue
from ooc.storage import _reorder_kernels as K
from ooc.storage.direct_files import DirectAppender, WriteBehind, open_direct, pwrite_pages, read_direct
from ooc.storage.layout import PAGE, FeatureLayout, aligned_empty, index_dtype, padded_bytes, read_rows
from ooc.storage.pagecache import release_mapped
from ooc.storage.read_ahead import CHUNKS_HELD, read_ahead

#: Bytes of ``indices`` a propagation sweep holds at once.
DEFAULT_WINDOW = 64 << 20
#: Most bucket files :func:`permute_rows` writes at once.
MAX_BUCKETS = 256
#: Nodes whose labels a sweep chooses together (see :func:`locality_order`).
BLOCK = 8192
#: In-neighbours whose labels a node counts, evenly spaced along a longer list (see
#: :func:`locality_order`).
VOTES = 32


@dataclass
class OrderStats:
    """What :func:`locality_order` did."""

    sweeps: int
    moved: list[int]
    groups: int
    largest_group: int
    #: the longest in-neighbour list (its labels are gathered in one array)
    longest: int = 0
    #: each sweep's gain of counted in-neighbour entries that share their list's label
    gained: list[int] = field(default_factory=list)
    #: the in-neighbours a node counted at most (0: every one)
    votes: int = 0


def write_array(f, a: np.ndarray) -> None:
    """Write the bytes of ``a`` to the open binary file ``f`` (buffered or not). A full disk
    raises ``OSError`` with ``errno.ENOSPC`` (``ndarray.tofile`` reports a short write
    without an errno, which reads as something other than a full disk)."""
    if a.size == 0:
        return
    mv = np.ascontiguousarray(a).data.cast("B")
    while mv.nbytes:
        n = f.write(mv)
        mv = mv[n:]


def _windows(indptr: np.ndarray, window_bytes: int, itemsize: int):
    """Node ranges ``[v0, v1)`` whose in-neighbour lists together take at most
    ``window_bytes``, and whose ``indptr`` entries too (at least one node per range)."""
    n = indptr.shape[0] - 1
    per = max(1, window_bytes // itemsize)
    max_nodes = max(1, window_bytes // 8)
    v0 = 0
    while v0 < n:
        v1 = int(np.searchsorted(indptr, int(indptr[v0]) + per, side="right")) - 1
        v1 = min(n, v0 + max_nodes, max(v0 + 1, v1))
        yield v0, v1
        v0 = v1


def _read_windows(indptr: np.ndarray, indices: np.ndarray, wins: list[tuple[int, int]]
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(v0, ptr, window)`` of each window ``[v0, v1)``: its ``indptr`` entries (int64
    [v1 - v0 + 1]) and in-neighbour ids, copied out of the (mapped) arrays."""
    for v0, v1 in wins:
        ptr = np.ascontiguousarray(indptr[v0:v1 + 1], dtype=np.int64)
        window = np.ascontiguousarray(indices[int(ptr[0]):int(ptr[-1])])
        # the window's mapped pages leave the RSS (the page cache keeps them): a sweep
        # would otherwise hold the whole file
        release_mapped(indices)
        release_mapped(indptr)
        yield v0, ptr, window


def locality_order(indptr: np.ndarray, indices: np.ndarray, cap: int = 1024,
                   sweeps: int = 5, window_bytes: int = DEFAULT_WINDOW,
                   stats: OrderStats | None = None, block: int = BLOCK,
                   votes: int = VOTES) -> np.ndarray:
    """Node ids in a locality order (``order[new] = old``; int32 when N < 2^31).

    Args:
        indptr: int64 [N+1] CSC offsets (a memmap is fine: read window by window).
        indices: [E] in-neighbour ids (a memmap of ``indices.bin`` is fine).
        cap: the most nodes one label (one contiguous group of the order) may hold; a
            few thousand rows' worth of pages keeps a community within a few pages.
        sweeps: label-propagation sweeps at most (fewer once a sweep moves under 1% of the
            nodes or raises the entries sharing their list's label by under 1%).
        window_bytes: bytes of ``indices`` read at once.
        stats: filled with what happened, when given.
        block: nodes whose labels are chosen together, from the labels as they stood when
            the block began (then they move in id order); 1: one node at a time, each
            seeing the moves before it. The result depends on it, not on the cores.
        votes: a node with a longer in-neighbour list counts the labels of this many of
            its entries, evenly spaced along the list (sorted by id, so a spread of them);
            0: every entry. Fewer votes make a sweep faster for slightly more pages a
            mini-batch's rows fall on (``docs/benchmarks.md``).
    """
    n = int(indptr.shape[0]) - 1
    dt = index_dtype(n)
    label = np.arange(n, dtype=dt)
    size = np.ones(n, dtype=dt)
    # windows read ahead: CHUNKS_HELD copies alive and one window mapped while copied
    wins = list(_windows(indptr, window_bytes // (CHUNKS_HELD + 1) * 2,
                         indices.dtype.itemsize))
    release_mapped(indptr)
    block = max(1, int(block))
    votes = max(0, int(votes))
    prop = np.empty(block, dtype=dt)  # a block's chosen labels, across windows
    gains = np.empty(block, dtype=np.int64)  # and what each would gain
    threads = numba.get_num_threads()
    moved: list[int] = []
    gained: list[int] = []
    longest = 0
    counted = 0  # the entries a sweep counts
    for sweep in range(max(0, int(sweeps))):
        m = g = 0
        for v0, ptr, window in read_ahead(_read_windows(indptr, indices, wins)):
            if sweep == 0:
                lengths = np.diff(ptr)
                longest = max(longest, int(lengths.max(initial=0)))
                counted += int(np.minimum(lengths, votes).sum() if votes else lengths.sum())
            mw, gw = K.propagate_window(ptr, window, v0, label, size, int(cap), block, prop,
                                        gains, threads, votes)
            m, g = m + mw, g + gw
            del ptr, window
        moved.append(int(m))
        gained.append(int(g))
        # converged: under 1% of the nodes moved, or the moves raised the counted
        # entries that share their list's label by under 1% of them (later sweeps
        # then changed no measure of page locality tried on community graphs)
        if m < max(1, n // 100) or g < max(1, counted // 100):
            break
    if stats is not None:
        groups = size[size > 0]
        stats.sweeps, stats.moved, stats.longest = len(moved), moved, longest
        stats.gained, stats.votes = gained, votes
        stats.groups, stats.largest_group = int(groups.shape[0]), int(groups.max(initial=0))
    del size
    starts = np.zeros(n + 1, dtype=np.int64 if n + 1 >= (1 << 31) else np.int32)
    order = np.empty(n, dtype=dt)
    K.order_by_label(label, starts, order)
    return order


def reorder_peak(layout: FeatureLayout, buffer_bytes: int, longest: int | None = None,
                 votes: int = VOTES) -> int:
    """Bytes the ingest's reorder holds at its fullest (beside what the process held
    before): the largest of its :func:`reorder_phases`."""
    return max(reorder_phases(layout, buffer_bytes, longest, votes).values())


def reorder_phases(layout: FeatureLayout, buffer_bytes: int,
                   longest: int | None = None, votes: int = VOTES) -> dict[str, int]:
    """Bytes each phase of the ingest's reorder holds for ``layout.num_rows`` nodes and an
    ingest buffer of ``buffer_bytes`` (``longest``: the longest in-neighbour list, when
    known; ``votes``: :func:`locality_order`'s):

    - ``propagate``: labels and label sizes (id-sized, per node), windows of ``indices``
      and their ``indptr`` read ahead (:data:`~.read_ahead.CHUNKS_HELD` copies and one
      window mapped while copied, each ``2 / (CHUNKS_HELD + 1)`` of a quarter of the
      buffer: two quarters in all), the labels of the longest in-neighbour list over
      :data:`~ooc.storage._reorder_kernels.HASHED` when every entry is counted (a
      window's worth when ``longest`` is not known), a block's chosen labels and each
      thread's tally table (about 112 KiB);
    - ``order``: labels, counts and the order (three ids per node), then the order and
      its inverse;
    - ``permute`` (:func:`permute_rows`, and a :class:`RowPlacer`'s last pass): the
      inverse (an id per node), two buckets' rows (read and placed, or as read and laid
      out in pages) and 40 bytes a row of their destinations, sort keys and sort order
      (and :data:`BUCKET_BYTES` per bucket), and through buckets the staging buffer
      (:func:`staging_bytes`) the rows read are written from and the next bucket's rows
      and destinations, read ahead;
    - ``place`` (a :class:`RowPlacer` fed as ingest streams the rows in): the inverse and
      the streamed chunk as read (a quarter of the buffer at most), beside either the
      block placed in memory, a copy of the chunk converted to the stored dtype and 8
      bytes a row of destinations, or the staging buffer the buckets are written from
      (:func:`staging_bytes`) and the same 40 bytes a row; through buckets, a source
      converted to the stored dtype (float64 rows stored as float32) holds one more chunk
      than this.
    """
    n = int(layout.num_rows)
    it = index_dtype(n).itemsize
    window = max(1 << 20, int(buffer_bytes) // 4)
    part, buckets = _buckets(layout, buffer_bytes)
    part = min(n, part)
    pages = FeatureLayout(part, layout.dim, layout.dtype).file_bytes
    tally = numba.get_num_threads() * (K.HASHED * (it + 8) + K._TABLE * (it + 4))
    big = (0 if 0 < votes <= K.HASHED else window if longest is None
           else it * longest if longest > K.HASHED else 0)
    return {"propagate": 2 * it * n + 2 * window + big + BLOCK * it + tally,
            "order": 3 * it * n,
            "permute": it * n + 2 * pages + 40 * part + BUCKET_BYTES * buckets
            + (staging_bytes(layout, buffer_bytes) + pages + 8 * part if buckets > 1 else 0),
            "place": it * n + PAGE + (
                pages + 8 * part + 2 * min(int(buffer_bytes) // 4, n * layout.row_bytes)
                if buckets == 1 else 40 * part + BUCKET_BYTES * buckets
                + min(int(buffer_bytes) // 4, n * layout.row_bytes)
                + staging_bytes(layout, buffer_bytes))}


def rows_of(order: np.ndarray, dtype: DTypeLike | None = None) -> np.ndarray:
    """The inverse of ``order`` (``order[row] = node``): ``row_of[node] = row``, in
    ``dtype`` (default: ``order``'s)."""
    row_of = np.empty(order.shape, dtype=order.dtype if dtype is None else dtype)
    K.inverse_into(order, row_of)
    return row_of


def _write_rows(f, layout: FeatureLayout, a: int, rows: np.ndarray) -> None:
    """Write ``rows`` as rows ``a ..`` of a page-laid-out file (``a`` at a page boundary).

    Rows that fill pages exactly (no padding between them) are written as they are, the
    last page padded with zeros; others are laid out in a page buffer first."""
    local = FeatureLayout(rows.shape[0], layout.dim, layout.dtype)
    f.seek(int(layout.row_offsets(np.array([a]))[0]))
    if layout.packed:
        write_array(f, rows)
        f.write(bytes(local.file_bytes - rows.shape[0] * layout.row_bytes))
        return
    buf = np.zeros(local.file_bytes, dtype=np.uint8)
    local.view(buf)[0:rows.shape[0]] = rows
    write_array(f, buf)


class RowPlacer:
    """Feature rows that arrive in node order, written to ``dst`` with node ``v``'s row at
    row ``row_of[v]``, in memory bounded by ``buffer_bytes`` whatever the file's size.

    When the rows fit in a quarter of ``buffer_bytes`` they are placed in one block in
    memory; otherwise each row is appended, as it arrives, to the file of the bucket of
    consecutive destination rows it falls in (under ``scratch``), and :meth:`finish` loads
    one bucket at a time, places its rows and writes them to ``dst`` in order. Every byte
    is written and read sequentially; the buckets take as much disk as the rows (plus 8
    bytes a row) and are removed as they are consumed.

    Args:
        dst: the feature file to write (created by :meth:`finish`).
        layout: its :class:`FeatureLayout`.
        row_of: int32/int64 [N], a permutation of ``0 .. N-1``.
        buffer_bytes: memory the placement may use for rows.
        scratch: folder for the buckets (default: ``dst``'s).
    """

    def __init__(self, dst: Path, layout: FeatureLayout, row_of: np.ndarray,
                 buffer_bytes: int = 256 << 20, scratch: Path | None = None):
        self.dst, self.layout, self.row_of = Path(dst), layout, row_of
        self.part, self.buckets = _buckets(layout, buffer_bytes)
        scratch = Path(scratch) if scratch is not None else self.dst.parent
        self.names = [scratch / f".bucket-{k}" for k in range(self.buckets)]
        self.block: np.ndarray | None = None
        self.outs: list[DirectAppender] = []
        self.ids_out: list[DirectAppender] = []
        #: whether the buckets and ``dst`` were written and read with ``O_DIRECT`` (None:
        #: placed in memory); False where the file system refused it
        self.direct: bool | None = None
        self.staging: WriteBehind | None = None
        if self.buckets == 1:
            self.block = np.empty((layout.num_rows, layout.dim), dtype=layout.dtype)
        else:
            # the rows pass through the buckets once: O_DIRECT, gathered into one half of
            # a staging buffer while the other half is written (see direct_files)
            self.staging = WriteBehind(staging_bytes(layout, buffer_bytes))
            for name in self.names:
                self.outs.append(DirectAppender(name, self.staging))
                self.ids_out.append(DirectAppender(name.with_suffix(".ids"), self.staging))
            self.direct = all(f.direct for f in self.outs + self.ids_out)

    def add(self, start: int, rows: np.ndarray) -> None:
        """Node rows ``start .. start + len(rows)`` (``layout.dtype`` [k, dim])."""
        dest = np.asarray(self.row_of[start:start + rows.shape[0]], dtype=np.int64)
        if self.block is not None:
            self.block[dest] = rows
            return
        by = np.empty(dest.shape[0], dtype=np.int64)
        ends = np.empty(self.buckets, dtype=np.int64)
        bad = int(K.group_by_part(dest, self.layout.num_rows, self.part, self.buckets, by, ends))
        if bad >= 0:
            raise InvalidValue(f"{self.dst}: node {start + bad} is placed at row {dest[bad]}, "
                               f"outside 0 .. {self.layout.num_rows - 1}")
        begin = 0
        for k, end in enumerate(ends):  # one bucket's rows gathered and written at a time
            if end > begin:
                self.outs[k].append_take(rows, by[begin:end])
                self.ids_out[k].append_take(dest, by[begin:end])
            begin = int(end)

    def finish(self) -> int:
        """Write ``dst`` from the placed rows; returns the number of buckets (1: placed in
        memory). Raises :class:`InvalidValue` when a bucket does not hold its rows
        (``row_of`` is not a permutation, or rows are missing)."""
        n = self.layout.num_rows
        for f in self.outs + self.ids_out:
            f.close()
        self.outs, self.ids_out = [], []
        if self.staging is not None:
            self.staging.close()
            self.staging = None
        if self.block is not None:
            block, self.block = self.block, None
            with open(self.dst, "wb") as fout:
                _write_rows(fout, self.layout, 0, block)
            return 1
        fd, direct = open_direct(self.dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.direct = bool(self.direct and direct)
        # the next bucket is read while this one is placed and written (the reads and
        # writes release the GIL): two buckets' buffers in turn and one of pages, taken
        # once here (fresh buffers for every bucket cost their page faults each time)
        lay, part = self.layout, min(n, self.part)
        pairs = [(aligned_empty(padded_bytes(8 * part)),
                  aligned_empty(padded_bytes(part * lay.row_bytes))) for _ in range(2)]
        pages = aligned_empty(FeatureLayout(part, lay.dim, lay.dtype).file_bytes)
        pages[:] = 0  # the padding between rows is never written
        seen = np.zeros(part, dtype=np.uint8)
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="ooc-bucket") as pool:
                def read_bucket(k: int) -> Future:
                    return pool.submit(_read_bucket, self.names[k], lay, pairs[k % 2])

                ahead = read_bucket(0)
                for k, name in enumerate(self.names):
                    bucket = ahead.result()
                    if k + 1 < self.buckets:  # into the other pair: this one is placed now
                        ahead = read_bucket(k + 1)
                    _write_bucket(fd, lay, name, k * self.part,
                                  min(n, k * self.part + self.part), bucket, pages, seen)
                    del bucket
        finally:
            os.close(fd)
        return self.buckets

    def close(self) -> None:
        """Drop the block and remove what is left of the buckets (after an error too)."""
        for f in self.outs + self.ids_out:
            f.abandon()
        self.outs, self.ids_out = [], []
        if self.staging is not None:  # nothing in flight: abandon waited for it
            self.staging.close()
            self.staging = None
        self.block = None
        for name in self.names if self.buckets > 1 else ():
            name.unlink(missing_ok=True)
            name.with_suffix(".ids").unlink(missing_ok=True)


def permute_rows(src: Path, dst: Path, layout: FeatureLayout, row_of: np.ndarray,
                 buffer_bytes: int = 256 << 20, scratch: Path | None = None,
                 remove_src: bool = False) -> int:
    """Write the feature file ``src`` to ``dst`` with node ``v``'s row at row ``row_of[v]``:
    ``src`` read front to back into a :class:`RowPlacer` (same memory bound and buckets).
    With ``remove_src`` the source is deleted once read, so the disk holds at most 8 bytes
    a row and one bucket more than ``src``.

    Args:
        src, dst: feature files in ``layout`` (``dst`` is created).
        layout: the files' :class:`FeatureLayout`.
        row_of: int32/int64 [N], a permutation of ``0 .. N-1``.
        buffer_bytes: memory the permutation may use for rows.
        scratch: folder for the buckets (default: ``dst``'s).

    Returns:
        The number of buckets (1 when permuted in memory).
    """
    n = layout.num_rows
    placer = RowPlacer(dst, layout, row_of, buffer_bytes, scratch)
    try:
        with open(src, "rb") as fin:
            for a in range(0, n, placer.part):
                b = min(n, a + placer.part)
                rows = read_rows(fin, layout, a, b)
                placer.add(a, rows)
                del rows  # before the next chunk is read beside it
        if remove_src:
            Path(src).unlink()
        return placer.finish()
    finally:
        placer.close()


#: Bytes each bucket holds while rows are placed: its two open files and the tail under a
#: page that each file's last append left (see :class:`~.direct_files.DirectAppender`).
BUCKET_BYTES = 1024 + 2 * PAGE
#: Most bytes of the staging buffer rows are gathered into on their way to the buckets.
STAGING_BYTES = 16 << 20


def staging_bytes(layout: FeatureLayout, buffer_bytes: int) -> int:
    """A :class:`RowPlacer`'s staging buffer: :data:`STAGING_BYTES`, or a sixteenth of
    ``buffer_bytes`` where smaller, in whole pages and never under twice two pages and a
    row (it is used in halves: :class:`~.direct_files.WriteBehind`)."""
    want = min(STAGING_BYTES, int(buffer_bytes) // 16)
    return padded_bytes(max(want, 2 * (2 * PAGE + padded_bytes(layout.row_bytes))))


def _buckets(layout: FeatureLayout, buffer_bytes: int) -> tuple[int, int]:
    """``(rows per bucket, buckets)`` of :func:`permute_rows`: a bucket's rows take at
    most a quarter of ``buffer_bytes`` (whole pages of rows, at least one page), unless
    that makes more than :data:`MAX_BUCKETS` buckets; 1 bucket: permuted in memory."""
    n, rb = layout.num_rows, layout.row_bytes
    unit = layout.rows_per_page or 1
    part = max(unit, (max(1, int(buffer_bytes) // 4) // rb) // unit * unit)
    buckets = -(-n // part) if n else 1
    if buckets > MAX_BUCKETS:  # few enough files open at once; each bucket a little larger
        per_bucket = -(-n // MAX_BUCKETS)
        part = -(-per_bucket // unit) * unit
        buckets = -(-n // part)
    return part, buckets


def _read_bucket(name: Path, layout: FeatureLayout, bufs: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A bucket's destinations (``name.ids``, int64 [k]) and rows (``name``,
    ``layout.dtype`` [k, dim]), read into ``bufs`` (page-aligned uint8, large enough) with
    ``O_DIRECT`` where the file system takes it."""
    ids_buf, rows_buf = bufs
    return (read_direct(name.with_suffix(".ids"), np.int64, ids_buf),
            read_direct(name, layout.dtype, rows_buf).reshape(-1, layout.dim))


def _write_bucket(fd: int, layout: FeatureLayout, name: Path, a: int, b: int,
                  bucket: tuple[np.ndarray, np.ndarray], pages: np.ndarray,
                  seen: np.ndarray) -> None:
    """The second pass of :func:`permute_rows` for one bucket: its rows placed by their
    destinations (``bucket``: ``(ids, rows)`` from :func:`_read_bucket`, ids in
    ``a .. b-1``) into ``pages`` (page-aligned uint8, the bytes of a bucket's rows laid
    out in pages, zero wherever no row lies) and written as rows ``a .. b-1`` of the file
    ``fd`` (``a`` at a page boundary; whole pages, written with ``O_DIRECT`` where the file
    system takes it); the bucket's files are then removed. ``seen`` (uint8, a bucket's
    rows) is scratch.

    Raises:
        InvalidValue: the bucket does not hold each of the rows ``a .. b-1`` once
            (``row_of`` is not a permutation).
    """
    ids, rows = bucket
    k = b - a
    if ids.shape[0] != k or rows.shape[0] != k:
        raise InvalidValue(f"{name}: bucket holds {ids.shape[0]} rows, expected "
                           f"{k} (row_of is not a permutation)")
    rpp = layout.rows_per_page
    group_rows, group_bytes = (rpp, PAGE) if rpp else (1, layout.pages_per_row * PAGE)
    seen[:k] = 0
    bad = int(K.place_rows(pages, group_rows, group_bytes,
                           rows.view(np.uint8).reshape(k, layout.row_bytes), ids, a, seen[:k]))
    if bad or (k and int(np.count_nonzero(seen[:k])) != k):
        raise InvalidValue(f"{name}: bucket does not hold each of rows {a} .. {b - 1} once "
                           f"(row_of is not a permutation)")
    local = FeatureLayout(k, layout.dim, layout.dtype)
    buf = pages[:local.file_bytes]
    if k:  # after the last row, the bytes of the rows the last bucket held there
        buf[int(local.row_offsets(np.array([k - 1]))[0]) + layout.row_bytes:] = 0
    pwrite_pages(fd, buf, int(layout.row_offsets(np.array([a]))[0]))
    name.unlink()
    name.with_suffix(".ids").unlink()
