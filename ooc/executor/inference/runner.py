"""Running one layer over every node: blocks of targets, their inputs read through
the chunk cache (or feature rows for layer 0), the layer applied, output chunks
written and recorded in the progress file."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...storage.dataset import Dataset
from ...storage.errors import OocError
from ..cache.chunk_cache import ChunkCache
from ...storage.layout import PAGE
from .blocks import CacheSettings, Chunking, LayerPlan, note_extra_reads, plan_layer
from .chunk_rows import ChunkFileRows
from .local_graph import LocalGraph, Topology, local_graph
from .model_adapter import LayerwiseModel
from .store import Progress, layer_array, write_chunk


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


class NonFiniteOutput(OocError, FloatingPointError):
    """A layer's output holds a NaN or an infinity (named by its first node)."""


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

    def _read_features(self, ids: np.ndarray) -> np.ndarray:
        st = getattr(self.reader, "stats", None)
        before = st.bytes_read if st is not None else 0
        a = self.reader.read(ids)
        self.bytes_read += (st.bytes_read - before if st is not None
                            else ids.shape[0] * self.row_bytes)
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
        by node id for layer 0, else the previous layer's rows ``keyof[nodes]`` from its
        chunk files (in ascending order either way)."""
        if self.prev_rows is None:
            o = np.argsort(nodes)
            x[o] = self._read_features(nodes[o])
            return
        before = self.prev_rows.pages
        self.prev_rows.read(keyof[nodes], x)
        self.bytes_read += (self.prev_rows.pages - before) * PAGE


@dataclass
class LayerStats:
    """Seconds per stage and the largest block of one layer."""
    time_s: dict = field(default_factory=lambda: dict.fromkeys(
        ("plan", "local_graph", "read", "compute", "write"), 0.0))
    peak_block_nodes: int = 0
    peak_block_edges: int = 0


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
               stats: LayerStats) -> np.ndarray:
    """Layer ``plan.l`` for the targets of block ``b``: float32-convertible [targets, d_out]."""
    s, e = int(plan.starts[b]), int(plan.starts[b + 1])
    t0 = time.perf_counter()
    g: LocalGraph = local_graph(run.topo, s, e)
    t1 = time.perf_counter()
    x = np.empty((g.nodes.shape[0], plan.d_in), dtype=np.float32)
    if cache is None:
        src.read_rows(g.nodes, plan.keyof, x)
    else:
        _gather_from_chunks(plan, cache, run.chunking.chunk_rows, b, g.nodes, x)
    t2 = time.perf_counter()
    ei = torch.from_numpy(np.stack([g.src, g.dst]))
    ew = None if g.weight is None else torch.from_numpy(g.weight)
    h = run.model.targets(plan.l, torch.from_numpy(x), ei, ew, g.num_targets).numpy()
    t = stats.time_s
    t["local_graph"] += t1 - t0
    t["read"] += t2 - t1
    t["compute"] += time.perf_counter() - t2
    stats.peak_block_nodes = max(stats.peak_block_nodes, int(g.nodes.shape[0]))
    stats.peak_block_edges = max(stats.peak_block_edges, int(g.src.shape[0]))
    return h


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
        "resumed_chunks": first_chunk, "peak_block_nodes": stats.peak_block_nodes,
        "peak_block_edges": stats.peak_block_edges, "work_bytes": int(plan.work),
        "rss_at_start": plan.rss0, "budget_pressure": bool(plan.pressure),
        "bytes_read": int(src.bytes_read), "chunk_reads": src.chunk_reads,
        "accesses": accesses,
        "cache": None if cache is None else {**cache.stats(), "chunk_bytes": plan.in_chunk_bytes},
        "reads": plan.reads,
        "time_s": {k: round(v, 4) for k, v in stats.time_s.items()},
    }


def check_finite(buf: np.ndarray, run: Run, l: int, c0: int) -> None:
    """Raise :class:`NonFiniteOutput` naming the first node whose row of ``buf``
    (float32 [rows, d_out], output rows ``c0..``) holds a NaN or an infinity."""
    bad = ~np.isfinite(buf).all(axis=1)
    if bad.any():
        node = int(run.topo.perm[c0 + int(np.argmax(bad))])
        why = ("a value past float16's range: use --layer-dtype float32"
               if buf.dtype == np.float16 else
               "NaN or infinite features or model weights")
        raise NonFiniteOutput(f"{run.dataset.path}: layer {l + 1} of inference gives a "
                              f"non-finite output at node {node} ({why}); nothing was "
                              f"renamed into the output")


def run_layer(run: Run, l: int) -> dict:
    """Compute array ``h{l+1}`` for every node (resuming its written chunks); returns
    the layer's report (timings, blocks, bytes read, cache statistics)."""
    name, ch, n = f"h{l + 1}", run.chunking, run.topo.num_nodes
    prev = None if l == 0 else run.group[f"h{l}"]
    d_in = run.dataset.feature_dim if prev is None else int(prev.shape[1])
    itemsize = 4 if prev is None else int(np.dtype(prev.dtype).itemsize)
    plan = plan_layer(l, run.dataset, run.topo, d_in, run.model.out_dim(l, d_in), run.budget,
                      ch, run.cache, itemsize)
    if run.cache.capacity is None:  # a cache size forced by the caller is not the budget's
        note_extra_reads(plan, run.budget, n, ch, d_in * itemsize, plan.d_out * 4)
    first_chunk = run.progress.first_chunk(l, name in run.group)
    dtype = run.layer_dtype if l + 1 < run.model.num_layers else "float32"
    arr = layer_array(run.group, name, n, plan.d_out, ch.chunk_rows, dtype)
    first_block = int(np.searchsorted(plan.starts, first_chunk * ch.chunk_rows, side="left"))
    run.progress.state.update(layer=l, chunks_done=first_chunk)
    src = LayerInput(prev, run.reader, run.dataset.layout.row_bytes, ch.chunk_rows, n)
    if prev is not None and plan.seq is None:
        src.prev_rows = ChunkFileRows(Path(run.group.store.root) / f"h{l}", n, ch.chunk_rows,
                                      d_in, prev.dtype)
    cache = None
    if plan.seq is not None:
        assert plan.ptr is not None  # ptr and seq are None together
        cache = ChunkCache(plan.cap, run.cache.policy, sequence=plan.seq[plan.ptr[first_block]:],
                           loader=src.load_chunk, num_keys=ch.num_chunks)
    stats = LayerStats()
    stats.time_s["plan"] = plan.plan_s
    bar = _progress_bar(run, l, first_chunk)
    b = first_block
    for c in range(first_chunk, ch.num_chunks):
        c0, c1 = c * ch.chunk_rows, min(n, (c + 1) * ch.chunk_rows)
        buf = np.empty((c1 - c0, plan.d_out), dtype=np.float32)
        while b < plan.num_blocks and plan.starts[b] < c1:
            buf[plan.starts[b] - c0:plan.starts[b + 1] - c0] = _run_block(run, plan, src, cache,
                                                                           b, stats)
            b += 1
        check_finite(buf, run, l, c0)
        if buf.dtype != arr.dtype:  # a float16 layer: finite before, so past its range
            with np.errstate(over="ignore"):  # an overflow is named just below
                buf = buf.astype(arr.dtype)
            check_finite(buf, run, l, c0)
        t0 = time.perf_counter()
        write_chunk(run.group, arr, name, c, c0, buf)
        del buf
        run.progress.chunk_written(c)
        stats.time_s["write"] += time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
        if run.progress.on_chunk is not None:
            run.progress.on_chunk(l, c)
    if bar is not None:
        bar.close()
    return _layer_report(plan, name, first_chunk, first_block, src, cache, stats)
