"""Planning one layer: the memory split, the blocks of targets and the chunks each
block reads (the access sequence the Belady cache evicts by)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ooc.caches.chunk_cache import simulate
from ooc.core.errors import setting
from ooc.core.memory import trim_malloc
from ooc.core.notes import note
from ooc.core.sizes import format_size
from ooc.executor.inference._kernels import access_plan, count_block_keys, plan_blocks
from ooc.executor.inference.local_graph import Topology
from ooc.executor.inference.memory_plan import (
    SAFETY_BYTES,
    BlockCosts,
    BlockPhases,
    MiB,
    output_buffers,
    plan_memory,
    rss,
)
from ooc.storage.dataset import Dataset
from ooc.storage.layout import PAGE


@dataclass
class CacheSettings:
    """The previous-layer chunk cache: ``policy`` (belady, lru, fifo) and a forced
    capacity in chunks (``capacity=None``: sized from the budget)."""
    policy: str = "belady"
    capacity: int | None = None


@dataclass
class Chunking:
    """Output rows per Zarr chunk, their count, and the cap on targets per block (None:
    as many as the memory holds)."""
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
        sub_work, sub_costs: each sub-block's share of ``work`` and its costs (the
            layer's own, measured where possible): a block's targets run through the
            layer a sub-block at a time, so a block is sized by the rows it holds.
        one_block: the working set that would run the layer as one block (each input
            page read once).
        one_block_peak: what that one block holds at its largest (its phases'
            largest, :meth:`~.memory_plan.BlockPhases.peak`); 0 when unknown.
        reads: the planned bytes of both ways and the one chosen (``mode``).
        chunk_rows: rows of an output chunk (the last may hold fewer).
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
    sub_work: int
    sub_costs: BlockCosts
    one_block: int = 0
    plan_s: float = 0.0
    reads: dict | None = None
    chunk_rows: int = 0
    one_block_peak: int = 0

    @property
    def num_blocks(self) -> int:
        return int(self.starts.shape[0] - 1)

    @property
    def planned_peak_bytes(self) -> int:
        """The RSS the layer is planned to reach: the RSS at its start, two output chunks,
        the chunk cache and a chunk read past it, and the blocks' working set (where one
        block holds the layer: the largest phase of that block)."""
        out_chunks = output_buffers(self.chunk_rows, self.d_out)
        cache = (self.cap + 1) * self.in_chunk_bytes if self.cap else 0
        work = self.work
        if self.num_blocks == 1 and self.one_block_peak:
            work = min(work, self.one_block_peak)
        return int(self.rss0 + out_chunks + cache + work)

    @property
    def planned_bytes(self) -> int:
        """The bytes the plan reads, the way it chose (``reads["mode"]``)."""
        assert self.reads is not None  # set by plan_layer
        return int(self.reads["planned_row_bytes" if self.reads["mode"] == "rows"
                              else "planned_chunk_bytes"])


def _layer_memory(budget: int, n: int, d_in: int, d_out: int, chunking: Chunking,
                  cache: CacheSettings, in_itemsize: int = 4) -> tuple[int, int, int, bool]:
    """``(cap, work, rss0, pressure)`` at the start of a layer."""
    trim_malloc()
    rss0 = rss()
    rows = min(chunking.chunk_rows, max(n, 1))
    # RSS may have grown since the start (allocator arenas, the chunk cache's
    # last contents); if the budget is now short, run with the minimum.
    floor = budget - output_buffers(rows, d_out) - SAFETY_BYTES - 2 * MiB
    cap, work = plan_memory(budget, min(rss0, floor), rows, d_in, d_out, True, cache.capacity,
                            chunking.num_chunks, in_itemsize)
    return cap, work, rss0, rss0 > floor


def _planned_row_bytes(l: int, dataset: Dataset, topo: Topology, starts: np.ndarray,
                       in_row_bytes: int) -> int:
    """Bytes of pages the blocks read when each reads the rows it needs (pages counted
    once per block): layer 0's in ``features.bin`` (rows packed in pages, in the stored
    order), a later layer's in its chunk files (rows in processing order, contiguous)."""
    n = topo.num_nodes
    if l == 0:
        lay = dataset.file_layout
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


def _chunk_plan(topo: Topology, starts: np.ndarray, chunking: Chunking, cap: int,
                policy: str, in_row_bytes: int, natural_keys: bool):
    """Reading whole input chunks through a cache of ``cap`` chunks: ``(ptr, seq, keyof,
    bytes)``, the chunks each block reads, node -> row of the input's chunks (layer 0's
    chunks are by node id, a later layer's in processing order: ``natural_keys``) and the
    bytes the cache's misses read."""
    n = topo.num_nodes
    keyof = topo.rowof if natural_keys else np.arange(n, dtype=topo.perm.dtype)
    ptr, seq = access_plan(topo.indptr, topo.indices, topo.perm, keyof, starts,
                           chunking.chunk_rows, chunking.num_chunks)
    misses = simulate(seq, cap, policy, num_keys=chunking.num_chunks)["misses"]
    rows = min(chunking.chunk_rows, max(n, 1))
    return ptr, seq, keyof, int(misses * rows * in_row_bytes)


#: The share of a block's working set its sub-blocks run in.
SUB_SHARE = 0.125


def _blocks(topo: Topology, chunking: Chunking, work: int,
            outer: BlockPhases) -> tuple[np.ndarray, int]:
    """Block starts for ``work`` bytes (every phase of a block within it, its sub-blocks'
    share included: ``outer``) and that share."""
    sub_work = max(int(work * SUB_SHARE), 1)
    block_rows = int(chunking.block_rows or max(topo.num_nodes, 1))
    costs, limits = outer.limits(work, sub_work)
    starts = plan_blocks(topo.indptr, topo.indices, topo.perm, block_rows, costs, limits,
                         topo.scratch)
    return starts, sub_work


def fits_one_block(topo: Topology, d_in: int, d_out: int, budget: int, chunking: Chunking,
                   policy: str, in_itemsize: int = 4) -> bool:
    """Whether the budget runs layer ``l`` as one block of every node (then the blocks
    read each input page once), from the block costs alone: no walk of the edges."""
    n = topo.num_nodes
    if chunking.block_rows is not None and chunking.block_rows < n:
        return False
    _, work, _, _ = _layer_memory(budget, n, d_in, d_out, chunking, CacheSettings(policy, 0),
                                  in_itemsize)
    outer = BlockPhases.of_layer(d_in, topo.dinv is not None)
    return outer.work_for(n, n, int(topo.indptr[-1]), SUB_SHARE) <= work


def plan_layer(l: int, dataset: Dataset, topo: Topology, d_in: int, d_out: int, budget: int,
               chunking: Chunking, cache: CacheSettings, costs: BlockCosts,
               in_itemsize: int = 4) -> LayerPlan:
    """Size the blocks of layer ``l`` from the budget and plan its reads (``costs``: the
    layer's sub-block costs; ``in_itemsize``: bytes of an input value in its chunks, 2 for
    a float16 layer).

    Two plans are made and the one the planner counts fewer bytes for is taken: the
    blocks read the rows they need (pages, deduplicated per block), every byte of the
    budget going to blocks; or half the memory caches whole input chunks (Belady over
    the blocks' chunk sequence) and smaller blocks take their rows from it. The second
    is not made when the first is one block (it reads every page at most once)."""
    n = topo.num_nodes
    t0 = time.perf_counter()
    outer = BlockPhases.of_layer(d_in, topo.dinv is not None)
    in_row_bytes = dataset.layout.row_bytes if l == 0 else d_in * in_itemsize
    _, work, rss0, pressure = _layer_memory(budget, n, d_in, d_out, chunking,
                                            CacheSettings(cache.policy, 0), in_itemsize)
    starts, sub_work = _blocks(topo, chunking, work, outer)
    row_bytes = _planned_row_bytes(l, dataset, topo, starts, in_row_bytes)
    reads = {"mode": "rows", "planned_row_bytes": int(row_bytes), "planned_chunk_bytes": None}
    ptr = seq = None
    keyof, cap = topo.rowof, 0
    c_cap, c_work, _, _ = _layer_memory(budget, n, d_in, d_out, chunking, cache, in_itemsize)
    # one block reads each page once: whole chunks cannot read less (nor be planned for free)
    if c_cap and starts.shape[0] > 2:
        c_starts, c_sub = _blocks(topo, chunking, c_work, outer)
        c_ptr, c_seq, c_keyof, chunk_bytes = _chunk_plan(
            topo, c_starts, chunking, c_cap, cache.policy, in_row_bytes, l > 0 or topo.natural)
        reads["planned_chunk_bytes"] = chunk_bytes
        if chunk_bytes < row_bytes:
            reads["mode"] = "chunks"
            starts, sub_work, ptr, seq, keyof, cap, work = (c_starts, c_sub, c_ptr, c_seq,
                                                            c_keyof, c_cap, c_work)
    rows = min(chunking.chunk_rows, max(n, 1))
    edges = int(topo.indptr[-1])
    return LayerPlan(l, d_in, d_out, starts, ptr, seq, keyof, cap, work, rss0, pressure,
                     rows * d_in * in_itemsize, sub_work, costs,
                     outer.work_for(n, n, edges, SUB_SHARE), time.perf_counter() - t0, reads,
                     rows, outer.peak(n, n, edges, sub_work))


#: Planned reads above this many times a layer's input table are worth a note.
EXTRA_READS = 3.0
#: What a suggested budget adds for RSS grown by the time a later layer starts.
RSS_MARGIN = 32 * MiB


def note_extra_reads(plan: LayerPlan, budget: int, n: int, chunking: Chunking,
                     in_row_bytes: int, out_row_bytes: int) -> None:
    """A one-line note when the budget makes layer ``plan.l`` read its input more than
    :data:`EXTRA_READS` times over, naming the budget that reads it once: one block of
    every node, or a chunk cache that holds all of it, whichever is smaller
    (``in_row_bytes``/``out_row_bytes``: bytes of an input row in its chunks and of an
    output row in memory)."""

    table = n * in_row_bytes
    if plan.reads is None or not table:
        return
    planned = plan.planned_bytes
    if planned <= EXTRA_READS * table:
        return
    rows = min(chunking.chunk_rows, max(n, 1))
    in_chunk = rows * in_row_bytes
    # RSS grows a little from layer to layer (the allocator keeps freed chunks): margin
    held = 2 * chunking.num_chunks * in_chunk + in_chunk
    if plan.one_block:
        held = min(held, plan.one_block)
    enough = plan.rss0 + 2 * rows * out_row_bytes + SAFETY_BYTES + held + RSS_MARGIN
    enough = -(-enough // MiB) * MiB
    if enough <= budget:
        return
    note(f"inference layer {plan.l + 1} reads about {format_size(planned)} ("
         f"{planned / table:.0f}x its input) at {setting('--memory-budget')} "
         f"{format_size(budget)}; {enough // MiB}MiB reads it once")

