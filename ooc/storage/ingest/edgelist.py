"""Streaming, memory-bounded conversion of edge lists to dataset format v1.

The edge source is read in chunks, several times:

1. **count pass** — in-degree of every node (O(N) memory), validating ids;
2. **scatter passes** — the nodes are cut into windows whose CSC segment fits
   the buffer; for each window the source is read again and the sources of
   edges ending in the window are scattered into an in-memory segment, every
   node's neighbour list is sorted (and deduplicated) by a numba kernel and
   the segment is appended to ``indices.bin`` with ``pwrite``.

Memory is O(N) (degrees and ``indptr``) plus the ``buffer`` (segment + one
input chunk); the number of passes over the input is ``1 + windows`` where
``windows ~ E * itemsize / (3/4 * buffer)``, or, from
:data:`~.edge_buckets.MIN_WINDOWS` windows on, two: a **routing pass** writes each
stored entry once to the file of its target range, and each window reads only its
own files (:mod:`.edge_buckets`). Neighbour lists come out sorted
by source id. Everything goes through :class:`~ooc.storage.DatasetWriter`, so
a failed run leaves no folder that ``open_dataset`` accepts.
"""
from __future__ import annotations

import gzip
import os
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ooc.core.errors import InvalidValue, OocError, setting
from ooc.storage.atomic import replace_refusal
from ooc.storage.dataset import MAX_FEATURE_DIM, replace_problem
from ooc.storage.direct_files import read_range, write_all
from ooc.storage.ingest import _kernels as K
from ooc.storage.ingest import limits as L
from ooc.storage.ingest.edge_buckets import MIN_WINDOWS, EdgeBuckets, range_ends
from ooc.storage.layout import PAGE, FeatureLayout, index_dtype
from ooc.storage.read_ahead import CHUNKS_HELD, read_ahead
from ooc.storage.reorder import STAGING_BYTES
from ooc.storage.link_split import LinkSplitSpec
from ooc.storage.writer import DatasetWriter, class_ids

DEFAULT_BUFFER = 512 << 20
EDGE_FORMATS = ("auto", "text", "npy", "bin32", "bin64")


def input_error(path, problem: str) -> OocError:
    """The one-line error for a problem in input file ``path``."""
    return OocError(f"{os.fspath(path)}: {problem}")


def progress_bar(total: int | None, desc: str, enabled: bool, unit: str = "B"):
    """The progress bar of every storage pass (ingest, verify): ``total`` units of
    ``unit`` (bytes binary-scaled), hidden unless ``enabled``, cleared when done."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True,
                unit_divisor=1024 if unit == "B" else 1000,
                disable=not enabled, leave=False, dynamic_ncols=True)


def check_out(out, overwrite: bool, inputs=()) -> Path:
    """Refuse an output early (before any pass over the input) when it exists
    and may not be replaced: without ``overwrite``, when it is not an ooc
    dataset folder, or when it is or holds one of ``inputs`` (paths or None)."""
    out = Path(out)
    if not os.path.lexists(out):
        return out
    if not overwrite:
        raise input_error(out, "already exists (pass --overwrite to replace it)")
    problem = replace_problem(out) or replace_refusal(out, tuple(inputs), "dataset")
    if problem:
        raise input_error(out, problem)
    return out


def check_input(path) -> Path:
    """``path`` as a :class:`~pathlib.Path` once it is an existing, readable file; else a
    one-line input error."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, "not found")
    if not path.is_file():
        raise input_error(path, "not a file")
    if not os.access(path, os.R_OK):
        raise input_error(path, "not readable (permission denied)")
    return path


# -- .npy files read in chunks without mapping them -----------------------------

#: Reads of at least this many bytes bypass the page cache (see
#: :func:`~ooc.storage.direct_files.read_range`).
DIRECT_READ_MIN = 4 << 20


class NpyReader:
    """A ``.npy`` file read in chunks through plain reads (so RSS stays bounded).

    Validates the header and that the file holds all the data the header
    promises (a truncated file is an error naming it). ``start`` and ``name``
    read an array stored at byte ``start`` of a larger file (an uncompressed
    member of an ``.npz``), named ``name`` in errors.
    """

    def __init__(self, path, start: int = 0, name: str | None = None, size: int | None = None):
        self.file = check_input(path)
        self.path = Path(name) if name is not None else self.file
        try:
            with open(self.file, "rb") as f:
                f.seek(start)
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                self.offset = f.tell()
        except (ValueError, OSError, EOFError, SyntaxError) as e:
            raise input_error(self.path, "not a .npy file or header truncated "
                              f"({str(e).splitlines()[0]})") from None
        if dtype.hasobject:
            raise input_error(self.path, "holds Python objects (dtype object); expected a numeric array")
        self.shape, self.fortran, self.dtype = tuple(shape), bool(fortran), np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        need = self.offset - start + self.size * self.dtype.itemsize
        have = size if size is not None else self.file.stat().st_size - start
        if have < need:
            raise input_error(self.path, f"truncated: {have} bytes, the header promises {need}")
        self.nbytes = self.size * self.dtype.itemsize

    def read_flat(self, start: int, count: int, once: bool = False) -> np.ndarray:
        """Elements ``start .. start+count`` of the array in file order. ``once``: bytes
        this ingest reads only once (feature rows), read with ``O_DIRECT``
        (:func:`~ooc.storage.direct_files.read_range`) where large enough and the file
        system takes it; edges,
        read again by every scatter window, go through the page cache."""
        if once and count * self.dtype.itemsize >= DIRECT_READ_MIN:
            a = read_range(self.file, self.offset + start * self.dtype.itemsize, count,
                           self.dtype)
            if a is not None:
                if a.size != count:
                    raise input_error(self.path, "truncated while reading")
                return a
        with open(self.file, "rb") as f:
            f.seek(self.offset + start * self.dtype.itemsize)
            a = np.fromfile(f, dtype=self.dtype, count=count)
        if a.size != count:
            raise input_error(self.path, "truncated while reading")
        return a

    def read_all(self) -> np.ndarray:
        a = self.read_flat(0, self.size)
        return a.reshape(self.shape, order="F" if self.fortran else "C")

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows ``a:b`` of a 2-D array, C-contiguous."""
        n, d = self.shape
        if not self.fortran:
            return self.read_flat(a * d, (b - a) * d, once=True).reshape(b - a, d)
        mm = np.memmap(self.file, dtype=self.dtype, mode="r", offset=self.offset,
                       shape=self.shape, order="F")
        return np.ascontiguousarray(mm[a:b])


# -- edge sources --------------------------------------------------------------

class EdgeSource:
    """A re-readable stream of edge chunks ``(src, dst, first_edge, nbytes)``."""

    path: Path | str = "<edges>"
    nbytes: int | None = None
    unit = "B"  # what ``nbytes`` (progress total) counts

    def chunks(self, chunk_edges: int, num_nodes: int) -> Iterator[tuple[np.ndarray, np.ndarray, int, int]]:
        raise NotImplementedError

    def where(self, edge: int) -> str:
        return f"edge {edge}"

    def max_edges(self) -> int | None:
        """Most edges the source can hold (None: unknown)."""
        return getattr(self, "num_edges", None)

    def describe(self) -> dict[str, Any]:
        return {"path": os.fspath(self.path)}


class BinEdges(EdgeSource):
    """Raw binary (src, dst) pairs of int32 or int64, native byte order."""

    def __init__(self, path, dtype):
        self.path = check_input(path)
        self.dtype = np.dtype(dtype)
        size = self.path.stat().st_size
        pair = 2 * self.dtype.itemsize
        if size % pair:
            raise input_error(self.path, f"size {size} bytes is not a multiple of {pair} "
                                  f"({self.dtype.name} pairs): truncated or wrong --format")
        self.num_edges = size // pair
        self.nbytes = size

    def chunks(self, chunk_edges, num_nodes):
        with open(self.path, "rb") as f:
            for a in range(0, self.num_edges, chunk_edges):
                cnt = min(chunk_edges, self.num_edges - a)
                pairs = np.fromfile(f, dtype=self.dtype, count=2 * cnt)
                if pairs.size != 2 * cnt:
                    raise input_error(self.path, "truncated while reading (file changed?)")
                pairs = pairs.reshape(cnt, 2)
                yield (pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64), a,
                       cnt * 2 * self.dtype.itemsize)

    def describe(self):
        return {"path": str(self.path), "format": f"bin{self.dtype.itemsize * 8}"}


class NpyEdges(EdgeSource):
    """A ``.npy`` integer array of shape [2, E] (PyG ``edge_index``) or [E, 2]."""

    def __init__(self, path, reader: NpyReader | None = None):
        self.r = reader if reader is not None else NpyReader(path)
        self.path = self.r.path
        shape = self.r.shape
        if len(shape) != 2 or 2 not in shape:
            raise input_error(self.path, f"edge array has shape {shape}; expected [2, E] or [E, 2]")
        if self.r.dtype.kind not in "iu":
            raise input_error(self.path, f"edge array has dtype {self.r.dtype}; expected integers")
        rows_first = shape[0] == 2  # [2, E], PyG convention (also for [2, 2])
        self.num_edges = shape[1] if rows_first else shape[0]
        self.interleaved = rows_first == self.r.fortran
        self.nbytes = self.r.nbytes

    def chunks(self, chunk_edges, num_nodes):
        e = self.num_edges
        for a in range(0, e, chunk_edges):
            cnt = min(chunk_edges, e - a)
            if self.interleaved:  # [E, 2]: each column copied out, as the kernels take
                p = self.r.read_flat(2 * a, 2 * cnt).reshape(cnt, 2)
                s = np.ascontiguousarray(p[:, 0], dtype=np.int64)
                d = np.ascontiguousarray(p[:, 1], dtype=np.int64)
                del p
            else:
                s, d = self.r.read_flat(a, cnt), self.r.read_flat(e + a, cnt)
            yield (s.astype(np.int64, copy=False), d.astype(np.int64, copy=False), a,
                   2 * cnt * self.r.dtype.itemsize)

    def describe(self):
        return {"path": str(self.path), "format": "npy"}


_TXT_PROBLEMS = {
    K.TXT_MALFORMED: "malformed line (expected two integer node ids)",
    K.TXT_NEGATIVE: "negative node id",
    K.TXT_OVERFLOW: "node id too large",
    K.TXT_RANGE: "node id out of range",
}


class TextEdges(EdgeSource):
    """Whitespace- or comma-separated text, one ``src dst`` pair per line;
    ``#``/``%`` comment lines and blank lines skipped; ``.gz`` read through
    gzip. ``header=True`` skips the first line."""

    nbytes: int  # the file's size, always known

    def __init__(self, path, header: bool = False, block_bytes: int = 16 << 20):
        self.path = check_input(path)
        self.header = header
        self.block_bytes = block_bytes
        self.gz = self.path.suffix == ".gz"
        self.nbytes = self.path.stat().st_size

    def _open(self):
        return gzip.open(self.path, "rb") if self.gz else open(self.path, "rb")

    def max_edges(self) -> int | None:
        return None if self.gz else self.nbytes // 4  # the shortest line is "0 1\n"

    def chunks(self, chunk_edges, num_nodes):
        block = max(1 << 16, min(self.block_bytes, chunk_edges * 8))
        line0 = 0  # lines before the current body
        first_edge = 0
        carry = b""
        skip_header = self.header
        raw_pos = 0
        try:
            with open(self.path, "rb") as raw:
                f = gzip.GzipFile(fileobj=raw, mode="rb") if self.gz else raw
                while True:
                    data = f.read(block)
                    eof = not data
                    buf = carry + data if carry else data
                    if not eof:
                        cut = buf.rfind(b"\n")
                        if cut < 0:
                            if len(buf) > (64 << 20):
                                raise input_error(self.path, f"line {line0 + 1}: line longer than 64 MiB")
                            carry = buf
                            continue
                        body, carry = buf[:cut + 1], buf[cut + 1:]
                    else:
                        body, carry = buf, b""
                        if not body:
                            break
                    if skip_header:
                        nl = body.find(b"\n")
                        body = body[nl + 1:] if nl >= 0 else b""
                        line0 += 1
                        skip_header = False
                    arr = np.frombuffer(body, dtype=np.uint8)
                    nlines = int(np.count_nonzero(arr == 10))
                    src = np.empty(nlines + 1, dtype=np.int64)
                    dst = np.empty(nlines + 1, dtype=np.int64)
                    ne, _, status, bad, val = K.parse_edges_text(arr, src, dst, num_nodes)
                    if status != K.TXT_OK:
                        what = _TXT_PROBLEMS[status]
                        if status in (K.TXT_NEGATIVE, K.TXT_RANGE):
                            what += f" {val}" + (f" (num_nodes is {num_nodes})"
                                                 if status == K.TXT_RANGE else "")
                        text = _line_text(body, bad)
                        raise input_error(self.path, f"line {line0 + bad + 1}: {what}: {text!r}")
                    line0 += nlines
                    pos = raw.tell()
                    yield src[:ne], dst[:ne], first_edge, pos - raw_pos
                    raw_pos = pos
                    first_edge += ne
                    if eof:
                        break
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise input_error(self.path, f"not a valid or a truncated gzip file ({e})") from None

    def describe(self):
        return {"path": str(self.path), "format": "text" + (".gz" if self.gz else "")}


def _line_text(body: bytes, line: int, limit: int = 60) -> str:
    start = 0
    for _ in range(line):
        start = body.find(b"\n", start) + 1
    end = body.find(b"\n", start)
    text = body[start:end if end >= 0 else len(body)].decode("utf-8", "replace").rstrip("\r")
    return text if len(text) <= limit else text[:limit] + "..."


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head:
        return True
    allowed = set(b"0123456789 \t\r\n,#%-+.eE") | set(range(32, 127))
    return any(c not in allowed for c in head)


def open_edges(path, fmt: str = "auto", header: bool = False) -> EdgeSource:
    """The edge source for ``path`` in ``fmt`` (``auto`` sniffs the file)."""
    path = check_input(path)
    if fmt not in EDGE_FORMATS:
        raise InvalidValue(f"unknown edge format {fmt!r} (one of {', '.join(EDGE_FORMATS)})")
    if fmt == "auto":
        with open(path, "rb") as f:
            head = f.read(4096)
        if head.startswith(b"\x93NUMPY"):
            fmt = "npy"
        elif head.startswith(b"\x1f\x8b"):
            if path.suffix != ".gz":
                raise input_error(path, "is gzip-compressed; name it *.gz to read it as gzipped text")
            fmt = "text"
        elif path.suffix in (".npy",):
            raise input_error(path, "not a .npy file (bad magic)")
        elif _looks_binary(head):
            raise input_error(path, "looks binary and is not .npy; "
                                    "for raw pairs pass --format bin32 or bin64")
        else:
            fmt = "text"
    if fmt == "npy":
        return NpyEdges(path)
    if fmt in ("bin32", "bin64"):
        return BinEdges(path, np.int32 if fmt == "bin32" else np.int64)
    return TextEdges(path, header=header)


# -- the two passes ------------------------------------------------------------

def _chunks(source: EdgeSource, buffer_bytes: int, num_nodes: int
            ) -> Iterator[tuple[np.ndarray, np.ndarray, int, int]]:
    """``source``'s chunks as a pass takes them, each next one read ahead in a thread: of
    32 bytes an edge (int64 sources and targets and their copies),
    :data:`~ooc.storage.read_ahead.CHUNKS_HELD` of them in a quarter of the buffer."""
    edges = int(max(1 << 14, min(1 << 23, (buffer_bytes // (4 * CHUNKS_HELD)) // 32)))
    return read_ahead(source.chunks(edges, num_nodes))


def count_pass(source: EdgeSource, num_nodes: int, undirected: bool, drop_self: bool,
               buffer_bytes: int = DEFAULT_BUFFER, progress: bool = True) -> np.ndarray:
    """In-degrees (int64 [N]) after reverse edges / self-loop removal.

    ``num_nodes`` < 0 means max id + 1. Raises OocError naming the source and
    the first bad edge for ids that are negative or out of range.
    """
    known = num_nodes >= 0
    limit = num_nodes if known else L.id_node_limit(source.max_edges())
    counts = np.zeros(num_nodes if known else min(1 << 16, limit), dtype=np.int64)
    maxid = -1
    with progress_bar(source.nbytes, "count", progress, source.unit) as bar:
        for src, dst, first, nb in _chunks(source, buffer_bytes, num_nodes):
            bad, mx = K.first_bad_id(src, dst, num_nodes)
            if bad >= 0:
                s, d = int(src[bad]), int(dst[bad])
                v = s if (s < 0 or (known and s >= num_nodes)) else d
                what = "negative node id" if v < 0 else f"node id out of range [0, {num_nodes})"
                raise input_error(source.path, f"{source.where(first + bad)}: {what}: {v}")
            if not known and mx >= limit:
                k = int(np.argmax(np.maximum(src, dst)))
                raise input_error(source.path, f"{source.where(first + k)}: node id {int(mx)} would make "
                                        f"{int(mx) + 1} nodes, more than {limit} (the limit from the "
                                        f"input's size and the available memory); pass --num-nodes "
                                        f"if the graph really has that many")
            if not known and mx >= counts.shape[0]:
                grown = np.zeros(min(limit, max(2 * counts.shape[0], int(mx) + 1)), dtype=np.int64)
                grown[:counts.shape[0]] = counts
                counts = grown
            maxid = max(maxid, int(mx))
            K.count_in_degrees(src, dst, counts, undirected, drop_self)
            bar.update(nb)
    if not known:
        counts = counts[:maxid + 1].copy()
    return counts


def check_not_empty(source: EdgeSource, counts: np.ndarray) -> None:
    """Refuse a graph with no nodes or no edges (after self-loop removal)."""
    if counts.shape[0] == 0 or not counts.any():
        raise input_error(source.path, "the graph has no edges (empty input, only comments, or every "
                                "edge a removed self-loop); ooc needs at least one edge")


def _windows(counts: np.ndarray, cap: int, max_nodes: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` windows of at most ``max_nodes`` nodes whose in-degrees (``counts``)
    sum to at most ``cap`` each (a node over ``cap`` alone)."""
    total = int(counts.sum())
    ends = np.empty(2 * total // max(1, cap) + counts.shape[0] // max_nodes + 2, dtype=np.int64)
    k = int(K.window_ends(counts, cap, max_nodes, ends)) if counts.shape[0] else 0
    starts = np.concatenate([[0], ends[:k - 1]]) if k else ends[:0]
    return list(zip(starts.tolist(), ends[:k].tolist(), strict=True))


def scatter_passes(w: DatasetWriter, source: EdgeSource, counts: np.ndarray, undirected: bool,
                   dedup: bool, drop_self: bool, buffer_bytes: int = DEFAULT_BUFFER,
                   progress: bool = True) -> dict[str, int]:
    """Fill ``indptr.npy`` and ``indices.bin`` of ``w`` from ``source``.

    ``counts`` (the count pass's in-degrees) is overwritten with the final
    degrees. Returns pass statistics.
    """
    n = w.num_nodes
    assert counts.shape == (n,)
    e_alloc = int(counts.sum())
    idt = index_dtype(n)
    w.indices(e_alloc)  # reserve the file (a full disk fails here)
    assert w.tmp is not None  # inside the writer's with block
    path = w.tmp / "indices.bin"
    # a window: 3/4 of the buffer for its ids, 1/4 for its nodes' pointers, cursors and
    # degrees (32 bytes a node)
    cap = max(1, int(buffer_bytes * 3 // 4) // idt.itemsize)
    windows = _windows(counts, cap, max(1, int(buffer_bytes) // 128)) if e_alloc else []
    # the final indptr goes to its file window by window: nothing over N is held but
    # ``counts`` (the window's cursors and pointers are the window's size)
    indptr = w.indptr_sink()
    indptr.write(np.zeros(1, np.int64))
    if not windows:
        indptr.write(np.zeros(n, np.int64))
    out_pos = 0
    buckets: EdgeBuckets | None = None
    files: list[tuple[int, int]] = []
    if len(windows) >= MIN_WINDOWS:
        ends, files = range_ends(counts, windows, idt.itemsize)
        buckets = route_pass(w, source, ends, undirected, drop_self, buffer_bytes, progress)
    fd = os.open(path, os.O_WRONLY)
    try:
        for wi, (lo, hi) in enumerate(windows):
            ptr = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(counts[lo:hi], out=ptr[1:])
            m = int(ptr[-1])
            seg = np.empty(m, dtype=idt)
            cursor = ptr[:-1].copy()
            if buckets is not None:
                r0, r1 = files[wi]
                if int(buckets.counts[r0:r1].sum()) != m:
                    raise input_error(source.path, "changed between the count pass and the routing")
                pieces = buckets.window_entries(r0, r1, buffer_bytes // (8 * CHUNKS_HELD))
                for part in read_ahead(pieces):
                    if K.scatter_entries(part, lo, cursor, ptr[1:], seg) >= 0:
                        raise input_error(source.path, "changed between the count pass and the "
                                                "routing")
            else:
                with progress_bar(source.nbytes, f"scatter {wi + 1}/{len(windows)}", progress,
                               source.unit) as bar:
                    for src, dst, _, nb in _chunks(source, buffer_bytes, n):
                        K.scatter_window(src, dst, lo, hi, cursor, seg, undirected, drop_self)
                        bar.update(nb)
            if not np.array_equal(cursor, ptr[1:]):
                raise input_error(source.path, "changed between the count pass and the scatter pass")
            newdeg = np.empty(hi - lo, dtype=np.int64)
            K.sort_segments(seg, ptr, dedup, newdeg)
            k = int(K.compact_segments(seg, ptr, newdeg)) if dedup else m
            write_all(fd, seg[:k].data.cast("B"), out_pos * idt.itemsize)
            counts[lo:hi] = newdeg
            indptr.write(out_pos + np.cumsum(newdeg))
            out_pos += k
            del seg
        os.fsync(fd)
    finally:
        os.close(fd)
        if buckets is not None:
            buckets.close()
    indptr.close()
    assert w.num_edges == out_pos
    if out_pos != e_alloc:  # deduplication removed edges
        w.shrink_indices(out_pos)
    return {"windows": len(windows), "passes": 2 if buckets is not None else 1 + len(windows),
            "routed": buckets is not None, "edges_before_dedup": e_alloc}


def route_pass(w: DatasetWriter, source: EdgeSource, ends: np.ndarray, undirected: bool,
               drop_self: bool, buffer_bytes: int, progress: bool) -> EdgeBuckets:
    """Read ``source`` once more and route every stored entry to the file of its target
    range (``ends``: int64, each range's end); see :mod:`.edge_buckets`."""
    assert w.tmp is not None  # inside the writer's with block
    n = w.num_nodes
    buckets = EdgeBuckets(w.tmp, ends, index_dtype(n),
                          min(STAGING_BYTES, int(buffer_bytes) // 16))
    try:
        with progress_bar(source.nbytes, "route", progress, source.unit) as bar:
            for src, dst, first, nb in _chunks(source, buffer_bytes, n):
                bad = buckets.route(src, dst, undirected, drop_self)
                if bad >= 0:
                    raise input_error(source.path, f"{source.where(first + bad)}: node id out of "
                                            f"range [0, {n}) (the file changed after the "
                                            "count pass)")
                bar.update(nb)
        buckets.finish()
    except BaseException:
        buckets.close()
        raise
    return buckets


# -- features, labels, splits --------------------------------------------------

class FeatureSink:
    """Writes feature rows, in node order, into ``features.bin`` of a writer: with
    ``pwrite``, page-aligned chunks at a time (no memmap, so RSS stays bounded), or, when
    the writer stores rows in a locality order and its adjacency is written, straight into
    that order through the writer's :class:`~ooc.storage.reorder.RowPlacer` (the file is
    then written once, by :meth:`sync`)."""

    def __init__(self, w: DatasetWriter):
        self.w = w
        self.layout = w.layout
        self.placer = w.row_placer()
        if self.placer is None:
            w.features()  # reserve the file
        assert w.tmp is not None  # inside the writer's with block
        self.path = w.tmp / "features.bin"

    def chunk_rows(self, budget_bytes: int) -> int:
        """Rows per chunk: a multiple of rows_per_page within ``budget_bytes``."""
        lay = self.layout
        if lay.rows_per_page:
            pages = max(1, budget_bytes // 4096)
            return pages * lay.rows_per_page
        return max(1, budget_bytes // (lay.pages_per_row * 4096))

    def write(self, start: int, rows: np.ndarray) -> None:
        lay = self.layout
        if lay.rows_per_page and start % lay.rows_per_page:
            raise InvalidValue("feature chunks must start at a page boundary")
        # rows placed in the locality order, or rows that fill whole pages with no padding
        # (the rows' own bytes are the file's; it was allocated zeroed, so a last partial
        # page needs no padding), go as converted to the stored dtype
        if self.placer is not None or (lay.rows_per_page
                                       and lay.rows_per_page * lay.row_bytes == PAGE):
            with np.errstate(over="ignore"):  # an overflow to inf is counted, not raised
                buf = np.ascontiguousarray(rows, dtype=lay.dtype)
            self.w.check_features(start, buf)
            if self.placer is not None:
                self.placer.add(start, buf)
                return
        else:
            local = FeatureLayout(rows.shape[0], lay.dim, lay.dtype)
            buf = np.zeros(local.file_bytes, dtype=np.uint8)
            view = local.view(buf)
            view[0:rows.shape[0]] = rows
            self.w.check_features(start, view[0:rows.shape[0]])
        fd = os.open(self.path, os.O_WRONLY)
        try:
            write_all(fd, buf.data.cast("B"), int(lay.row_offsets(np.array([start]))[0]))
        finally:
            os.close(fd)

    def sync(self) -> None:
        if self.placer is not None:
            self.w.finish_placed()
            self.placer = None
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_features_npy(w: DatasetWriter, reader: NpyReader, buffer_bytes: int, progress: bool) -> None:
    """Copy the feature rows of ``reader`` (a ``.npy`` file) into the writer's ``features.bin``,
    in pieces read ahead of the writes."""
    sink = FeatureSink(w)
    n = w.num_nodes
    step = sink.chunk_rows(max(1 << 20, buffer_bytes // (4 * CHUNKS_HELD)))
    pieces = ((a, reader.rows(a, min(n, a + step))) for a in range(0, n, step))
    with progress_bar(n, "features", progress, unit="rows") as bar:
        for a, rows in read_ahead(pieces):
            sink.write(a, rows)
            bar.update(rows.shape[0])
    sink.sync()


def write_constant_features(w: DatasetWriter, value: float = 1.0) -> None:
    """Fill the writer's ``features.bin`` with ``value`` in every column (float32)."""
    sink = FeatureSink(w)
    n = w.num_nodes
    step = sink.chunk_rows(16 << 20)
    for a in range(0, n, step):
        b = min(n, a + step)
        sink.write(a, np.full((b - a, w.layout.dim), value, dtype=np.float32))
    sink.sync()


def open_features(path, num_nodes: int | None = None, reader: NpyReader | None = None
                  ) -> NpyReader:
    """Open a ``.npy`` feature file (or check ``reader``): two dimensions, numbers, between 1
    and ``MAX_FEATURE_DIM`` columns, ``num_nodes`` rows when given; else a one-line input
    error."""
    r = reader if reader is not None else NpyReader(path)
    if len(r.shape) != 2:
        raise input_error(r.path, f"features have shape {r.shape}; expected [num_nodes, dim]")
    if r.dtype.kind not in "fiub":
        raise input_error(r.path, f"features have dtype {r.dtype}; expected numbers")
    if r.shape[1] < 1:
        raise input_error(r.path, "features have zero columns")
    if r.shape[1] > MAX_FEATURE_DIM:
        raise input_error(r.path, f"features have {r.shape[1]} columns, more than {MAX_FEATURE_DIM}")
    if num_nodes is not None and r.shape[0] != num_nodes:
        raise input_error(r.path, f"features have {r.shape[0]} rows, the graph has {num_nodes} nodes")
    return r


def load_labels(path, num_nodes: int) -> tuple[np.ndarray, int]:
    """Labels int64 [N] (-1 unlabeled; NaN in a float file means unlabeled), checked by
    :func:`~ooc.storage.writer.class_ids` in the file's own dtype."""
    r = NpyReader(path)
    a = r.read_all()
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise input_error(r.path, f"labels have shape {r.shape}; expected [{num_nodes}]")
    if a.shape[0] != num_nodes:
        raise input_error(r.path, f"labels have {a.shape[0]} entries, the graph has {num_nodes} nodes")
    a = class_ids(a, str(r.path))
    return a, int(a.max() + 1) if a.size else 0


def load_split(path, num_nodes: int) -> np.ndarray:
    """Node ids (int64) from a ``.npy`` of ids or a boolean mask of length N."""
    r = NpyReader(path)
    a = r.read_all()
    if a.dtype == np.bool_:
        if a.shape != (num_nodes,):
            raise input_error(r.path, f"boolean mask has shape {a.shape}; expected ({num_nodes},)")
        return np.flatnonzero(a).astype(np.int64)
    if a.dtype.kind not in "iu":
        raise input_error(r.path, f"split has dtype {a.dtype}; expected integer node ids or a boolean mask")
    a = a.reshape(-1).astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= num_nodes):
        v = int(a.min()) if a.min() < 0 else int(a.max())
        raise input_error(r.path, f"node id {v} out of range [0, {num_nodes})")
    return a


def labelled_split(labels: np.ndarray, train: float, val: float, seed: int) -> list[np.ndarray]:
    """The labelled nodes (``labels >= 0``) in a seeded random order, cut into train
    (``train`` of them), validation (``val``) and test (the rest); int64 ids, sorted."""
    if not (0 <= train and 0 <= val and train + val <= 1):
        raise InvalidValue(f"split fractions must be >= 0 and sum to at most 1, got {train}, {val}")
    ids = np.flatnonzero(labels >= 0)
    ids = ids[np.random.default_rng(seed).permutation(ids.shape[0])]
    a, b = int(round(train * ids.shape[0])), int(round((train + val) * ids.shape[0]))
    return [np.sort(part).astype(np.int64) for part in (ids[:a], ids[a:b], ids[b:])]


# -- the public entry point ----------------------------------------------------

def _node_count_hint(num_nodes: int | None, feat: NpyReader | None, labels: Any) -> int:
    """The node count known before the count pass, checked against :mod:`.limits`:
    ``num_nodes``, else the row count of the features ``feat``, else the length of the
    labels file ``labels`` (a path or None), else -1 (the count pass takes max id + 1)."""
    n_hint = num_nodes if num_nodes is not None else (feat.shape[0] if feat is not None else -1)
    if num_nodes is not None:
        if num_nodes < 1:
            raise InvalidValue(f"{setting('--num-nodes')} must be at least 1, got {num_nodes}")
        L.check_node_count(num_nodes, f"{setting('--num-nodes')} {num_nodes}")
    elif feat is not None:
        L.check_node_count(int(n_hint), f"{feat.path} ({n_hint} rows)")
    if n_hint < 0 and labels is not None:
        lr = NpyReader(labels)
        n_hint = lr.shape[0] if lr.shape else -1
        if n_hint >= 0:
            L.check_node_count(int(n_hint), f"{lr.path} ({n_hint} labels)")
    return int(n_hint)


def _load_labels_and_splits(labels: Any, split_files: tuple[Any, Any, Any], n: int,
                            random_split: tuple[float, float, int] | None
                            ) -> tuple[tuple[np.ndarray, int] | None, list[np.ndarray]]:
    """The labels (int64 [n] and the class count, or None without a ``labels`` file)
    and the train, validation and test ids (int64, one array per file of
    ``split_files``, empty where it is None; with ``random_split`` and labels, the
    labelled nodes split at random by :func:`labelled_split` instead)."""
    lab = load_labels(labels, n) if labels is not None else None
    splits = [load_split(p, n) if p is not None else np.zeros(0, np.int64)
              for p in split_files]
    if random_split is not None and lab is not None:
        splits = labelled_split(lab[0], *random_split)
    return lab, splits


def _write_nodes(w: DatasetWriter, feat: NpyReader | None, lab: tuple[np.ndarray, int] | None,
                 splits: list[np.ndarray], split_files: tuple[Any, Any, Any], buffer_bytes: int,
                 progress: bool) -> None:
    """Write the features of ``w`` (the rows of ``feat``, else one feature of value 1.0 per
    node), its labels ``lab`` (int64 [N] and the class count) when given, and its three
    ``splits`` (int64 ids), named in errors after ``split_files`` where given."""
    if feat is not None:
        write_features_npy(w, feat, buffer_bytes, progress)
    else:
        write_constant_features(w)
    if lab is not None:
        w.write_labels(*lab)
    train, val, test = splits  # three lists: the split files', or labelled_split's
    train_idx, val_idx, test_idx = split_files
    w.write_splits(train, val, test, names=(str(train_idx or "train_idx"),
                                            str(val_idx or "val_idx"), str(test_idx or "test_idx")))


def ingest_edgelist(edges, out, *, fmt: str = "auto", header: bool = False,
                    num_nodes: int | None = None, undirected: bool = False, dedup: bool = False,
                    remove_self_loops: bool = False, features=None, feature_dtype: str | None = None,
                    labels=None, train_idx=None, val_idx=None, test_idx=None,
                    name: str = "", buffer_bytes: int = DEFAULT_BUFFER, overwrite: bool = False,
                    progress: bool = True, stats: dict | None = None,
                    allow_nonfinite: bool = False,
                    random_split: tuple[float, float, int] | None = None,
                    reorder: str = "auto", link_split: LinkSplitSpec | None = None) -> Path:
    """Convert an edge list (text/CSV, ``.npy`` [2,E] or [E,2], raw int32/int64
    pairs) to a dataset folder at ``out`` and return its path.

    The node count is ``num_nodes``, else the features' row count, else the
    labels' length, else max id + 1 (bounded: see :mod:`.limits`). Without
    ``features`` every node gets one feature of value 1.0. Labels/splits are
    ``.npy`` files (splits: ids or boolean masks; a node in two splits or
    twice in one is an error). A graph without edges is an error, and so are
    NaN/inf features unless ``allow_nonfinite``. Memory: O(N) plus
    ``buffer_bytes``. ``random_split=(train, val, seed)`` (with labels, without
    split files) splits the labelled nodes at random: those shares to train and
    validation, the rest to test. ``link_split`` holds edges out for link prediction
    (:mod:`ooc.storage.link_split`).
    """
    t0 = time.perf_counter()
    split_files = (train_idx, val_idx, test_idx)
    out = check_out(out, overwrite, (edges, features, labels, *split_files))
    source = open_edges(edges, fmt, header)
    feat = open_features(features) if features is not None else None
    for p in (labels, *split_files):
        if p is not None:
            check_input(p)
    n_hint = _node_count_hint(num_nodes, feat, labels)
    counts = count_pass(source, n_hint, undirected, remove_self_loops, buffer_bytes, progress)
    n = counts.shape[0]
    check_not_empty(source, counts)
    if feat is not None:
        open_features(features, n)
    lab, splits = _load_labels_and_splits(labels, split_files, n, random_split)
    if feature_dtype is None:
        feature_dtype = "float16" if feat is not None and feat.dtype == np.float16 else "float32"
    dim = feat.shape[1] if feat is not None else 1
    meta_src = {"kind": "edgelist", **source.describe(), "undirected_added": undirected,
                "dedup": dedup, "self_loops_removed": remove_self_loops,
                "features": str(features) if features is not None else "constant 1.0"}
    with DatasetWriter(out, n, dim, feature_dtype, name=name, directed=not undirected,
                       overwrite=overwrite, source=meta_src, allow_nonfinite=allow_nonfinite,
                       features_name=str(features), reorder=reorder,
                       buffer_bytes=buffer_bytes, link_split=link_split) as w:
        st = scatter_passes(w, source, counts, undirected, dedup, remove_self_loops,
                            buffer_bytes, progress)
        _write_nodes(w, feat, lab, splits, split_files, buffer_bytes, progress)
        assert w.num_edges is not None  # set by write_indptr in scatter_passes
        # labels_held: the labels file was loaded whole (8 B a node, see limits)
        st.update(num_nodes=n, num_edges=w.num_edges, labels_held=lab is not None)
    if stats is not None:
        stats.update(st, time_s=time.perf_counter() - t0)
    return out
