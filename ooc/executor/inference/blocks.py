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
        ptr, seq: block b reads previous-layer chunks ``seq[ptr[b]:ptr[b+1]]``
            (int64); both None when layer 0 reads feature rows per block.
        keyof: int64 [N] node -> row of the input array (chunk = row // chunk_rows).
        cap: cache capacity in chunks (0 without a cache).
        work, rss0, pressure: block working-set bytes, RSS at the start, and
            whether RSS had grown past what the budget planned for.
        layer0: for layer 0, the planned bytes of both ways and the one chosen.
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
    layer0: dict | None = None

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


def _choose_layer0_reads(dataset: Dataset, topo: Topology, starts: np.ndarray,
                         chunking: Chunking, cap: int, policy: str):
    """Layer 0 reads the rows each block needs (pages, deduplicated per block) or whole
    feature chunks through the cache, whichever the plan says reads fewer bytes.
    Returns ``(ptr, seq, keyof, cap, info)`` (``ptr``/``seq`` None and ``cap`` 0 for rows)."""
    lay, n = dataset.layout, topo.num_nodes
    ident = topo.rowof if topo.natural else np.arange(n, dtype=np.int64)
    if lay.rows_per_page:
        page_bytes = count_block_keys(topo.indptr, topo.indices, topo.perm, starts,
                                      lay.rows_per_page, lay.num_pages) * PAGE
    else:
        page_bytes = count_block_keys(topo.indptr, topo.indices, topo.perm, starts, 1, n) \
            * lay.pages_per_row * PAGE
    ptr, seq = access_plan(topo.indptr, topo.indices, topo.perm, ident, starts,
                           chunking.chunk_rows, chunking.num_chunks)
    sim = simulate(seq, cap, policy, num_keys=chunking.num_chunks) if cap else None
    rows = min(chunking.chunk_rows, max(n, 1))
    chunk_bytes = (sim["misses"] if sim else seq.shape[0]) * rows * lay.row_bytes
    info = {"planned_row_bytes": int(page_bytes), "planned_chunk_bytes": int(chunk_bytes)}
    if cap and chunk_bytes < page_bytes:
        return ptr, seq, ident, cap, {"mode": "chunks", **info}
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
    starts = plan_blocks(topo.indptr, topo.perm, chunking.chunk_rows,
                         int(chunking.block_rows or chunking.chunk_rows), node_bytes,
                         edge_bytes, work)
    layer0 = None
    if l > 0:
        ptr, seq = access_plan(topo.indptr, topo.indices, topo.perm, topo.rowof, starts,
                               chunking.chunk_rows, chunking.num_chunks)
        keyof = topo.rowof
    else:
        ptr, seq, keyof, cap, layer0 = _choose_layer0_reads(dataset, topo, starts, chunking,
                                                            cap, cache.policy)
    rows = min(chunking.chunk_rows, max(n, 1))
    return LayerPlan(l, d_in, d_out, starts, ptr, seq, keyof, cap, work, rss0, pressure,
                     rows * d_in * in_itemsize, time.perf_counter() - t0, layer0)
