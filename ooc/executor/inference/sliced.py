"""Column-sliced aggregation: a layer whose convolution reduces its in-neighbours' rows
(mean, sum or max of the rows as they are: ``SAGEConv``) computed from every target's
reduced row, with the input read about once however small the budget.

A reduction is independent per column. So where the budget cannot hold an accumulator row
for every target (which makes :mod:`.streamed` read its whole input once per group of
targets), this layer holds the input's values of a *slice* of its columns for every input
row ([input rows, slice columns] in the input's stored dtype: float32, or float16 held as
its bits) and walks every target's in-edges once per slice, writing each target's reduced
values of those columns. The input is read once in all, the edges once per slice:

1. *Columns* (only with several slices): one pass over the input in stored order writes
   each slice's columns to a file of its own ([input rows, slice columns], stored dtype),
   so a slice reads only its bytes. A later layer's input is written by the layer before it,
   which writes these files as it writes its output (:class:`ColumnFiles`, with the slices
   it plans for the next layer): the pass is skipped where the next layer's plan takes
   those slices.
2. *Edges in row order* (only where output rows are not node ids, or input rows not node
   ids): one pass over ``indices.bin`` buckets the edges by group of output rows (the
   :mod:`.streamed` kernel, 8 bytes an edge), then each group is sorted by row in memory
   (12 bytes an edge) into ``edges.bin`` (each edge's source row of the input, int32) and
   ``deg.bin`` (each output row's in-degree, int32). In node id order ``indices.bin`` is
   that file already.
3. *Slices*: for each slice, its columns are loaded and every target's sum (max) of its
   in-neighbours' values is written to the slice's aggregate file (float32 [N, slice
   columns]).
4. *Rows*: output rows a sub-block at a time, each target's own input row and its reduced
   row (the slices' columns side by side, divided by the in-degree for a mean) run through
   the layer with the reduced row as its one virtual in-neighbour, as :mod:`.streamed` does.

*Local edges.* Where the input's rows are stored in the processing order (a later layer's
array; ``features.bin`` of a dataset stored in the locality order it is processed in), the
rows pass goes a block of :data:`LOCAL_ROWS` output rows at a time and reads the input's
rows of the block and a halo either side (which hold its targets' own rows): an edge whose
source lies there (in a locality order, most of them) is reduced in that pass, in memory,
and only the others are walked once a slice. The sort writes the two kinds to files of
their own (``local.bin``/``ldeg.bin`` beside ``edges.bin``/``deg.bin``); the planner
estimates their share from a sample of rows.

With one slice (the whole input fits) the columns and aggregate files are skipped: the
input is read once into memory and the rows run as the targets are reduced.

Bytes read: the input once (and once more for the targets' own rows, plus the column files
and the aggregate once each, with several slices), the edges once per slice (4 bytes an
edge and 4 a row; 8 an edge once more to sort them; the local edges once in all). All scratch files live in
``<partial>/column_slices`` and go when the layer ends; :func:`scratch_bytes` is the disk
they take, which the planner checks before it takes this way.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ooc.executor.inference._kernels import (
    group_edge_counts,
    place_by_row,
    reduce_rows,
    reduce_rows_half,
)
from ooc.executor.inference.memory_plan import BlockCosts, headroom, output_buffers, rss
from ooc.executor.inference.streamed import (
    BUCKET_BYTES,
    SOURCE_MAX_BYTES,
    SUB_ROWS,
    SUB_SHARE,
    Source,
    input_keys,
    row_degrees,
    run_targets,
    write_buckets,
)
from ooc.storage.pagecache import release_mapped

if TYPE_CHECKING:
    from ooc.executor.inference.runner import LayerStats, Run, _ChunkWriter

#: Most output rows a reduction piece holds at once (float32 [rows, slice columns]).
PIECE_ROWS = 1 << 14
#: Most in-edges read at once while reducing (int32 source rows, int64 where converted).
EDGE_PIECE = 1 << 21
#: Bytes an edge takes while its group of output rows is sorted (a pair and its source).
SORT_EDGE_BYTES = 12
#: The scratch folder, inside the partial output folder; the sorted edges in its
#: :data:`EDGE_DIR`, kept for the next layer until the run ends.
SLICE_DIR = "column_slices"
EDGE_DIR = "edges"
EDGE_META = "sorted.json"
#: The column files a layer writes of its output array ``NAME`` for the next layer, in
#: ``columns_NAME`` inside :data:`SLICE_DIR`; their meta file is written last.
COLUMNS_PREFIX = "columns_"
COLUMNS_META = "columns.json"
#: Bytes of an edge, and of an output row, in the row-ordered edge files.
EDGE_KEY_BYTES = 4
DEG_BYTES = 4
#: Output rows of a block of the rows pass, whose input rows and halo it reads (a power of
#: two less where the memory is short).
LOCAL_ROWS = 1 << 15
#: The halo either side of a block: this share of its rows.
HALO_SHARE = 1 / 32
#: Output rows sampled to estimate the local edges' share.
LOCAL_SAMPLE = 1 << 12


@dataclass
class SlicePlan:
    """How a layer runs in column slices.

    Attributes:
        reduction: ``mean``, ``sum`` or ``max``.
        slices: column slices; ``slice_cols`` the widest one's columns.
        in_rows: rows of the input (the targets', or a linked feature file's).
        src_rows: input rows read at once while the column files are written.
        sub_rows: targets per sub-block run through the layer.
        sorted_edges: whether the edges are sorted into row order first (else
            ``indices.bin`` is read as it is).
        sort_rows: output rows per group the edges are sorted in (planned from the
            average degree; the run counts each group's edges and halves it until the
            largest fits).
        local_rows: output rows a block of the rows pass holds where local edges are
            reduced there (0: none are); ``halo`` the input rows read either side.
        local_share: the share of the edges planned to be local.
        planned_bytes: what it reads (see the module docstring).
        work: the free memory the plan splits.
        planned_peak_bytes: the RSS the layer is planned to reach.
        scratch_bytes: the disk its scratch files take at their fullest.
    """
    reduction: str
    slices: int
    slice_cols: int
    in_rows: int
    src_rows: int
    sub_rows: int
    sorted_edges: bool
    sort_rows: int
    planned_bytes: int
    work: int
    planned_peak_bytes: int
    scratch_bytes: int
    local_rows: int = 0
    halo: int = 0
    local_share: float = 0.0
    #: reads of the input start at a multiple of these rows
    src_align: int = 1
    #: a reduction's piece: at most these edges (or one row) and rows
    edge_piece: int = EDGE_PIECE
    piece_rows: int = PIECE_ROWS
    #: what the sorted edges' source keys are: ``rows`` (the processing order's, as a
    #: layer's array and a dataset stored in that order have them) or ``features``
    keys: str = "rows"
    #: the sorted edges an earlier layer left are read (no sort)
    edges_sorted: bool = False
    #: what it writes besides the layer's output: the sorted edges (where it sorts them),
    #: the column files and the aggregates (with several slices)
    write_bytes: int = 0
    #: the layer before wrote the column files (:class:`ColumnFiles`): no columns pass
    columns_ready: bool = False
    #: the column files' and held slices' dtype: the input's as stored (a float16 input's
    #: values held as float16 lose nothing, and a slice then holds twice the columns)
    col_dtype: str = "float32"

    def bounds(self, d_in: int) -> list[tuple[int, int]]:
        """The columns ``(c0, c1)`` of every slice."""
        return [(c, min(d_in, c + self.slice_cols)) for c in range(0, d_in, self.slice_cols)]

    def as_dict(self) -> dict:
        return {"mode": "sliced", "reduction": self.reduction, "slices": self.slices,
                "slice_cols": self.slice_cols, "sorted_edges": self.sorted_edges,
                "sub_rows": self.sub_rows, "planned_sliced_bytes": int(self.planned_bytes),
                "planned_write_bytes": int(self.write_bytes),
                "planned_peak_bytes": int(self.planned_peak_bytes),
                "scratch_bytes": int(self.scratch_bytes), "local_rows": self.local_rows,
                "halo": self.halo, "planned_local_share": round(self.local_share, 4),
                "edges_reused": self.edges_sorted, "columns_ready": self.columns_ready,
                "col_dtype": self.col_dtype}


def plan_sliced(reduction: str | None, n: int, num_edges: int, d_in: int, d_out: int,
                in_row_bytes: int, table_bytes: int, own_bytes: int, budget: int,
                chunk_rows: int, costs: BlockCosts, sorted_edges: bool,
                index_bytes: int = 4, slice_cols: int | None = None, rss0: int | None = None,
                n_in: int | None = None, aligned: bool = False,
                local_share: float = 0.0, src_align: int = 1,
                edges_sorted: bool = False, columns_ready: bool = False,
                col_dtype: str = "float32") -> SlicePlan | None:
    """The column-sliced plan of a layer, or None when its convolution is no plain
    reduction or the budget cannot hold one column of every input row.

    ``in_row_bytes``: an input row as read; ``table_bytes``: the whole input as read in
    stored order; ``own_bytes``: what reading every target's own row costs;
    ``sorted_edges``: the edges need sorting into row order (see the module docstring);
    ``index_bytes``: an id of ``indices.bin``; ``slice_cols``: force the slices' width
    (tests); ``rss0``: the RSS the layer starts from (default: now); ``n_in``: the input's
    rows (default ``n``); ``aligned``: the input's rows are stored in the processing order,
    so that the rows pass reduces the edges local to its blocks (``local_share`` of them,
    estimated) with several slices; ``src_align``: reads of the input start at a multiple
    of these rows (``features.bin``'s rows a page); ``edges_sorted``: an earlier layer
    left the sorted edges this plan reads (:func:`edges_ready`), so it does not sort them;
    ``columns_ready``: the layer before wrote the column files of these slices (with
    several slices the input is then not read for them; their writes count where the
    layer before runs, here as before); ``col_dtype``: the input's stored dtype, which the
    column files and the held slices keep (one slice holds the input as float32).
    """
    if reduction is None or n == 0:
        return None
    n_in = n if n_in is None else int(n_in)
    rss0 = rss() if rss0 is None else int(rss0)
    rows = min(chunk_rows, n)
    free = headroom(budget, rss0, rows, d_out)
    acc_row = 4 * d_in
    cb = int(np.dtype(col_dtype).itemsize)
    per_target = costs.target + 2 * costs.node + costs.edge + 3 * acc_row
    sub_rows = min(SUB_ROWS, n, int(free * SUB_SHARE) // max(per_target, 1))
    if sub_rows < 1:
        return None
    rows_pass = sub_rows * per_target
    # a reduction's piece: its edges as read and as int64, its rows' output and degrees,
    # within SUB_SHARE of the free memory
    share = int(free * SUB_SHARE) // 2
    edge_piece = int(min(EDGE_PIECE, max(1024, share // 16)))
    piece_rows = int(min(PIECE_ROWS, max(64, share // (acc_row + 16))))
    piece = edge_piece * 16 + piece_rows * (acc_row + 16)
    whole = n_in * acc_row
    if slice_cols is None:
        if whole + piece + rows_pass <= free:
            slice_cols = d_in
        else:
            # several slices: a float16 input's slices may hold every column, not the whole
            slice_cols = min(d_in - 1, (free - piece) // max(cb * n_in, 1))
    if slice_cols < 1:
        return None
    slices = -(-d_in // int(slice_cols))
    slice_cols = -(-d_in // slices)  # as even as the width allows
    src_row = in_row_bytes + 2 * acc_row  # as read, as float32, and a slice's copy
    src_rows = min(n_in, int(min(free * SUB_SHARE, SOURCE_MAX_BYTES)) // src_row)
    src_rows = max(src_align, src_rows // src_align * src_align)
    sort_edges = max(1, (free // 2) // SORT_EDGE_BYTES)
    sort_rows = max(1, min(n, sort_edges * n // max(2 * num_edges, 1)))
    local_rows = halo = 0
    local = 0.0
    if slices > 1 and sorted_edges and aligned:
        per_row = in_row_bytes + 4 * acc_row + 4 * DEG_BYTES
        # LOCAL_ROWS where its block fits half the free memory (every layer then has the
        # same blocks, and reads the edges the first one sorted), else a power of two less
        local_rows = LOCAL_ROWS
        while local_rows > 1 and local_rows * per_row > free // 2:
            local_rows //= 2
        local_rows = min(local_rows, n)
        halo = int(local_rows * HALO_SHARE)
        local = float(local_share) if local_rows > 0 else 0.0
    remote = int(round(num_edges * (1.0 - local)))
    e_pass = remote * (EDGE_KEY_BYTES if sorted_edges else index_bytes) \
        + n * (DEG_BYTES if sorted_edges else 8)
    ready = columns_ready and slices > 1
    planned = (0 if ready else table_bytes) + slices * e_pass \
        + (BUCKET_BYTES * num_edges if sorted_edges and not edges_sorted else 0)
    held = n_in * slice_cols * (cb if slices > 1 else 4) + piece
    if slices > 1:  # the column files, the aggregate and the own rows once each
        planned += n_in * d_in * cb + n * acc_row
        if local_rows:  # the blocks' rows and halos, the local edges, both degrees
            blocks = -(-n // local_rows)
            # (a read starts at a page's row: up to src_align - 1 rows more a block)
            planned += (n + (2 * halo + src_align) * blocks) * in_row_bytes \
                + (num_edges - remote) * EDGE_KEY_BYTES + 2 * n * DEG_BYTES
            rows_pass += (local_rows + 2 * halo) * (in_row_bytes + acc_row) \
                + local_rows * (2 * acc_row + 4 * DEG_BYTES)
        else:
            planned += own_bytes
        held = max(held, rows_pass, src_rows * src_row)
    else:
        held += rows_pass
    if sorted_edges and not edges_sorted:  # a group's edges sorted in half the free memory
        held = max(held, min(num_edges, sort_edges) * SORT_EDGE_BYTES)
    peak = rss0 + output_buffers(rows, d_out) + held
    if held > free:
        return None
    written = n_in * d_in * cb + n * acc_row if slices > 1 else 0
    if sorted_edges and not edges_sorted:
        written += (BUCKET_BYTES + EDGE_KEY_BYTES) * num_edges + 2 * DEG_BYTES * n
    scratch = scratch_bytes(n, num_edges, d_in, n_in, sorted_edges,
                            slice_cols if slices > 1 else 0, cb)
    return SlicePlan(reduction, slices, int(slice_cols), n_in, int(src_rows), int(sub_rows),
                     sorted_edges, int(sort_rows), int(planned), int(free), int(peak),
                     int(scratch), local_rows, halo, local, src_align, edge_piece,
                     piece_rows, edges_sorted=edges_sorted,
                     write_bytes=int(written), columns_ready=ready, col_dtype=col_dtype)


def scratch_bytes(n: int, num_edges: int, d_in: int, n_in: int, sorted_edges: bool = True,
                  slice_cols: int = 1, col_bytes: int = 4) -> int:
    """The disk a sliced layer's scratch files take at their fullest: the sorted edges
    (with their buckets while sorting) and, with slices of ``slice_cols`` columns (0: one
    slice, none of these), the column files (``col_bytes`` a value [n_in, d_in]) and the
    aggregates (float32 [n, d_in]): each slice's column file goes once it is loaded, so at
    most one slice's aggregate more than the larger of the two."""
    out = (BUCKET_BYTES + EDGE_KEY_BYTES) * num_edges + 2 * DEG_BYTES * n if sorted_edges \
        else 0
    return out + (max(n_in * col_bytes, 4 * n) * d_in + 4 * n * slice_cols
                  if slice_cols else 0)


class ColumnFiles:
    """The column files of a layer's output (``dtype`` [rows, c1 - c0] for each ``(c0, c1)``
    of ``bounds``, in row order) for the next layer's slices, written as the layer's
    writer hands over its output chunks in order (the values as stored: a float16 layer's
    after its rounding). Files are opened at the first chunk; :meth:`finish` writes the
    meta file once every row is in; a write that fails (a full disk) drops them all and the
    layer goes on without (the next layer then writes its own)."""

    def __init__(self, folder: Path, bounds: list[tuple[int, int]], rows: int,
                 dtype: str = "float32"):
        self.folder, self.bounds, self.rows, self.dtype = folder, bounds, int(rows), dtype
        self._files: list[Any] | None = None
        self._written = 0
        self.failed = False

    def put(self, r0: int, h: np.ndarray) -> None:
        """Rows ``r0 .. r0 + len(h)`` of the output ([k, width], stored dtype)."""
        if self.failed:
            return
        if r0 != self._written:  # a chunk out of order: the files could not be whole
            self.abort()
            return
        try:
            if self._files is None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder.mkdir(parents=True)
                self._files = [open(self.folder / f"cols{j}.bin", "wb")
                               for j in range(len(self.bounds))]
            for f, (c0, c1) in zip(self._files, self.bounds, strict=True):
                f.write(np.ascontiguousarray(h[:, c0:c1], dtype=self.dtype).data)
            self._written += h.shape[0]
        except OSError:
            self.abort()

    def finish(self) -> None:
        """Close the files; the meta file marks them whole when every row is in."""
        if self.failed or self._files is None:
            return
        try:
            for f in self._files:
                f.close()
            self._files = None
            if self._written == self.rows:
                meta = self.folder / COLUMNS_META
                tmp = meta.with_suffix(".tmp")
                tmp.write_text(json.dumps({"rows": self.rows, "dtype": self.dtype,
                                           "bounds": [list(b) for b in self.bounds]}))
                tmp.replace(meta)
        except OSError:
            self.abort()

    def abort(self) -> None:
        """Drop the files (a failed write, or the layer stopped)."""
        self.failed = True
        for f in self._files or []:
            try:
                f.close()
            except OSError:
                pass
        self._files = None
        shutil.rmtree(self.folder, ignore_errors=True)


def columns_dir(work: Path, name: str) -> Path:
    """Where the column files of array ``name`` go (see :class:`ColumnFiles`)."""
    return work / SLICE_DIR / f"{COLUMNS_PREFIX}{name}"


def prepared_columns(work: Path, name: str, rows: int,
                     dtype: str = "float32") -> list[tuple[int, int]] | None:
    """The slices' bounds of the whole column files of array ``name`` (``rows`` rows of
    ``dtype``) a layer wrote (:class:`ColumnFiles`), or None where there are none."""
    folder = columns_dir(work, name)
    try:
        meta = json.loads((folder / COLUMNS_META).read_text())
        bounds = [(int(a), int(b)) for a, b in meta["bounds"]]
        if int(meta["rows"]) != rows or meta.get("dtype") != dtype:
            return None
        item = np.dtype(dtype).itemsize
        for j, (c0, c1) in enumerate(bounds):
            if (folder / f"cols{j}.bin").stat().st_size != rows * (c1 - c0) * item:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return bounds


class _Edges:
    """Every output row's in-edges in row order, as source rows of the input: read from
    ``indices.bin`` as it is (node id order both sides) or from the sorted files."""

    def __init__(self, run: "Run", folder: Path | None, plan: SlicePlan):
        self.run, self.folder = run, folder
        self.edge_piece, self.piece_rows = plan.edge_piece, plan.piece_rows
        self.bytes_read = 0

    def pieces(self) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """``(r0, r1, deg, src)`` for consecutive rows from 0: int64 [r1 - r0] in-degrees
        and the source rows of their edges, at most ``edge_piece`` edges (or one
        row) and ``piece_rows`` rows at a time (the plan's)."""
        topo = self.run.topo
        n = topo.num_nodes
        if self.folder is None:
            indptr = topo.indptr
            r0 = 0
            while r0 < n:
                e0 = int(indptr[r0])
                cut = int(np.searchsorted(indptr, e0 + self.edge_piece, side="right")) - 1
                r1 = min(n, r0 + self.piece_rows, max(r0 + 1, cut))
                ptr = np.asarray(indptr[r0:r1 + 1])
                src = np.asarray(topo.indices[ptr[0]:ptr[-1]], dtype=np.int64)
                self.bytes_read += src.shape[0] * topo.indices.itemsize + 8 * (r1 - r0)
                topo.release_pages()
                yield r0, r1, np.diff(ptr), src
                r0 = r1
            return
        with open(self.folder / "deg.bin", "rb") as fd, open(self.folder / "edges.bin", "rb") as fe:
            for a in range(0, n, self.piece_rows):
                deg = np.fromfile(fd, dtype=np.int32, count=min(self.piece_rows, n - a))
                self.bytes_read += deg.nbytes
                ends = np.cumsum(deg, dtype=np.int64)
                r = 0
                while r < deg.shape[0]:
                    base = int(ends[r - 1]) if r else 0
                    z = max(r + 1, int(np.searchsorted(ends, base + self.edge_piece,
                                                       side="right")))
                    z = min(z, deg.shape[0])
                    src = np.fromfile(fe, dtype=np.int32, count=int(ends[z - 1]) - base)
                    self.bytes_read += src.nbytes
                    yield a + r, a + z, deg[r:z].astype(np.int64), src.astype(np.int64)
                    r = z


def _sort_edges(run: "Run", plan: SlicePlan, key_in: np.ndarray, folder: Path,
                stats: "LayerStats") -> int:
    """Write ``edges.bin`` and ``deg.bin``, and where the plan has local blocks
    ``local.bin`` and ``ldeg.bin`` (see the module docstring); returns the bytes read back
    from the buckets and the local edges."""
    topo = run.topo
    n = topo.num_nodes
    limit = max(1, (plan.work // 2) // SORT_EDGE_BYTES)
    rows = plan.sort_rows
    while True:  # the largest group's edges within the sort's memory
        counts = group_edge_counts(topo.indptr, topo.rowof, rows, -(-n // rows))
        topo.release_pages()
        if rows == 1 or int(counts.max(initial=0)) <= limit:
            break
        rows = max(1, rows // 2)
    groups = -(-n // rows)
    t0 = time.perf_counter()
    buckets = folder / "buckets"
    buckets.mkdir()
    sizes = write_buckets(run, key_in, buckets, rows, groups, max(1, plan.in_rows), 1)
    if run.dataset.row_of is not None:
        release_mapped(run.dataset.row_of)
    read = local = 0
    with open(folder / "edges.bin", "wb") as fe, open(folder / "deg.bin", "wb") as fd, \
            open(folder / "local.bin", "wb") as fl, open(folder / "ldeg.bin", "wb") as fdl:
        for g in range(groups):
            r0, r1 = g * rows, min(n, (g + 1) * rows)
            f = buckets / f"{g}.bin"
            if sizes[g]:
                pairs = np.fromfile(f, dtype=np.int32).reshape(-1, 2)
                read += pairs.nbytes
            else:
                pairs = np.empty((0, 2), dtype=np.int32)
            deg = np.empty(r1 - r0, dtype=np.int32)
            ldeg = np.empty(r1 - r0, dtype=np.int32)
            src = np.empty(pairs.shape[0], dtype=np.int32)
            nloc = place_by_row(pairs, r0, plan.local_rows, plan.halo, deg, ldeg, src)
            del pairs
            f.unlink(missing_ok=True)
            fe.write(src[:src.shape[0] - nloc].data)
            fl.write(src[src.shape[0] - nloc:].data)
            local += nloc
            fd.write(deg.data)
            fdl.write(ldeg.data)
            del src, deg, ldeg
    shutil.rmtree(buckets, ignore_errors=True)
    stats.time_s["bucket"] = stats.time_s.get("bucket", 0.0) + time.perf_counter() - t0
    stats.local_edges = local
    meta = folder / EDGE_META
    meta.with_suffix(".tmp").write_text(json.dumps({**_edges_key(plan), "local_edges": local}))
    meta.with_suffix(".tmp").replace(meta)  # written last: the files before it are whole
    return read


def _edges_key(plan: SlicePlan) -> dict:
    """What sorted edges hold: their keys and the blocks that decide which are local."""
    return {"keys": plan.keys, "local_rows": plan.local_rows, "halo": plan.halo}


def edges_ready(work: Path, plan: SlicePlan) -> int | None:
    """The local edges of the sorted edges an earlier layer (or a run resumed) left in
    ``work`` when they are what ``plan`` reads, else None."""
    try:
        meta = json.loads((work / SLICE_DIR / EDGE_DIR / EDGE_META).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or {k: meta.get(k) for k in _edges_key(plan)} != \
            _edges_key(plan) or not isinstance(meta.get("local_edges"), int):
        return None
    return int(meta["local_edges"])


class _Window:
    """Input rows ``base ..`` in memory, stored in the processing order: a target's own row
    is the row of its output row."""

    def __init__(self, x: np.ndarray, base: int):
        self.x, self.base = x, base

    def own_rows(self, nodes: np.ndarray, r0: int, r1: int) -> np.ndarray:
        return self.x[r0 - self.base:r1 - self.base]


class _Held:
    """The whole input in memory (one slice): a target's own row is read from it."""

    def __init__(self, x: np.ndarray, key: np.ndarray | None):
        self.x, self.key = x, key

    def own_rows(self, nodes: np.ndarray, r0: int, r1: int) -> np.ndarray:
        return self.x[nodes if self.key is None else np.asarray(self.key[nodes])]


def _load_table(src: Source, n_in: int, d_in: int, step: int) -> np.ndarray:
    """float32 [n_in, d_in]: the whole input, read in stored order ``step`` rows at a time."""
    x = np.empty((n_in, d_in), dtype=np.float32)
    for a in range(0, n_in, step):
        b = min(n_in, a + step)
        x[a:b] = src.rows(a, b)
    return x


def _write_columns(src: Source, plan: SlicePlan, d_in: int, folder: Path) -> None:
    """Each slice's columns of the input, in stored row order, to ``cols{j}.bin``."""
    files = [open(folder / f"cols{j}.bin", "wb") for j in range(plan.slices)]
    try:
        for a in range(0, plan.in_rows, plan.src_rows):
            x = src.rows(a, min(plan.in_rows, a + plan.src_rows))
            for f, (c0, c1) in zip(files, plan.bounds(d_in), strict=True):
                f.write(np.ascontiguousarray(x[:, c0:c1], dtype=plan.col_dtype).data)
            del x
    finally:
        for f in files:
            f.close()


def run_sliced(run: "Run", l: int, plan: SlicePlan, prev: Any, d_in: int, first_chunk: int,
               writer: "_ChunkWriter", stats: "LayerStats", work: Path) -> int:
    """Layer ``l`` in column slices, output rows from ``first_chunk`` on handed to
    ``writer``; returns the bytes read."""
    topo, ch = run.topo, run.chunking
    row_of = run.dataset.row_of
    key_in = input_keys(run, prev)
    folder = work / SLICE_DIR
    local = edges_ready(work, plan) if plan.edges_sorted else None
    ready = columns_dir(work, f"h{l}").name if plan.columns_ready else None
    _clear(folder, keep={EDGE_DIR if local is not None else "", ready or ""})  # a killed run's
    folder.mkdir(exist_ok=True)
    edir = folder / EDGE_DIR
    src = Source(run, prev)
    use_max = plan.reduction == "max"
    start = first_chunk * ch.chunk_rows
    read = 0
    try:
        if plan.sorted_edges and local is None:
            edir.mkdir()
            read += _sort_edges(run, plan, key_in, edir, stats)
        elif plan.sorted_edges:
            stats.local_edges = local
        edges = _Edges(run, edir if plan.sorted_edges else None, plan)
        if plan.slices == 1:
            t0 = time.perf_counter()
            x = _load_table(src, plan.in_rows, d_in, plan.src_rows)
            stats.time_s["read"] += time.perf_counter() - t0
            held = _Held(x, None if prev is None and row_of is None else key_in)
            for r0, r1, deg, s in edges.pieces():
                if r1 <= start:
                    continue
                t0 = time.perf_counter()
                acc = np.empty((r1 - r0, d_in), dtype=np.float32)
                reduce_rows(x, s, deg, acc, use_max)
                stats.time_s["aggregate"] = stats.time_s.get("aggregate", 0.0) \
                    + time.perf_counter() - t0
                a = max(0, start - r0)
                nodes = np.asarray(topo.perm[r0 + a:r1])
                if plan.reduction == "mean":
                    acc /= np.maximum(deg, 1).astype(np.float32)[:, None]
                run_targets(run, l, plan.sub_rows, held, acc[a:], nodes, deg[a:], r0 + a,
                            writer, stats)
            del x
        else:
            t0 = time.perf_counter()
            if ready is not None:  # the layer before wrote them
                for j in range(plan.slices):
                    (folder / ready / f"cols{j}.bin").replace(folder / f"cols{j}.bin")
                shutil.rmtree(folder / ready, ignore_errors=True)
            else:
                _write_columns(src, plan, d_in, folder)
            stats.time_s["columns"] = time.perf_counter() - t0
            _reduce_slices(plan, d_in, edges, folder, use_max, stats)
            read += plan.in_rows * d_in * np.dtype(plan.col_dtype).itemsize + edges.bytes_read
            edges.bytes_read = 0
            rows_pass = _run_blocks if plan.local_rows else _run_rows
            read += rows_pass(run, l, plan, src, d_in, start, folder, writer, stats)
        read += edges.bytes_read
    finally:
        src.close()
        # the sorted edges stay for the next layer, and the column files of this layer's
        # output that its writer wrote for it
        _clear(folder, keep={EDGE_DIR, columns_dir(work, f"h{l + 1}").name})
    return read + src.bytes_read


def _clear(folder: Path, keep: set[str]) -> None:
    """Remove what ``folder`` holds but its entries named in ``keep``."""
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if p.name in keep:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _reduce_slices(plan: SlicePlan, d_in: int, edges: _Edges, folder: Path, use_max: bool,
                   stats: "LayerStats") -> None:
    """Every slice's reduced columns of every output row to ``agg{j}.bin`` (float32; a
    float16 slice is held as its bits and each value looked up in float32)."""
    half = np.dtype(plan.col_dtype) == np.float16
    value = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32) \
        if half else None
    for j, (c0, c1) in enumerate(plan.bounds(d_in)):
        t0 = time.perf_counter()
        x = np.fromfile(folder / f"cols{j}.bin", dtype=np.uint16 if half else np.float32)
        x = x.reshape(-1, c1 - c0)
        (folder / f"cols{j}.bin").unlink()
        t1 = time.perf_counter()
        with open(folder / f"agg{j}.bin", "wb") as f:
            for _, _, deg, s in edges.pieces():
                out = np.empty((deg.shape[0], c1 - c0), dtype=np.float32)
                if value is not None:
                    reduce_rows_half(x, value, s, deg, out, use_max)
                else:
                    reduce_rows(x, s, deg, out, use_max)
                f.write(out.data)
        del x
        stats.time_s["read"] += t1 - t0
        stats.time_s["aggregate"] = stats.time_s.get("aggregate", 0.0) + time.perf_counter() - t1


def _run_rows(run: "Run", l: int, plan: SlicePlan, src: Source, d_in: int, start: int,
              folder: Path, writer: "_ChunkWriter", stats: "LayerStats") -> int:
    """The layer on output rows from ``start``, their reduced rows read from the slices'
    aggregate files; returns the bytes read from those."""
    n = run.topo.num_nodes
    bounds = plan.bounds(d_in)
    files = [open(folder / f"agg{j}.bin", "rb") for j in range(plan.slices)]
    read = 0
    try:
        for f, (c0, c1) in zip(files, bounds, strict=True):
            f.seek(start * (c1 - c0) * 4)
        for r0 in range(start, n, plan.sub_rows):
            r1 = min(n, r0 + plan.sub_rows)
            t0 = time.perf_counter()
            acc = np.empty((r1 - r0, d_in), dtype=np.float32)
            for f, (c0, c1) in zip(files, bounds, strict=True):
                acc[:, c0:c1] = np.fromfile(f, dtype=np.float32,
                                            count=(r1 - r0) * (c1 - c0)).reshape(-1, c1 - c0)
            read += acc.nbytes
            stats.time_s["read"] += time.perf_counter() - t0
            nodes, dg = row_degrees(run, r0, r1)
            if plan.reduction == "mean":
                acc /= np.maximum(dg, 1).astype(np.float32)[:, None]
            run_targets(run, l, plan.sub_rows, src, acc, nodes, dg, r0, writer, stats)
    finally:
        for f in files:
            f.close()
    return read


def _local_offset(folder: Path, start: int) -> int:
    """Local edges of the output rows before ``start`` (from ``ldeg.bin``)."""
    total = 0
    with open(folder / "ldeg.bin", "rb") as f:
        for a in range(0, start, PIECE_ROWS):
            total += int(np.fromfile(f, dtype=np.int32, count=min(PIECE_ROWS, start - a))
                         .sum(dtype=np.int64))
    return total


def _combine(lacc: np.ndarray, ldeg: np.ndarray, racc: np.ndarray, rdeg: np.ndarray,
             reduction: str) -> np.ndarray:
    """A block's reduced rows from its local part (``lacc``, ``ldeg`` edges a row) and the
    rest (``racc``, ``rdeg``): float32 [rows, d_in]; a mean divided by the in-degree."""
    if reduction == "max":  # a part without edges holds zeros, not a maximum
        both = np.maximum(lacc, racc)
        return np.where((ldeg == 0)[:, None], racc, np.where((rdeg == 0)[:, None], lacc, both))
    lacc += racc
    if reduction == "mean":
        lacc /= np.maximum(ldeg + rdeg, 1).astype(np.float32)[:, None]
    return lacc


def _run_blocks(run: "Run", l: int, plan: SlicePlan, src: Source, d_in: int, start: int,
                folder: Path, writer: "_ChunkWriter", stats: "LayerStats") -> int:
    """The layer on output rows from ``start``, a block of ``plan.local_rows`` at a time:
    the block's input rows and halo read in one piece (its targets' own rows), its local
    edges reduced from them, the rest of each reduced row read from the slices' aggregate
    files; returns the bytes read besides the input's."""
    n, lr, h = run.topo.num_nodes, plan.local_rows, plan.halo
    bounds = plan.bounds(d_in)
    names = [f"{EDGE_DIR}/{name}" for name in ("deg.bin", "ldeg.bin", "local.bin")] \
        + [f"agg{j}.bin" for j in range(plan.slices)]
    files = [open(folder / name, "rb") for name in names]
    fd, fdl, fl, aggs = files[0], files[1], files[2], files[3:]
    read = 0
    try:
        fd.seek(start * DEG_BYTES)
        fdl.seek(start * DEG_BYTES)
        fl.seek(_local_offset(folder / EDGE_DIR, start) * EDGE_KEY_BYTES)
        for f, (c0, c1) in zip(aggs, bounds, strict=True):
            f.seek(start * (c1 - c0) * 4)
        a = start
        while a < n:
            b = a // lr
            z = min(n, (b + 1) * lr)
            t0 = time.perf_counter()
            wa = max(0, b * lr - h) // plan.src_align * plan.src_align
            wz = min(plan.in_rows, (b + 1) * lr + h)
            win = src.rows(wa, wz)
            rdeg = np.fromfile(fd, dtype=np.int32, count=z - a).astype(np.int64)
            ldeg = np.fromfile(fdl, dtype=np.int32, count=z - a).astype(np.int64)
            lsrc = np.fromfile(fl, dtype=np.int32, count=int(ldeg.sum())).astype(np.int64)
            racc = np.empty((z - a, d_in), dtype=np.float32)
            for f, (c0, c1) in zip(aggs, bounds, strict=True):
                racc[:, c0:c1] = np.fromfile(f, dtype=np.float32,
                                             count=(z - a) * (c1 - c0)).reshape(-1, c1 - c0)
            read += racc.nbytes + (2 * (z - a) + lsrc.shape[0]) * 4
            t1 = time.perf_counter()
            lsrc -= wa
            lacc = np.empty((z - a, d_in), dtype=np.float32)
            reduce_rows(win, lsrc, ldeg, lacc, plan.reduction == "max")
            del lsrc
            acc = _combine(lacc, ldeg, racc, rdeg, plan.reduction)
            del lacc, racc
            stats.time_s["read"] += t1 - t0
            stats.time_s["aggregate"] = stats.time_s.get("aggregate", 0.0) \
                + time.perf_counter() - t1
            nodes = np.asarray(run.topo.perm[a:z])
            run_targets(run, l, plan.sub_rows, _Window(win, wa), acc, nodes, ldeg + rdeg, a,
                        writer, stats)
            del win, acc
            a = z
    finally:
        for f in files:
            f.close()
    return read
