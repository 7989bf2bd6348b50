"""The graph layer-wise inference walks: CSC adjacency, processing order, GCN weights,
and the local graph of one block of targets."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...storage.dataset import Dataset
from ._kernels import build_local, nonloop_in_degree


@dataclass
class Topology:
    """What every layer reads of the graph.

    Attributes:
        indptr: int64 [N+1], CSC (in-neighbours of v are
            ``indices[indptr[v]:indptr[v+1]]``).
        indices: int32/int64 [E].
        perm: int64 [N], row -> node (the processing order).
        rowof: int64 [N], node -> row (``perm``'s inverse; the same object as
            ``perm`` in node id order).
        dinv: float32 [N] ``deg**-0.5`` with deg = in-degree without self loops
            + 1, for GCN weights; None for other models.
        scratch: int64 [N] of -1, the kernels' node -> local id map.
    """
    indptr: np.ndarray
    indices: np.ndarray
    perm: np.ndarray
    rowof: np.ndarray
    dinv: np.ndarray | None
    scratch: np.ndarray

    @classmethod
    def of(cls, dataset: Dataset, perm: np.ndarray, rowof: np.ndarray, gcn: bool) -> "Topology":
        indices = np.asarray(dataset.indices)
        dinv = None
        if gcn:
            deg = nonloop_in_degree(dataset.indptr, indices) + 1
            dinv = deg.astype(np.float32) ** -0.5
        return cls(dataset.indptr, indices, perm, rowof, dinv,
                   np.full(dataset.num_nodes, -1, dtype=np.int64))

    @property
    def num_nodes(self) -> int:
        return int(self.perm.shape[0])

    @property
    def natural(self) -> bool:
        """Rows are in node id order."""
        return self.perm is self.rowof


@dataclass
class LocalGraph:
    """The local graph of targets ``perm[s:e]``.

    ``nodes`` int64 [n_local] global ids (targets first, in row order, then
    their in-neighbours); ``src``/``dst`` int64 [m] local ids, neighbour ->
    target; ``weight`` float32 [m] full-graph GCN weights (self loops of the
    targets appended to ``src``/``dst``) or None.
    """
    nodes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray | None
    num_targets: int


def local_graph(topo: Topology, s: int, e: int) -> LocalGraph:
    """The local graph of rows ``s..e`` (GCN: self loops dropped, one per target
    added, weights ``dinv[src] * dinv[dst]`` as ``gcn_norm`` gives on the full graph)."""
    gcn = topo.dinv is not None
    nodes, src, dst = build_local(topo.indptr, topo.indices, topo.perm, s, e, topo.scratch, gcn)
    nt = e - s
    w = None
    if topo.dinv is not None:  # gcn
        loops = np.arange(nt, dtype=np.int64)
        dl = topo.dinv[nodes]
        w = np.concatenate([dl[src] * dl[dst], dl[:nt] * dl[:nt]])
        src = np.concatenate([src, loops])
        dst = np.concatenate([dst, loops])
    return LocalGraph(nodes, src, dst, w, nt)
