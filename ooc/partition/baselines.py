"""Streaming edge partitioners (vertex-cut) made usable for GNN training.

The baselines assign *edges* to partitions in one pass over the edge stream
(:mod:`ooc.partition.edges`, chunk order shuffled with the seed by default):

* ``hash``: an edge goes to ``hash(src, dst) mod p`` (PowerGraph "random").
* ``dbh``: degree-based hashing (Xie et al. 2014): hash of the endpoint with
  the lower total degree (ties: the destination).
* ``greedy``: PowerGraph's oblivious greedy (Gonzalez et al. 2012): the
  least loaded partition among ``A(u) ∩ A(v)``; else, when both are
  non-empty, among the replica set of the endpoint with more unassigned
  edges (ties: the destination); else among the non-empty one; else the
  least loaded overall. ``A(v)`` is the set of partitions holding an edge
  of ``v``; loads count edges; ties go to the lowest partition index.
* ``hdrf``: High-Degree Replicated First (Petroni et al. 2015) with partial
  degrees counted in the stream, ``lambda = 1``, ``epsilon = 1``; ties go to
  the lowest partition index.

Ownership (what makes them usable for GNN training, as SDT-GNN does): each
node is *owned* by exactly one partition (``ownership``):

* ``"majority"`` (default): the partition that received the majority of
  its in-edges (Boyer-Moore majority vote over the stream, O(|V|) memory:
  exact when a strict majority exists, otherwise one of the frequent
  partitions);
* ``"last"``: the partition that received its last in-edge in the stream,
  the rule of SDT-GNN's public code (kept to compare with the paper's
  figures; it places nodes worse).

Either way a node without in-edges goes to the majority partition of its
out-edges and an isolated node to ``hash(v) mod p``. The replication pass
then puts every owned node's full in-neighbour list in its partition,
exactly as for SPRING; the edge assignment itself is dropped (SDT-GNN's
code keeps it as well, which adds its vertex-cut replicas). Its replica
sets are returned as ``Assignment.vertex_cut`` and its replication factor
as ``info["vertex_cut_rf"]``.

Memory: ``O(|V| * ceil(p / 64))`` words for the replica bitmaps plus
``O(|V|)`` for degrees and votes plus one chunk of edges.
"""
from __future__ import annotations

import time

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.partition._baseline_kernels import DBH, GREEDY, HASH, HDRF, edge_chunk
from ooc.partition._kernels import finish_owner, popcount_total
from ooc.partition.base import Assignment, progress_bar
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.storage import Dataset

_CODES = {"hash": HASH, "dbh": DBH, "greedy": GREEDY, "hdrf": HDRF}


def edge_partition(dataset: Dataset, parts: int, algo: str, *, seed: int = 0,
                   shuffle: bool = True, chunk_edges: int = DEFAULT_CHUNK_EDGES,
                   lam: float = 1.0, eps: float = 1.0, ownership: str = "majority",
                   progress: bool = False) -> Assignment:
    """Run the edge partitioner ``algo`` and derive node ownership (see above)."""
    if algo not in _CODES:
        raise InvalidValue(f"unknown edge partitioner {algo!r}")
    if ownership not in ("majority", "last"):
        raise InvalidValue(f"ownership must be 'majority' or 'last', got {ownership!r}")
    code = _CODES[algo]
    t0 = time.perf_counter()
    n, e = dataset.num_nodes, dataset.num_edges
    stream = EdgeStream(dataset, chunk_edges=chunk_edges, shuffle=shuffle, seed=seed)
    if code in (DBH, GREEDY):
        with progress_bar(e, f"{algo}: degrees", progress) as bar:
            deg = stream.degrees(bar)
    else:
        deg = np.zeros(n, dtype=np.int64)  # HDRF counts partial degrees here
    rem = deg.copy() if code == GREEDY else np.zeros(1, dtype=np.int64)
    words = -(-parts // 64)
    bits = np.zeros((n, words), dtype=np.uint64)
    load = np.zeros(parts, dtype=np.int64)
    cand_in = np.full(n, -1, dtype=np.int32)
    cnt_in = np.zeros(n, dtype=np.int32)
    cand_out = np.full(n, -1, dtype=np.int32)
    cnt_out = np.zeros(n, dtype=np.int32)
    last = np.full(n if ownership == "last" else 0, -1, dtype=np.int32)
    with progress_bar(e, f"{algo}: edges", progress) as bar:
        for ch in stream:
            edge_chunk(code, stream.indptr, ch.a, ch.first_dst, ch.src, parts, seed, deg, rem,
                       bits, load, cand_in, cnt_in, cand_out, cnt_out, float(lam), float(eps),
                       last)
            bar.update(ch.b - ch.a)
    owner = finish_owner(last if ownership == "last" else cand_in, cand_out, seed, parts)
    covered = int(np.count_nonzero(bits.any(axis=1)))
    vc_rf = popcount_total(bits) / covered if covered else 1.0
    params = dict(seed=seed, shuffle=shuffle, chunk_edges=chunk_edges, ownership=ownership)
    if code == HDRF:
        params.update(lam=lam, eps=eps)
    return Assignment(owner=owner, algo=algo, time_s=time.perf_counter() - t0, params=params,
                      info=dict(vertex_cut_rf=float(vc_rf),
                                edge_loads=[int(x) for x in load]),
                      vertex_cut=bits)
