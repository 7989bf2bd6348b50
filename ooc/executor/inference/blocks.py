"""Planning one layer: the memory split, the blocks of targets and the chunks each
block reads (the access sequence the Belady cache evicts by)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...memory import trim_malloc
from ...storage.dataset import Dataset
from ...storage.layout import PAGE
from ..cache.chunk_cache import simulate
from ._kernels import access_plan, count_block_keys, plan_blocks
from .local_graph import Topology
from .memory_plan import MiB, SAFETY_BYTES, plan_memory, rss


@dataclass
class CacheSettings:
    """The previous-layer chunk cache: ``policy`` (belady, lru, fifo) and a forced
    capacity in chunks (``capacity=None``: sized from the budget)."""
    policy: str = "belady"
    capacity: int | None = None


@dataclass
class Chunking:
    """Output rows per Zarr chunk, their count, and the cap on targets per block."""
    chunk_rows: int
    num_chunks: int
    block_rows: int | None = None


@dataclass
class LayerPlan:
    """How layer ``l`` runs.

    Attributes:
        starts: int64 [B+1] first row of each block, then N.
        ptr, seq: block b reads input chunks ``seq[ptr[b]:ptr[b+1]]`` (int64); both
            None when the blocks read the rows they need instead.
        keyof: int64 [N] node -> row of the input array (chunk = row // chunk_rows).
        cap: cache capacity in chunks (0 without a cache).
        work, rss0, pressure: block working-set bytes, RSS at the start, and
            whether RSS had grown past what the budget planned for.
        reads: the planned bytes of both ways and the one chosen (``mode``).
    """
    l: int
    d_in: int
    d_out: int
    starts: np.ndarray
    ptr: np.ndarray | None
    seq: np.ndarray | None
    keyof: np.ndarray
    cap: int
    work: int
    rss0: int
    pressure: bool
    in_chunk_bytes: int
    plan_s: float = 0.0
    reads: dict | None = None

    @property
    def num_blocks(self) -> int:
        return int(self.starts.shape[0] - 1)


def _layer_memory(budget: int, n: int, d_in: int, d_out: int, chunking: Chunking,
                  cache: CacheSettings, in_itemsize: int = 4
                  ) -> tuple[int, int, int, int, int, bool]:
    """``(cap, work, node_bytes, edge_bytes, rss0, pressure)`` at the start of a layer."""
    trim_malloc()
    rss0 = rss()
    rows = min(chunking.chunk_rows, max(n, 1))
    # RSS may have grown since the start (allocator arenas, the chunk cache's
    # last contents); if the budget is now short, run with the minimum.
    floor = budget - 2 * rows * d_out * 4 - SAFETY_BYTES - 2 * MiB
    cap, work, node_bytes, edge_bytes = plan_memory(budget, min(rss0, floor), rows, d_in, d_out,
                                                     True, cache.capacity, chunking.num_chunks,
                                                     in_itemsize)
    return cap, work, node_bytes, edge_bytes, rss0, rss0 > floor


def _planned_row_bytes(l: int, dataset: Dataset, topo: Topology, starts: np.ndarray,
                       in_row_bytes: int) -> int:
    """Bytes of pages the blocks read when each reads the rows it needs (pages counted
    once per block): layer 0's in ``features.bin`` (rows packed in pages, in the stored
    order), a later layer's in its chunk files (rows in processing order, contiguous)."""
    n = topo.num_nodes
    if l == 0:
        lay = dataset.layout
        keyof = dataset.row_of if dataset.row_of is not None else np.zeros(0, np.int64)
        if lay.rows_per_page:
            return count_block_keys(topo.indptr, topo.indices, topo.perm, starts, keyof,
                                    lay.rows_per_page, lay.num_pages) * PAGE
        return count_block_keys(topo.indptr, topo.indices, topo.perm, starts, keyof, 1, n) \
            * lay.pages_per_row * PAGE
    per_page = max(1, PAGE // in_row_bytes)
    pages_per_row = -(-in_row_bytes // PAGE)
    return count_block_keys(topo.indptr, topo.indices, topo.perm, starts, topo.rowof,
                            per_page, -(-n // per_page)) * pages_per_row * PAGE


def _choose_reads(l: int, dataset: Dataset, topo: Topology, starts: np.ndarray,
                  chunking: Chunking, cap: int, policy: str, in_row_bytes: int):
    """A layer reads the rows each block needs (pages, deduplicated per block) or whole
    input chunks through the cache, whichever the plan says reads fewer bytes.
    Returns ``(ptr, seq, keyof, cap, info)`` (``ptr``/``seq`` None and ``cap`` 0 for rows);
    ``keyof`` maps a node to its key in the input: reading chunks, the row of layer 0's
    chunks (node ids) or of a later layer's (processing order); reading rows, the
    processing-order row (layer 0 then reads by node id)."""
    n = topo.num_nodes
    keyof = topo.rowof if l > 0 or topo.natural else np.arange(n, dtype=np.int64)
    page_bytes = _planned_row_bytes(l, dataset, topo, starts, in_row_bytes)
    ptr, seq = access_plan(topo.indptr, topo.indices, topo.perm, keyof, starts,
                           chunking.chunk_rows, chunking.num_chunks)
    sim = simulate(seq, cap, policy, num_keys=chunking.num_chunks) if cap else None
    rows = min(chunking.chunk_rows, max(n, 1))
    chunk_bytes = (sim["misses"] if sim else seq.shape[0]) * rows * in_row_bytes
    info = {"planned_row_bytes": int(page_bytes), "planned_chunk_bytes": int(chunk_bytes)}
    if cap and chunk_bytes < page_bytes:
        return ptr, seq, keyof, cap, {"mode": "chunks", **info}
    return None, None, topo.rowof, 0, {"mode": "rows", **info}


def plan_layer(l: int, dataset: Dataset, topo: Topology, d_in: int, d_out: int, budget: int,
               chunking: Chunking, cache: CacheSettings, in_itemsize: int = 4) -> LayerPlan:
    """Size the cache and blocks of layer ``l`` from the budget and plan its reads
    (``in_itemsize``: bytes of an input value in its chunks, 2 for a float16 layer)."""
    n = topo.num_nodes
    cap, work, node_bytes, edge_bytes, rss0, pressure = _layer_memory(budget, n, d_in, d_out,
                                                                       chunking, cache,
                                                                       in_itemsize)
    t0 = time.perf_counter()
    block_rows = int(chunking.block_rows or chunking.chunk_rows)
    starts = plan_blocks(topo.indptr, topo.perm, chunking.chunk_rows, block_rows, node_bytes,
                         edge_bytes, work)
    in_row_bytes = dataset.layout.row_bytes if l == 0 else d_in * in_itemsize
    ptr, seq, keyof, cap_used, reads = _choose_reads(l, dataset, topo, starts, chunking, cap,
                                                     cache.policy, in_row_bytes)
    if cap and not cap_used:
        # rows it is: the memory planned for the cache goes to larger blocks, which read
        # each page once for more targets
        _, work, _, _, _, _ = _layer_memory(budget, n, d_in, d_out, chunking,
                                            CacheSettings(cache.policy, 0), in_itemsize)
        starts = plan_blocks(topo.indptr, topo.perm, chunking.chunk_rows, block_rows,
                             node_bytes, edge_bytes, work)
        reads["planned_row_bytes"] = _planned_row_bytes(l, dataset, topo, starts, in_row_bytes)
    cap = cap_used
    rows = min(chunking.chunk_rows, max(n, 1))
    return LayerPlan(l, d_in, d_out, starts, ptr, seq, keyof, cap, work, rss0, pressure,
                     rows * d_in * in_itemsize, time.perf_counter() - t0, reads)


#: Planned reads above this many times a layer's input table are worth a note.
EXTRA_READS = 3.0
#: What a suggested budget adds for RSS grown by the time a later layer starts.
RSS_MARGIN = 32 * MiB


def note_extra_reads(plan: LayerPlan, budget: int, n: int, chunking: Chunking,
                     in_row_bytes: int, out_row_bytes: int) -> None:
    """A one-line note when the budget makes layer ``plan.l`` read its input more than
    :data:`EXTRA_READS` times over, naming the budget whose chunk cache holds all of it
    (``in_row_bytes``/``out_row_bytes``: bytes of an input row in its chunks and of an
    output row in memory)."""
    from ...cli import format_size
    from ...storage.errors import setting
    from ...storage.notes import note

    table = n * in_row_bytes
    if plan.reads is None or not table:
        return
    planned = plan.reads["planned_row_bytes" if plan.reads["mode"] == "rows"
                         else "planned_chunk_bytes"]
    if planned <= EXTRA_READS * table:
        return
    rows = min(chunking.chunk_rows, max(n, 1))
    in_chunk = rows * in_row_bytes
    # RSS grows a little from layer to layer (the allocator keeps freed chunks): margin
    enough = (plan.rss0 + 2 * rows * out_row_bytes + SAFETY_BYTES + in_chunk
              + 2 * chunking.num_chunks * in_chunk + RSS_MARGIN)
    enough = -(-enough // MiB) * MiB
    if enough <= budget:
        return
    note(f"inference layer {plan.l + 1} reads about {format_size(planned)} ("
         f"{planned / table:.0f}x its input) at {setting('--memory-budget')} "
         f"{format_size(budget)}; {format_size(enough)} holds its input in memory")

