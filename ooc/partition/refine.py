"""Streaming refinement of a node partition (after any partitioner).

One pass reads the CSC edge stream in file order (:mod:`ooc.partition.edges`,
unshuffled, bounded chunks), so every node's in-neighbour list arrives
contiguously. When a node's list is complete the node moves to the partition
that owns the most of its in-neighbours, if that count is strictly larger
than for its current partition and the target holds fewer than
``floor(beta * |V| / p)`` owned nodes (moves out of an overfull partition are
always allowed, so the pass can only improve balance). Owners change during
the pass and later nodes see the new owners (label propagation with a
capacity, as in restreaming partitioners such as ReLDG and 2PS-L's scoring
phase). Nodes without in-edges stay where they are.

This is *not* part of SDT-GNN's Algorithm 1; it is a separate, cheap stage
that applies to every algorithm the same way (``refine_passes`` of
:func:`ooc.partition.partition`). Placing a node with most of its
in-neighbours means those neighbours need no replica in its partition, which
is what the replication factor counts: one pass lowers every partitioner's
replication factor (``python -m bench partition``; ``docs/benchmarks.md``).

Memory: ``O(p)`` counters plus the ``owner`` array and one chunk of edges.
Time: one sequential pass over the edges per refinement pass.
"""
from __future__ import annotations

import time

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.partition._kernels import refine_chunk
from ooc.partition.base import progress_bar
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.storage import Dataset


def refine(dataset: Dataset, owner: np.ndarray, parts: int, *, passes: int = 1,
           beta: float = 1.05, chunk_edges: int = DEFAULT_CHUNK_EDGES,
           progress: bool = False) -> dict:
    """Refine ``owner`` (int32 [N], modified in place) with ``passes`` streaming passes.

    Returns ``{"moved": [moves per pass], "time_s": seconds}``.
    """
    if int(passes) != passes or passes < 0:
        raise InvalidValue(f"refine passes must be an integer >= 0, got {passes!r}")
    t0 = time.perf_counter()
    n = dataset.num_nodes
    if owner.dtype != np.int32 or owner.shape != (n,):
        raise InvalidValue(f"owner must be int32 [{n}], got {owner.dtype} {owner.shape}")
    load = np.bincount(owner, minlength=parts).astype(np.int64)
    cap = int(np.floor(beta * n / parts))
    cnt = np.zeros(parts, dtype=np.int64)
    touched = np.zeros(parts, dtype=np.int32)
    nt = np.zeros(1, dtype=np.int64)
    moved_per_pass = []
    stream = EdgeStream(dataset, chunk_edges=chunk_edges, shuffle=False)
    with progress_bar(dataset.num_edges * int(passes), "refine", progress) as bar:
        for _ in range(int(passes)):
            moved = np.zeros(1, dtype=np.int64)
            for ch in stream:
                refine_chunk(stream.indptr, ch.a, ch.first_dst, ch.src, owner, load, cap, cnt,
                             touched, nt, moved)
                bar.update(ch.b - ch.a)
            moved_per_pass.append(int(moved[0]))
            if moved[0] == 0:
                break
    return {"moved": moved_per_pass, "time_s": time.perf_counter() - t0}
