"""Running one layer over every node: blocks of targets, their inputs read through
the chunk cache (or feature rows for layer 0), the layer applied, output chunks
written and recorded in the progress file."""
from __future__ import annotations

import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooc.caches.chunk_cache import ChunkCache
from ooc.core.errors import InvalidValue, OocError
from ooc.executor.inference.blocks import (
    CacheSettings,
    Chunking,
    LayerPlan,
    fits_one_block,
    note_extra_reads,
    plan_layer,
)
from ooc.executor.inference.chunk_rows import ChunkFileRows
from ooc.executor.inference.local_graph import LocalGraph, Topology, local_graph
from ooc.executor.inference.memory_plan import BlockCosts, headroom, measure_costs, rss
from ooc.executor.inference.model_adapter import LayerwiseModel
from ooc.executor.inference.store import Progress, layer_array, write_chunk
from ooc.executor.inference._kernels import local_share
from ooc.executor.inference.sliced import (
    LOCAL_SAMPLE,
    ColumnFiles,
    SlicePlan,
    columns_dir,
    edges_ready,
    plan_sliced,
    prepared_columns,
    run_sliced,
)
from ooc.executor.inference.streamed import (
    BUCKET_BYTES,
    StreamPlan,
    input_keys,
    note_stream_reads,
    plan_stream,
    run_streamed,
)
from ooc.storage.dataset import Dataset
from ooc.storage.features import read_counted
from ooc.storage.finite import first_nonfinite_row
from ooc.storage.layout import PAGE
from ooc.storage.pagecache import release_mapped


@dataclass
class Run:
    """What every layer of one run shares."""
    dataset: Dataset
    model: LayerwiseModel
    group: Any                  # the Zarr group in the partial folder
    topo: Topology
    reader: Any                 # layer-0 features: ``read(ids) -> [n, dim]``
    budget: int
    chunking: Chunking
    cache: CacheSettings
    progress: Progress
    show_bar: bool = False
    #: dtype of the layers before the last (``float16`` halves their disk and reads)
    layer_dtype: str = "float32"
    #: the page reader's backend for a later layer's rows (see :class:`ChunkFileRows`)
    io_backend: str = "auto"
    #: how a layer reads its input (:data:`AGGREGATIONS`)
    aggregate: str = "auto"
    #: force the streamed plan's group and source chunk rows (tests)
    stream_rows: tuple[int | None, int | None] = (None, None)
    #: force the column-sliced plan's slice width (tests)
    slice_cols: int | None = None


#: ``aggregate`` values: ``blocks`` (every block reads its targets' in-neighbour rows),
#: ``streamed`` (:mod:`.streamed`: groups of targets' accumulators, the input streamed per
#: group), ``sliced`` (:mod:`.sliced`: column slices of every row, the edges read per
#: slice) — both for layers whose convolution is a plain reduction — or ``auto`` (see
#: :func:`run_layer`).
AGGREGATIONS = ("auto", "blocks", "streamed", "sliced")


class NonFiniteOutput(OocError, FloatingPointError):
    """A layer's output holds a NaN or an infinity (named by its first node)."""


#: Feature rows read at once into a block (at most this many pages in the reader's buffer).
READ_ROWS = 2048


@dataclass
class LayerInput:
    """Where a layer's input rows come from: the previous layer's array ``prev``
    ([N, d_in] float32 or float16, processing order) or, for layer 0, ``reader`` (node id
    order); counts the bytes read and the whole chunks loaded."""
    prev: Any
    reader: Any
    row_bytes: int
    chunk_rows: int
    num_nodes: int
    bytes_read: int = 0
    chunk_reads: int = 0
    #: the previous layer's rows read from its chunk files (a layer that reads rows)
    prev_rows: ChunkFileRows | None = None
    #: int64 [N] node -> row of ``features.bin`` where its rows are not by node id
    row_of: np.ndarray | None = None

    def _read_features(self, ids: np.ndarray) -> np.ndarray:
        a, nbytes = read_counted(self.reader, ids, self.row_bytes)
        self.bytes_read += nbytes
        return a

    def load_chunk(self, c: int) -> np.ndarray:
        """Input chunk ``c``: [rows, d_in] in the stored dtype, float32 for layer 0 (the
        chunk cache's loader; rows become float32 when gathered into a block)."""
        a0, a1 = c * self.chunk_rows, min(self.num_nodes, (c + 1) * self.chunk_rows)
        if self.prev is not None:
            a = np.asarray(self.prev[a0:a1])
            self.bytes_read += a.nbytes
        else:
            a = np.asarray(self._read_features(np.arange(a0, a1, dtype=np.int64)),
                           dtype=np.float32)
        self.chunk_reads += 1
        return a

    def read_rows(self, nodes: np.ndarray, keyof: np.ndarray, x: np.ndarray) -> None:
        """The input rows of ``nodes`` into ``x`` (float32 [len(nodes), d_in]): feature rows
        by node id for layer 0 (ascending, :data:`READ_ROWS` at a time, so the reader's
        page buffer stays small), else the previous layer's rows ``keyof[nodes]`` from
        its chunk files (a chunk file at a time)."""
        if self.prev_rows is None:  # ascending in the file (its rows may not be by node id)
            o = np.argsort(nodes if self.row_of is None else self.row_of[nodes])
            for a in range(0, o.shape[0], READ_ROWS):
                part = o[a:a + READ_ROWS]
                x[part] = self._read_features(nodes[part])
            return
        before = self.prev_rows.pages
        self.prev_rows.read(keyof[nodes], x)
        self.bytes_read += (self.prev_rows.pages - before) * PAGE


@dataclass
class LayerStats:
    """Seconds per stage and the largest block of one layer."""
    time_s: dict = field(default_factory=lambda: dict.fromkeys(
        ("plan", "local_graph", "read", "compute", "write", "write_wait"), 0.0))
    peak_block_nodes: int = 0
    peak_block_edges: int = 0
    sub_blocks: int = 0
    #: edges a sliced layer reduced in its rows pass (local to their block), when sorted
    local_edges: int | None = None


def _gather_from_chunks(plan: LayerPlan, cache: ChunkCache, chunk_rows: int, b: int,
                        nodes: np.ndarray, x: np.ndarray) -> None:
    """Rows of ``nodes`` into ``x`` from the cached input chunks block ``b`` reads."""
    assert plan.ptr is not None and plan.seq is not None  # a plan with a cache reads chunks
    rows = plan.keyof[nodes]
    o = np.argsort(rows)
    srows = rows[o]
    chunks = plan.seq[plan.ptr[b]:plan.ptr[b + 1]]
    lo = np.searchsorted(srows, chunks * chunk_rows, side="left")
    hi = np.searchsorted(srows, (chunks + 1) * chunk_rows, side="left")
    for k in range(chunks.shape[0]):
        cc = int(chunks[k])
        data = cache.get(cc)
        a, z = int(lo[k]), int(hi[k])
        x[o[a:z]] = data[srows[a:z] - cc * chunk_rows]


def _run_block(run: Run, plan: LayerPlan, src: LayerInput, cache: ChunkCache | None, b: int,
               stats: LayerStats, writer: "_ChunkWriter") -> None:
    """Layer ``plan.l`` for the targets of block ``b``, its output rows handed to
    ``writer``. The block's input rows are read once; its targets run through the layer
    a sub-block at a time, each on its own local graph (sized by ``plan.sub_work``)."""
    s, e = int(plan.starts[b]), int(plan.starts[b + 1])
    run.dataset.check_mapped()  # a mapped file that shrank: an error here, not SIGBUS
    t0 = time.perf_counter()
    g: LocalGraph = local_graph(run.topo, s, e)
    run.topo.release_pages()
    t1 = time.perf_counter()
    x = np.empty((g.nodes.shape[0], plan.d_in), dtype=np.float32)
    if cache is None:
        src.read_rows(g.nodes, plan.keyof, x)
    else:
        _gather_from_chunks(plan, cache, run.chunking.chunk_rows, b, g.nodes, x)
    t2 = time.perf_counter()
    c = plan.sub_costs
    subs = g.sub_blocks(c.target, c.node, c.edge, plan.sub_work)
    stats.time_s["local_graph"] += t1 - t0 + time.perf_counter() - t2
    stats.time_s["read"] += t2 - t1
    for k in range(subs.shape[0] - 1):
        a, z = int(subs[k]), int(subs[k + 1])
        t3 = time.perf_counter()
        nodes, ei, w = g.sub(a, z)
        xs = x if nodes.shape[0] == x.shape[0] else x[nodes]  # the whole block: as it is
        h = run.model.targets(plan.l, torch.from_numpy(xs), torch.from_numpy(ei),
                              None if w is None else torch.from_numpy(w), z - a).numpy()
        del xs, nodes, ei, w
        stats.time_s["compute"] += time.perf_counter() - t3
        writer.put(s + a, h)
        stats.peak_block_edges = max(stats.peak_block_edges, int(g.eptr[z] - g.eptr[a]))
    stats.peak_block_nodes = max(stats.peak_block_nodes, int(g.nodes.shape[0]))
    stats.sub_blocks += subs.shape[0] - 1


def _progress_bar(run: Run, l: int, first_chunk: int):
    if not run.show_bar:
        return None
    from tqdm import tqdm

    return tqdm(total=run.chunking.num_chunks, initial=first_chunk,
                desc=f"layer {l + 1}/{run.model.num_layers}", unit="chunk")


def _layer_report(plan: LayerPlan, name: str, first_chunk: int, first_block: int,
                  src: LayerInput, cache: ChunkCache | None, stats: LayerStats) -> dict:
    accesses = None
    if plan.seq is not None:
        assert plan.ptr is not None  # ptr and seq are None together
        accesses = int(plan.seq.shape[0] - plan.ptr[first_block])
    return {
        "layer": plan.l + 1, "array": name, "in_dim": plan.d_in, "out_dim": plan.d_out,
        "blocks": plan.num_blocks, "blocks_run": plan.num_blocks - first_block,
        "resumed_chunks": first_chunk, "sub_blocks": stats.sub_blocks,
        "sub_costs": asdict(plan.sub_costs),
        "peak_block_nodes": stats.peak_block_nodes,
        "peak_block_edges": stats.peak_block_edges, "work_bytes": int(plan.work),
        "planned_peak_bytes": plan.planned_peak_bytes,
        "rss_at_start": plan.rss0, "budget_pressure": bool(plan.pressure),
        "bytes_read": int(src.bytes_read), "chunk_reads": src.chunk_reads,
        "accesses": accesses,
        "cache": None if cache is None else {**cache.stats(), "chunk_bytes": plan.in_chunk_bytes},
        "reads": {**(plan.reads or {}), "backend": src.prev_rows.backend_used if src.prev_rows
                  else None},
        "time_s": {k: round(v, 4) for k, v in stats.time_s.items()},
    }


def check_finite(buf: np.ndarray, run: Run, l: int, c0: int) -> None:
    """Raise :class:`NonFiniteOutput` naming the first node whose row of ``buf``
    (float32 [rows, d_out], output rows ``c0..``) holds a NaN or an infinity."""
    k = first_nonfinite_row(buf)
    if k >= 0:
        node = int(run.topo.perm[c0 + k])
        why = ("a value past float16's range: use --layer-dtype float32"
               if buf.dtype == np.float16 else
               "NaN or infinite features or model weights")
        raise NonFiniteOutput(f"{run.dataset.path}: layer {l + 1} of inference gives a "
                              f"non-finite output at node {node} ({why}); nothing was "
                              f"renamed into the output")


class _ChunkWriter:
    """Takes a layer's output rows in row order, block by block (a block may span output
    chunks), and writes each output chunk once it is full, from chunk ``first_chunk`` on
    (rows before it are written already and dropped): checked finite and converted to the
    array's dtype here, then written, synced, recorded in the progress file and handed to
    ``columns`` (the next layer's column files, where given) by a writer thread while the
    next chunk fills: the two output buffers of the memory plan, one filled, one written.
    A write's error is raised by the next :meth:`put` or on leaving the ``with`` block,
    which closes it (:meth:`close`); a layer stopped by an error waits for the write in
    flight there."""

    def __init__(self, run: Run, l: int, arr: Any, name: str, d_out: int, first_chunk: int,
                 stats: LayerStats, columns: ColumnFiles | None = None):
        self.run, self.l, self.arr, self.name, self.d_out = run, l, arr, name, d_out
        self.stats, self.columns = stats, columns
        self.c = first_chunk
        self.buf: np.ndarray | None = None
        self.bar = _progress_bar(run, l, first_chunk)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ooc-chunk-writer")
        self._pending: Future | None = None

    def __enter__(self) -> "_ChunkWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
            return
        if self._pending is not None:  # the error in flight wins over a write's
            self._pending.exception()
        self._pending = None
        self._pool.shutdown(wait=True)
        if self.bar is not None:
            self.bar.close()

    def _wait(self) -> None:
        """Wait for the write in flight; raise its error."""
        if self._pending is not None:
            t0 = time.perf_counter()
            pending, self._pending = self._pending, None
            try:
                pending.result()
            finally:
                self.stats.time_s["write_wait"] += time.perf_counter() - t0

    def _bounds(self, c: int) -> tuple[int, int]:
        cr = self.run.chunking.chunk_rows
        return c * cr, min(self.run.topo.num_nodes, (c + 1) * cr)

    def put(self, r0: int, h: np.ndarray) -> None:
        """Output rows ``r0 .. r0 + len(h)`` (float32 [k, d_out])."""
        r1 = r0 + h.shape[0]
        while self.c < self.run.chunking.num_chunks:
            c0, c1 = self._bounds(self.c)
            a, z = max(r0, c0), min(r1, c1)
            if a >= z:
                return
            if self.buf is None:
                self.buf = np.empty((c1 - c0, self.d_out), dtype=np.float32)
            self.buf[a - c0:z - c0] = h[a - r0:z - r0]
            if z < c1:
                return
            self._write(c0)

    def _write(self, c0: int) -> None:
        run, l, buf = self.run, self.l, self.buf
        assert buf is not None  # full: every row was put
        self.buf = None
        check_finite(buf, run, l, c0)
        if buf.dtype != self.arr.dtype:  # a float16 layer: finite before, so past its range
            with np.errstate(over="ignore"):  # an overflow is named just below
                buf = buf.astype(self.arr.dtype)
            check_finite(buf, run, l, c0)
        self._wait()
        self._pending = self._pool.submit(self._store, self.c, c0, buf)
        self.c += 1

    def _store(self, c: int, c0: int, buf: np.ndarray) -> None:
        """The writer thread's part of chunk ``c`` (rows ``c0..``, the array's dtype)."""
        run = self.run
        t0 = time.perf_counter()
        write_chunk(run.group, self.arr, self.name, c, c0, buf)
        if self.columns is not None:
            self.columns.put(c0, buf)
        run.progress.chunk_written(c)
        self.stats.time_s["write"] += time.perf_counter() - t0
        if self.bar is not None:
            self.bar.update(1)
        if run.progress.on_chunk is not None:
            run.progress.on_chunk(self.l, c)

    def close(self) -> None:
        """Wait for the last write (raising its error) and finish the column files."""
        try:
            self._wait()
        finally:
            self._pool.shutdown(wait=True)
            if self.bar is not None:
                self.bar.close()
        assert self.c == self.run.chunking.num_chunks and self.buf is None, "rows left unwritten"
        if self.columns is not None:
            self.columns.finish()


def layer_costs(run: Run, l: int, d_in: int, d_out: int) -> BlockCosts | None:
    """Bytes per target, local node and edge of layer ``l``'s sub-blocks, measured by
    running the layer on probe graphs no larger than the budget leaves room for (None
    where peak RSS cannot be measured)."""
    model = run.model
    rows = min(run.chunking.chunk_rows, max(run.topo.num_nodes, 1))
    free = headroom(run.budget, rss(), rows, d_out)

    def layer(x, ei, w, nt):
        return model.targets(l, x, ei, w, nt)

    return measure_costs(layer, d_in, d_out, model.gcn_norm, free)


def run_layer(run: Run, l: int) -> dict:
    """Compute array ``h{l+1}`` for every node (resuming its written chunks); returns
    the layer's report (timings, blocks, bytes read, cache statistics, the way taken and
    every way's planned bytes).

    A layer whose convolution is a plain reduction and that the budget cannot run as one
    block of every node (which reads each input page once) is planned in column slices
    (:mod:`.sliced`) and by streamed groups (:mod:`.streamed`); with at most
    :data:`COMPARE_EDGES` edges the blocks are planned too (above, planning them walks
    the edges three or four times, more than it could save). The way planned to move the
    fewest bytes (read, and written besides the output: scratch files are written and read
    again) runs; ``run.aggregate`` may force one. Other layers run in blocks."""
    name, ch, n = f"h{l + 1}", run.chunking, run.topo.num_nodes
    run.dataset.check_mapped()  # before the plan walks the whole graph
    prev = None if l == 0 else run.group[f"h{l}"]
    d_in = run.dataset.feature_dim if prev is None else int(prev.shape[1])
    itemsize = 4 if prev is None else int(np.dtype(prev.dtype).itemsize)
    d_out = run.model.out_dim(l, d_in)
    t0 = time.perf_counter()
    costs = layer_costs(run, l, d_in, d_out) or BlockCosts.estimate(d_in, d_out)
    probe_s = time.perf_counter() - t0
    stream = _stream_plan(run, l, prev, d_in, d_out, itemsize, costs) \
        if run.aggregate in ("auto", "streamed") else None
    sliced = _sliced_plan(run, l, prev, d_in, d_out, itemsize, costs) \
        if run.aggregate in ("auto", "sliced") else None
    plan = None
    planned: dict[str, int] = {}   # bytes read
    written: dict[str, int] = {}   # bytes written besides the output
    if stream is not None:
        planned["streamed"], written["streamed"] = stream.planned_bytes, stream.write_bytes
    if sliced is not None:
        planned["sliced"], written["sliced"] = sliced.planned_bytes, sliced.write_bytes
    if planned and run.aggregate == "auto":
        run.topo.make_scratch()  # the blocks' node map, in the memory their plans measure
        if fits_one_block(run.topo, d_in, d_out, run.budget, ch, run.cache.policy, itemsize):
            stream = sliced = None
        else:
            if int(run.topo.indptr[-1]) <= COMPARE_EDGES:
                plan = _block_plan(run, l, d_in, d_out, costs, itemsize)
                planned["blocks"], written["blocks"] = plan.planned_bytes, 0
            # the fewest bytes moved: a way's scratch files are written and read again
            way = min(planned, key=lambda k: (planned[k] + written[k], k != "blocks"))
            stream = stream if way == "streamed" else None
            sliced = sliced if way == "sliced" else None
        if stream is not None or sliced is not None:  # planned without it
            run.topo.drop_scratch()
    first_chunk = run.progress.first_chunk(l, name in run.group)
    dtype = run.layer_dtype if l + 1 < run.model.num_layers else "float32"
    run.progress.state.update(layer=l, chunks_done=first_chunk)
    work = Path(run.group.store.root)
    scratch = (sliced.scratch_bytes if sliced is not None else 0) \
        + (BUCKET_BYTES * int(run.topo.indptr[-1]) if stream is not None else 0)
    columns = _next_columns(run, l, d_out, first_chunk, scratch)
    try:
        if stream is not None or sliced is not None:
            return _run_reducing(run, l, stream, sliced, prev, d_in, d_out, dtype, first_chunk,
                                 columns, planned, written, t0)
        if plan is None:
            plan = _block_plan(run, l, d_in, d_out, costs, itemsize)
        if run.cache.capacity is None:  # a cache size forced by the caller is not the budget's
            note_extra_reads(plan, run.budget, n, ch, d_in * itemsize, plan.d_out * 4)
        arr = layer_array(run.group, name, n, plan.d_out, ch.chunk_rows, dtype)
        rep = _run_blocks(run, plan, prev, arr, name, first_chunk, plan.plan_s + probe_s,
                          columns)
        rep["planned_bytes"] = {**planned, "blocks": plan.planned_bytes}
        rep["planned_written"] = {**written, "blocks": 0}
        return rep
    except BaseException:
        if columns is not None:
            columns.abort()
        raise
    finally:  # this layer's input columns, where a way other than slices took the layer
        shutil.rmtree(columns_dir(work, f"h{l}"), ignore_errors=True)


def _next_columns(run: Run, l: int, d_out: int, first_chunk: int,
                  scratch: int) -> ColumnFiles | None:
    """The column files of layer ``l``'s output for layer ``l + 1``, where that layer is
    planned (from the RSS now, and a margin of the budget's 1/32) to run in several column
    slices and the disk holds them beside the output and ``scratch`` (this layer's); None
    elsewhere, and when resuming the layer (its first chunks are written)."""
    if first_chunk or l + 1 >= run.model.num_layers or run.aggregate not in ("auto", "sliced"):
        return None
    reduction = run.model.aggregation(l + 1)
    if reduction is None:
        return None
    n, e = run.topo.num_nodes, int(run.topo.indptr[-1])
    d_next = run.model.out_dim(l + 1, d_out)
    item = int(np.dtype(run.layer_dtype).itemsize)
    table = n * d_out * item
    p = plan_sliced(reduction, n, e, d_out, d_next, d_out * item, table, table, run.budget,
                    run.chunking.chunk_rows, BlockCosts.estimate(d_out, d_next), True,
                    slice_cols=run.slice_cols, rss0=rss() + run.budget // 32,
                    col_dtype=run.layer_dtype)
    if p is None or p.slices == 1:
        return None
    root = Path(run.group.store.root)
    if 2 * table + scratch > shutil.disk_usage(root).free:
        return None
    return ColumnFiles(columns_dir(root, f"h{l + 1}"), p.bounds(d_out), n, run.layer_dtype)


def _run_reducing(run: Run, l: int, stream: StreamPlan | None, sliced: SlicePlan | None,
                  prev: Any, d_in: int, d_out: int, dtype: str, first_chunk: int,
                  columns: ColumnFiles | None, planned: dict[str, int],
                  written: dict[str, int], t0: float) -> dict:
    """Layer ``l`` streamed or in column slices (see :func:`run_layer`); its report."""
    name, ch, n = f"h{l + 1}", run.chunking, run.topo.num_nodes
    arr = layer_array(run.group, name, n, d_out, ch.chunk_rows, dtype)
    stats = LayerStats()
    stats.time_s["plan"] = time.perf_counter() - t0
    work = Path(run.group.store.root)
    with _ChunkWriter(run, l, arr, name, d_out, first_chunk, stats, columns) as writer:
        if sliced is not None:
            read = run_sliced(run, l, sliced, prev, d_in, first_chunk, writer, stats, work)
            reads = sliced.as_dict()
            blocks, peak, wb = sliced.slices, sliced.planned_peak_bytes, sliced.work
        else:
            assert stream is not None
            if run.stream_rows == (None, None):  # forced sizes are not the budget's
                stream.note_reads()
            read = run_streamed(run, l, stream, prev, d_in, first_chunk, writer, stats, work)
            reads = stream.as_dict()
            blocks, peak, wb = stream.groups, stream.planned_peak_bytes, stream.work
    return {"layer": l + 1, "array": name, "in_dim": d_in, "out_dim": d_out,
            "blocks": blocks, "resumed_chunks": first_chunk,
            "sub_blocks": stats.sub_blocks, "work_bytes": wb, "planned_peak_bytes": peak,
            "bytes_read": int(read), "cache": None,
            "reads": {**reads, "planned_block_bytes": planned.get("blocks"),
                      "planned_stream_bytes": planned.get("streamed"),
                      "planned_sliced_bytes": planned.get("sliced")},
            "planned_bytes": planned, "planned_written": written,
            "local_edges": stats.local_edges,
            "time_s": {k: round(v, 4) for k, v in stats.time_s.items()}}


def _input_shape(run: Run, prev: Any, d_in: int, itemsize: int) -> tuple[int, int, int, int, int]:
    """``(in_row, table, n_in, unit, align)`` of layer input: an input row's bytes as read
    (a padded layout's rows are read with their padding, then copied out), the whole
    table's, its rows, and the rows a source chunk is a multiple of (where one fits, and
    always)."""
    lay = run.dataset.file_layout
    if prev is None:
        in_row = lay.row_bytes if lay.packed else \
            lay.row_bytes + -(-lay.file_bytes // max(lay.num_rows, 1))
        unit = max(1, lay.rows_per_page)
        return in_row, lay.file_bytes, lay.num_rows, unit, unit
    n = run.topo.num_nodes
    return d_in * itemsize, n * d_in * itemsize, n, run.chunking.chunk_rows, 1


def _sliced_plan(run: Run, l: int, prev: Any, d_in: int, d_out: int, itemsize: int,
                 costs: BlockCosts) -> SlicePlan | None:
    """Layer ``l``'s column-sliced plan, None where it cannot run so or (``auto``) its
    scratch files do not fit the free disk; one line when ``run.aggregate`` asks for it and
    the layer cannot."""
    ds, topo = run.dataset, run.topo
    in_row, table, n_in, _, align = _input_shape(run, prev, d_in, itemsize)
    n = topo.num_nodes
    natural_keys = topo.natural and (prev is not None or ds.row_of is None)
    # the input's rows in the processing order: a layer's array, or a dataset stored so
    aligned = prev is not None or natural_keys or topo.rowof is ds.row_of
    col_dtype = np.dtype(prev.dtype if prev is not None else run.dataset.file_layout.dtype).name

    def replan(share: float, ready: bool = False, cols: int | None = run.slice_cols,
               columns: bool = False) -> SlicePlan | None:
        p = plan_sliced(run.model.aggregation(l), n, int(topo.indptr[-1]), d_in, d_out,
                        in_row, table, table if prev is None else n * d_in * itemsize,
                        run.budget, run.chunking.chunk_rows, costs, not natural_keys,
                        index_bytes=topo.indices.itemsize, slice_cols=cols,
                        n_in=n_in, aligned=aligned, local_share=share, src_align=align,
                        edges_sorted=ready, columns_ready=columns, col_dtype=col_dtype)
        if p is not None:
            p.keys = "rows" if aligned else "features"
        return p

    plan = replan(0.0)
    work = Path(run.group.store.root)
    share, ready = 0.0, False
    if plan is not None and plan.sorted_edges:
        local = edges_ready(work, plan)
        if local is not None:  # an earlier layer sorted them: its count, not a sample
            share, ready = local / max(int(topo.indptr[-1]), 1), True
            plan = replan(share, ready)
        elif plan.local_rows:  # the local edges' share, from a sample
            rows = np.linspace(0, n - 1, min(n, LOCAL_SAMPLE)).astype(np.int64)
            share = local_share(topo.indptr, topo.indices, topo.perm, input_keys(run, prev),
                                rows, plan.local_rows, plan.halo)
            topo.release_pages()
            plan = replan(share)
    if plan is not None and prev is not None and plan.slices > 1:
        # the layer before wrote its output's column files: their slices, where they fit
        bounds = prepared_columns(work, f"h{l}", n_in, col_dtype)
        if bounds is not None and bounds[0][1] - bounds[0][0] <= plan.slice_cols:
            taken = replan(share, ready, bounds[0][1] - bounds[0][0], True)
            if taken is not None and taken.bounds(d_in) == bounds:
                plan = taken
    if plan is None and run.aggregate == "sliced":
        why = ("its convolution is not a plain mean, sum or max of its input rows"
               if run.model.aggregation(l) is None else
               "the budget does not hold one column of every input row")
        raise InvalidValue(f"--aggregate sliced: layer {l + 1} cannot run in column slices "
                           f"({why}); use --aggregate auto")
    if plan is not None and run.aggregate == "auto" and \
            plan.scratch_bytes + n * d_out * 4 > shutil.disk_usage(run.group.store.root).free:
        return None  # its scratch does not fit beside the layer: the other ways
    return plan


def _stream_plan(run: Run, l: int, prev: Any, d_in: int, d_out: int, itemsize: int,
                 costs: BlockCosts) -> StreamPlan | None:
    """Layer ``l``'s streamed plan, None where it does not stream (one line when
    ``run.aggregate`` asks for it and the layer cannot)."""
    n = run.topo.num_nodes
    reduction = run.model.aggregation(l)
    in_row, table, n_in, unit, align = _input_shape(run, prev, d_in, itemsize)
    rss0 = rss()

    def replan(budget: int, forced: tuple = run.stream_rows) -> StreamPlan | None:
        return plan_stream(reduction, n, int(run.topo.indptr[-1]), d_in, d_out, in_row, table,
                           budget, run.chunking.chunk_rows, unit, align, costs,
                           group_rows=forced[0], src_rows=forced[1], rss0=rss0, n_in=n_in)

    plan = replan(run.budget)
    if plan is None and run.aggregate == "streamed":
        why = ("its convolution is not a plain mean, sum or max of its input rows"
               if reduction is None else "the budget does not hold one chunk of accumulators")
        raise InvalidValue(f"--aggregate streamed: layer {l + 1} cannot stream ({why}); "
                           f"use --aggregate auto")
    if plan is not None:
        plan.note_reads = lambda: note_stream_reads(l, plan, run.budget, n, d_in, table,
                                              lambda b: replan(b, (None, None)))
    return plan


#: ``aggregate="auto"`` plans the blocks beside a streamed layer, to take the way that
#: moves fewer bytes, up to this many edges.
COMPARE_EDGES = 1 << 25


def _block_plan(run: Run, l: int, d_in: int, d_out: int, costs: BlockCosts,
                itemsize: int) -> LayerPlan:
    run.topo.make_scratch()  # made before the plan measures the memory it leaves
    plan = plan_layer(l, run.dataset, run.topo, d_in, d_out, run.budget, run.chunking,
                      run.cache, costs, itemsize)
    run.topo.release_pages()  # the plan walked every edge and node
    return plan


def _run_blocks(run: Run, plan: LayerPlan, prev: Any, arr: Any, name: str, first_chunk: int,
                plan_s: float, columns: ColumnFiles | None = None) -> dict:
    """Layer ``plan.l`` block after block (see :func:`run_layer`)."""
    ch, n, l = run.chunking, run.topo.num_nodes, plan.l
    d_in = plan.d_in
    first_block = int(np.searchsorted(plan.starts, first_chunk * ch.chunk_rows,
                                      side="right")) - 1
    src = LayerInput(prev, run.reader, run.dataset.layout.row_bytes, ch.chunk_rows, n,
                     row_of=run.dataset.row_of)
    if prev is not None and plan.seq is None:
        src.prev_rows = ChunkFileRows(Path(run.group.store.root) / f"h{l}", n, ch.chunk_rows,
                                      d_in, prev.dtype, backend=run.io_backend)
    cache = None
    if plan.seq is not None:
        assert plan.ptr is not None  # ptr and seq are None together
        cache = ChunkCache(plan.cap, run.cache.policy, sequence=plan.seq[plan.ptr[first_block]:],
                           loader=src.load_chunk, num_keys=ch.num_chunks)
    stats = LayerStats()
    stats.time_s["plan"] = plan_s
    with _ChunkWriter(run, l, arr, name, plan.d_out, first_chunk, stats, columns) as writer:
        for b in range(max(first_block, 0),
                       plan.num_blocks if first_chunk < ch.num_chunks else 0):
            _run_block(run, plan, src, cache, b, stats, writer)
    run.topo.drop_scratch()
    run.topo.release_pages()  # what the last block's rows mapped of the row map
    if run.dataset.row_of is not None:
        release_mapped(run.dataset.row_of)
    return _layer_report(plan, name, first_chunk, max(first_block, 0), src, cache, stats)
