"""Quality of a node partitioning under full in-neighbour replication.

Partition ``i`` holds ``V_i = owned_i ∪ replicas_i`` where ``replicas_i`` are
the in-neighbours of ``owned_i`` owned by another partition, and
``E_i`` = every in-edge of every owned node (each stored edge lands in
exactly one partition: the owner of its destination).

* ``replication_factor`` = ``Σ_i |V_i| / |V|`` (replicas counted; 1.0 means
  no replica).
* ``node_balance`` = ``max_i |owned_i| / (|V| / p)`` (1.0 is perfect).
* ``node_balance_with_replicas`` = ``max_i |V_i| / mean_i |V_i|``.
* ``edge_balance`` = ``max_i |E_i| / (|E| / p)``.
* ``edge_cut`` = edges whose endpoints have different owners (each such edge
  creates the replica of its source in its destination's partition);
  ``edge_cut_ratio`` = ``edge_cut / |E|``.
"""
from __future__ import annotations

import time

import numpy as np

from ooc.partition._kernels import replica_chunk, replica_counts
from ooc.partition.base import progress_bar
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.storage import Dataset


def replica_bits(dataset: Dataset, owner: np.ndarray, parts: int,
                 chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: bool = False):
    """One pass: replica bitmap (uint64 [N, ceil(p/64)]), edge cut, edges per partition."""
    n, e = dataset.num_nodes, dataset.num_edges
    bits = np.zeros((n, -(-parts // 64)), dtype=np.uint64)
    cut = np.zeros(1, dtype=np.int64)
    edges_local = np.zeros(parts, dtype=np.int64)
    stream = EdgeStream(dataset, chunk_edges=chunk_edges)
    with progress_bar(e, "replication", progress) as bar:
        for ch in stream:
            replica_chunk(stream.indptr, ch.a, ch.first_dst, ch.src, owner, bits, cut,
                          edges_local)
            bar.update(ch.b - ch.a)
    return bits, int(cut[0]), edges_local


def compute_metrics(dataset: Dataset, owner: np.ndarray, parts: int,
                    chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: bool = False,
                    return_bits: bool = False):
    """Metrics of ``owner`` (see the module docstring) as a JSON-able dict.

    With ``return_bits`` also returns the replica bitmap (for the split).
    """
    t0 = time.perf_counter()
    n, e = dataset.num_nodes, dataset.num_edges
    owner = np.ascontiguousarray(owner, dtype=np.int32)
    bits, cut, edges_local = replica_bits(dataset, owner, parts, chunk_edges, progress)
    owned = np.bincount(owner, minlength=parts).astype(np.int64)
    replicas = replica_counts(bits, parts)
    nodes = owned + replicas
    m = {
        "num_nodes": n,
        "num_edges": e,
        "parts": parts,
        "replication_factor": float(nodes.sum() / n) if n else 1.0,
        "node_balance": float(owned.max() / (n / parts)) if n else 1.0,
        "node_balance_with_replicas": float(nodes.max() / nodes.mean()) if n else 1.0,
        "edge_balance": float(edges_local.max() / (e / parts)) if e else 1.0,
        "edge_cut": cut,
        "edge_cut_ratio": float(cut / e) if e else 0.0,
        "partitions": [
            {"part": i, "owned": int(owned[i]), "replicas": int(replicas[i]),
             "nodes": int(nodes[i]), "edges": int(edges_local[i])}
            for i in range(parts)
        ],
        "metrics_time_s": time.perf_counter() - t0,
    }
    return (m, bits) if return_bits else m
