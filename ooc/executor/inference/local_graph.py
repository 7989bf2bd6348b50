"""The graph layer-wise inference walks: CSC adjacency, processing order, GCN weights,
and the local graph of one block of targets."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ooc.executor.inference._kernels import build_local, nonloop_in_degree, plan_blocks
from ooc.storage.dataset import Dataset
from ooc.storage.pagecache import release_mapped


@dataclass
class Topology:
    """What every layer reads of the graph.

    Attributes:
        indptr: int64 [N+1], CSC (in-neighbours of v are
            ``indices[indptr[v]:indptr[v+1]]``).
        indices: int32/int64 [E].
        perm: [N] row -> node (the processing order), int32 below 2^31 nodes
            (:func:`~ooc.storage.layout.index_dtype`), else int64.
        rowof: [N] node -> row (``perm``'s inverse; the same object as ``perm`` in node
            id order), ``perm``'s dtype.
        dinv: float32 [N] ``deg**-0.5`` with deg = in-degree without self loops
            + 1, for GCN weights; None for other models.

    ``rowof`` may be a read-only memmap (a dataset's own row map where the processing
    order is the order its feature rows are stored in): a pass maps its pages and
    :meth:`release_pages` drops them again, so it holds no memory between passes.
    """
    indptr: np.ndarray
    indices: np.ndarray
    perm: np.ndarray
    rowof: np.ndarray
    dinv: np.ndarray | None
    _scratch: np.ndarray | None = None

    @classmethod
    def of(cls, dataset: Dataset, perm: np.ndarray, rowof: np.ndarray, gcn: bool) -> "Topology":
        indices = np.asarray(dataset.indices)
        dinv = None
        if gcn:
            deg = nonloop_in_degree(dataset.indptr, indices) + 1
            dinv = deg.astype(np.float32) ** -0.5
        return cls(dataset.indptr, indices, perm, rowof, dinv)

    @property
    def num_nodes(self) -> int:
        return int(self.perm.shape[0])

    @property
    def scratch(self) -> np.ndarray:
        """[N] of -1, the block kernels' node -> local id map (``perm``'s dtype), made on
        first use (:meth:`make_scratch`): only layers run in blocks hold it."""
        return self.make_scratch()

    def make_scratch(self) -> np.ndarray:
        """:attr:`scratch`, made now if it is not there (before a plan measures the memory
        the blocks have)."""
        if self._scratch is None:
            self._scratch = np.full(self.num_nodes, -1, dtype=self.perm.dtype)
        return self._scratch

    def drop_scratch(self) -> None:
        """Let go of :attr:`scratch` (a layer that streams needs none)."""
        self._scratch = None

    def release_pages(self) -> None:
        """Drop the pages of ``indices.bin``, ``indptr.npy`` and a mapped ``rowof`` a pass
        mapped from this process's RSS (the page cache keeps them): walked block after
        block, chunk after chunk or group after group they would hold the whole files, 4-8
        B an edge and 8-12 B a node."""
        release_mapped(self.indices)
        release_mapped(self.indptr)
        release_mapped(self.rowof)

    @property
    def natural(self) -> bool:
        """Rows are in node id order."""
        return self.perm is self.rowof


@dataclass
class LocalGraph:
    """The local graph of targets ``perm[s:e]`` (a block).

    ``nodes`` int64 [n_local] global ids (targets first, in row order, then
    their in-neighbours); ``src`` int64 [m] the local source of every in-edge,
    target by target: target ``t``'s are ``src[eptr[t]:eptr[t+1]]`` (``eptr`` int64
    [num_targets + 1]). GCN: ``weight`` float32 [m] full-graph weights of the edges
    (self loops dropped) and ``loop_weight`` float32 [num_targets] of each target's
    self loop; both None for other models.
    """
    nodes: np.ndarray
    src: np.ndarray
    eptr: np.ndarray
    weight: np.ndarray | None
    loop_weight: np.ndarray | None
    num_targets: int

    def sub_blocks(self, target_bytes: int, node_bytes: int, edge_bytes: int,
                   work_bytes: int) -> np.ndarray:
        """Starts of sub-blocks of consecutive targets whose own local graphs cost at
        most ``work_bytes`` each (see :func:`._kernels.plan_blocks`), then
        ``num_targets``."""
        nt = self.num_targets
        return plan_blocks(self.eptr, self.src, np.arange(nt, dtype=np.int64), max(nt, 1),
                           np.array([[target_bytes, node_bytes, edge_bytes]], dtype=np.int64),
                           np.array([work_bytes], dtype=np.int64),
                           np.full(self.nodes.shape[0], -1, dtype=np.int64))

    def sub(self, a: int, z: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Targets ``a..z`` as a graph of their own: ``(nodes, edge_index, weight)`` with
        ``nodes`` int64 [n] the block-local id of each of its nodes (targets first, then
        in-neighbours in order of first appearance), ``edge_index`` int64 [2, m] its
        edges (row 0 source, row 1 target, targets non-decreasing) and, GCN, ``weight``
        float32 [m] with one self loop per target after its edges (else None)."""
        ident = np.arange(self.num_targets, dtype=np.int64)
        scratch = np.full(self.nodes.shape[0], -1, dtype=np.int64)
        nodes, src, eptr = build_local(self.eptr, self.src, ident, a, z, scratch, False)
        dst = np.repeat(np.arange(z - a, dtype=np.int64), np.diff(eptr))
        ei = np.stack([src, dst])
        if self.weight is None:
            return nodes, ei, None
        import torch

        from ooc.executor.training.models import with_self_loops

        assert self.loop_weight is not None  # GCN: both weights
        lei, w = with_self_loops(torch.from_numpy(ei), z - a,
                                 torch.from_numpy(self.weight[self.eptr[a]:self.eptr[z]]),
                                 torch.from_numpy(self.loop_weight[a:z]))
        return nodes, lei.numpy(), w.numpy()


def local_graph(topo: Topology, s: int, e: int) -> LocalGraph:
    """The local graph of rows ``s..e`` (GCN: self loops dropped, edges weighted
    ``dinv[src] * dinv[dst]`` and each target's own loop ``dinv[t]**2``, as ``gcn_norm``
    gives on the full graph)."""
    gcn = topo.dinv is not None
    nodes, src, eptr = build_local(topo.indptr, topo.indices, topo.perm, s, e, topo.scratch,
                                   gcn)
    nt = e - s
    w = lw = None
    if topo.dinv is not None:  # gcn
        dl = topo.dinv[nodes]
        w = dl[src] * np.repeat(dl[:nt], np.diff(eptr))
        lw = dl[:nt] * dl[:nt]
    return LocalGraph(nodes, src, eptr, w, lw, nt)
