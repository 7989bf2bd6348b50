"""GNN models built from PyG layers: GraphSAGE, GCN and GAT.

Every model is a :class:`GNN` with one protocol that the training loop and
the layer-wise inference code both rely on:

* ``forward(x, edge_index, num_sampled_nodes_per_hop=None,
  num_sampled_edges_per_hop=None)`` runs all layers on a full graph, or on a
  sampled batch in PyG NeighborLoader layout (nodes and edges ordered by hop),
  in which case each layer reads only the hops it needs and computes rows only for
  the hops the next layer reads (the last layer: the seeds). The first
  ``batch_size`` rows are the seeds' outputs.
* ``layer(l, x, edge_index, edge_weight=None)`` runs layer ``l`` alone on a
  local graph; ``forward`` is exactly ``layer(0) .. layer(L-1)`` in sequence.

GCN convolutions are built with ``normalize=False``: :meth:`GNN.layer`
normalises (``gcn_norm`` with self loops, on the graph it is given) unless the
caller passes final ``edge_weight`` values, which are then used as they are
(the edge_index must already contain the self loops). Layer-wise inference
uses that to apply full-graph degrees.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import spmm

from ooc.core.errors import InvalidValue
from ooc.executor.training.activation import elu_dropout, relu_dropout

MODEL_KINDS = ("sage", "gcn", "gat")


class GNN(torch.nn.Module):
    """A stack of ``num_layers`` PyG convolutions of one ``kind``.

    Attributes:
        kind: ``"sage"``, ``"gcn"`` or ``"gat"``.
        num_layers: number of convolutions.
        convs: the convolutions, ``convs[l]`` is layer ``l``.
        config: the construction arguments (saved in checkpoints;
            ``build_model(**config)`` rebuilds the same architecture).
        dims: the input width of every layer followed by the output width,
            ``len(dims) == num_layers + 1``.
    """

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5, heads: int = 4):
        super().__init__()
        if kind not in MODEL_KINDS:
            raise InvalidValue(f"unknown model {kind!r} (choose one of {', '.join(MODEL_KINDS)})")
        if num_layers < 1:
            raise InvalidValue(f"a model needs at least one layer, got num_layers={num_layers}")
        if min(in_dim, hidden, out_dim) < 1:
            raise InvalidValue(f"bad model sizes: in_dim={in_dim}, hidden={hidden}, out_dim={out_dim}")
        if not 0.0 <= dropout < 1.0:
            raise InvalidValue(f"dropout must be in [0, 1), got {dropout}")
        if heads < 1:
            raise InvalidValue(f"heads must be >= 1, got {heads}")
        self.kind = kind
        self.num_layers = int(num_layers)
        self.dropout = float(dropout)
        self.config: dict[str, Any] = dict(kind=kind, in_dim=int(in_dim), hidden=int(hidden),
                                           out_dim=int(out_dim), num_layers=int(num_layers),
                                           dropout=float(dropout), heads=int(heads))
        self.convs = torch.nn.ModuleList()
        dims = [int(in_dim)]
        for layer in range(num_layers):
            last = layer == num_layers - 1
            d_in = dims[-1]
            if kind == "sage":
                d_out = out_dim if last else hidden
                conv = SAGEConv(d_in, d_out)
            elif kind == "gcn":
                d_out = out_dim if last else hidden
                conv = GCNConv(d_in, d_out, normalize=False, cached=False, add_self_loops=False)
            else:  # gat: heads concatenated in hidden layers, one head in the last
                if last:
                    conv = GATConv(d_in, out_dim, heads=1, concat=False)
                    d_out = out_dim
                else:
                    per_head = max(1, hidden // heads)
                    conv = GATConv(d_in, per_head, heads=heads, concat=True)
                    d_out = per_head * heads
            self.convs.append(conv)
            dims.append(d_out)
        self.dims = dims

    def extra_repr(self) -> str:
        return f"kind={self.kind}, dims={self.dims}, dropout={self.dropout}"

    def layer(self, l: int, x: Tensor, edge_index: Tensor,
              edge_weight: Tensor | None = None, num_targets: int | None = None) -> Tensor:
        """Layer ``l`` on a local graph: conv, activation and dropout (training only).

        Args:
            l: layer number, ``0 <= l < num_layers``.
            x: [n_local, d_in] input rows of every local node.
            edge_index: int64 [2, m], local ids, row 0 = source (neighbour),
                row 1 = target.
            edge_weight: GCN only. ``None``: normalise as GCNConv does
                (``gcn_norm`` with self loops, on this graph). Given: final
                normalised weights for ``edge_index``, which must already
                contain the self loops; used as they are. Ignored by SAGE and
                GAT.
            num_targets: return only the first ``num_targets`` rows (every edge's
                target must be below it); SAGE and GAT compute only those (the
                layer runs bipartite: sources ``x``, targets ``x[:num_targets]``).

        Returns:
            [n_local, d_out] (or [num_targets, d_out]); no activation after the
            last layer. Callers keep the rows they need.
        """
        conv = self.convs[l]
        if self.kind == "gcn":
            if edge_weight is None:
                edge_index, edge_weight = gcn_norm(edge_index, None, num_nodes=x.size(0),
                                                   add_self_loops=True, dtype=x.dtype)
            adj = None if num_targets is None else \
                target_csr(edge_index, x.size(0), num_targets, x.dtype, edge_weight)
            h = gcn_conv(conv, x, adj) if adj is not None else \
                conv(x, edge_index, edge_weight)[:num_targets]
        elif num_targets is not None and num_targets < x.size(0):
            pair, size = sources_and_targets(x, num_targets), (x.size(0), num_targets)
            if self.kind == "sage":  # PyG's sparse path: one spmm, no [E, d] message tensor
                adj = target_csr(edge_index, x.size(0), num_targets, x.dtype)
                h = sage_conv(conv, pair, edge_index, size) if adj is None else \
                    sage_conv(conv, pair, adj)
            else:
                h = conv(pair, edge_index, size=size)
        elif self.kind == "sage":
            h = sage_conv(conv, (x, x), edge_index)
        else:
            h = conv(x, edge_index)
        if l < self.num_layers - 1:
            if self.kind == "gat":
                h = elu_dropout(h, self.dropout, self.training)
            else:
                h = relu_dropout(h, self.dropout, self.training)
        return h

    def forward(self, x: Tensor, edge_index: Tensor,
                num_sampled_nodes_per_hop: list[int] | None = None,
                num_sampled_edges_per_hop: list[int] | None = None) -> Tensor:
        """All layers on a full graph or a sampled batch.

        With the per-hop counts of a sampled batch (NeighborLoader layout),
        layer ``l`` reads the first ``L - l + 1`` hops and their edges only and
        computes rows for the first ``L - l`` hops, the ones the next layer
        reads (bipartite; SAGE and GCN aggregate through a CSR adjacency and
        PyG's ``spmm``). The output then holds only the seeds' rows, equal to
        those of the untrimmed pass (GCN keeps the degrees of the whole sampled
        graph for that).
        """
        if num_sampled_nodes_per_hop is None or num_sampled_edges_per_hop is None:  # no trimming
            for l in range(self.num_layers):
                x = self.layer(l, x, edge_index)
            return x
        nodes = [int(v) for v in num_sampled_nodes_per_hop]
        edges = [int(v) for v in num_sampled_edges_per_hop]
        dinv = None
        if self.kind == "gcn":
            # Degrees of the whole sampled graph (+1 self loop), as the untrimmed
            # forward pass would use them: trimming then changes nothing for the seeds.
            deg = torch.ones(x.size(0), dtype=x.dtype, device=x.device)
            deg.scatter_add_(0, edge_index[1], torch.ones(edge_index.size(1), dtype=x.dtype,
                                                          device=x.device))
            dinv = deg.pow(-0.5)
        return self._forward_bipartite(x, edge_index, nodes, edges, dinv)

    def _forward_bipartite(self, x: Tensor, edge_index: Tensor, nodes: list[int],
                           edges: list[int], dinv: Tensor | None = None) -> Tensor:
        """Layer ``l`` reads hops ``0 .. L - l`` and the edges into hops ``0 .. L - l - 1``
        (edges are ordered by hop, so that is a prefix) and writes rows for hops
        ``0 .. L - l - 1`` only. GCN (``dinv``: [n] inverse square roots of the sampled
        graph's degrees plus one) weighs each edge ``dinv[src] * dinv[dst]`` and adds each
        target's self loop, weighed ``dinv[t]^2``."""
        L = self.num_layers
        hops = len(nodes)
        for l in range(L):
            keep = max(1, min(hops, L - l + 1))
            n_src = sum(nodes[:keep])
            n_dst = sum(nodes[:keep - 1]) if keep > 1 else nodes[0]
            m = sum(edges[:keep - 1])
            ei, w = edge_index[:, :m], None
            if dinv is not None:
                ei, w = with_self_loops(ei, n_dst, dinv[ei[0]] * dinv[ei[1]],
                                        dinv[:n_dst] * dinv[:n_dst])
            # a slice of every row would still cost its backward pass a zero-filled copy
            x = self.layer(l, x if n_src == x.size(0) else x[:n_src], ei, w, num_targets=n_dst)
        return x


def sage_conv(conv: SAGEConv, x: tuple[Tensor, Tensor], graph: Tensor,
              size: tuple[int, int] | None = None) -> Tensor:
    """``conv(x, graph, size)`` for a SAGEConv as :class:`GNN` builds it (mean
    aggregation, root weight, no projection or normalisation), its root term fused into
    a GEMM: ``addmm(lin_l(mean), x_dst, W_r^T)``. Stock ``lin_l(mean) + lin_r(x_dst)``
    writes and reads one more [n_dst, d_out] tensor.

    Args:
        x: ([n_src, d_in] sources, [n_dst, d_in] targets).
        graph: a CSR adjacency [n_dst, n_src] (:func:`target_csr`) or an int64
            ``edge_index`` [2, m].

    Returns:
        [n_dst, d_out], ``x``'s dtype.
    """
    mean = conv.propagate(graph, x=x, size=size)
    return torch.addmm(conv.lin_l(mean), x[1], conv.lin_r.weight.t())


def aggregates_first(n_src: int, n_dst: int, nnz: int, d_in: int, d_out: int) -> bool:
    """Whether :func:`gcn_conv` aggregates before its linear map: ``(A x) W^T`` costs
    ``nnz d_in + n_dst d_in d_out`` multiply-adds, ``A (x W^T)`` ``n_src d_in d_out +
    nnz d_out``."""
    return nnz * d_in + n_dst * d_in * d_out < n_src * d_in * d_out + nnz * d_out


def gcn_conv(conv: GCNConv, x: Tensor, adj: Tensor) -> Tensor:
    """``conv(x, adj)`` for a GCNConv as :class:`GNN` builds it (``normalize=False``: the
    weights are ``adj``'s values) with its two products in the cheaper order. Stock
    GCNConv transforms every source row, then aggregates: ``A (x W^T)``; aggregating the
    ``d_in``-wide rows first, ``(A x) W^T``, is the same map and, where
    :func:`aggregates_first` says so, fewer FLOPs (layer 0 of papers100M's recipe: ~330k
    sources, ~88k targets, 128 -> 256: 3.7x fewer).

    Args:
        x: [n_src, d_in] source rows.
        adj: CSR [n_dst, n_src] with the normalised edge weights (:func:`target_csr`).

    Returns:
        [n_dst, d_out], ``x``'s dtype.
    """
    n_dst, n_src = adj.shape
    d_out, d_in = conv.lin.weight.shape
    if not aggregates_first(n_src, n_dst, adj._nnz(), d_in, d_out):
        return conv(x, adj)
    summed = spmm(adj, x, reduce="sum")
    w = conv.lin.weight.t()
    return summed @ w if conv.bias is None else torch.addmm(conv.bias, summed, w)


class _SourcesAndTargets(torch.autograd.Function):
    """``(x, x[:n])`` as one autograd node. Its backward adds the targets' gradient into
    the first ``n`` rows of the sources' gradient in place; autograd would give ``x[:n]``
    the gradient of a slice, a zero-filled copy of all of ``x`` added to the sources'
    one (at papers100M's recipe layer 1 reads ~88k rows of 256 for ~12k targets)."""

    @staticmethod
    def forward(ctx, x: Tensor, n: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        ctx.n, ctx.shape = n, x.shape
        return x.view_as(x), x[:n]

    @staticmethod
    def backward(ctx, g_src: Tensor | None, g_dst: Tensor | None  # type: ignore[override]
                 ) -> tuple[Tensor | None, None]:
        if g_dst is None:
            return g_src, None
        if g_src is None:
            g_src = g_dst.new_zeros(ctx.shape)
        g = g_src if g_src.is_contiguous() else g_src.contiguous()
        g[:ctx.n] += g_dst
        return g, None


def sources_and_targets(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(x, x[:n])`` for a bipartite layer (sources: every row of ``x``, targets: its
    first ``n`` rows) whose backward pass costs the targets' rows rather than all of
    ``x``'s; the plain pair when ``x`` needs no gradient.

    The sources' gradient it receives must be the layer's own (PyG's spmm or message
    passing backward: a fresh tensor); the targets' gradient is added into it in place.
    """
    if not x.requires_grad:
        return x, x[:n]
    return _SourcesAndTargets.apply(x, n)


def target_csr(edge_index: Tensor, num_src: int, num_dst: int, dtype: torch.dtype,
               values: Tensor | None = None) -> Tensor | None:
    """The bipartite adjacency ``[num_dst, num_src]`` (row = target; ``values`` [m], else
    ones) as a CSR ``torch.sparse`` tensor, for PyG's ``spmm`` path, when
    ``edge_index``'s targets (row 1) are non-decreasing and below ``num_dst``, as every
    sampled batch's are (hop after hop, each node's neighbours together); None
    otherwise (the caller scatters)."""
    dst = edge_index[1]
    if dst.numel() and bool((dst[-1] >= num_dst) | (dst[1:] < dst[:-1]).any()):
        return None  # one device sync for both checks
    crow = torch.zeros(num_dst + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=crow[1:])
    vals = values.to(dtype) if values is not None else \
        torch.ones(dst.numel(), dtype=dtype, device=dst.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, edge_index[0], vals, size=(num_dst, num_src))


def with_self_loops(edge_index: Tensor, num_dst: int, weight: Tensor, loop_weight: Tensor
                    ) -> tuple[Tensor, Tensor]:
    """``edge_index`` (int64 [2, m], targets non-decreasing and below ``num_dst``) and
    its ``weight`` [m] with a self loop ``(t, t)`` of weight ``loop_weight[t]`` after
    each target ``t``'s edges, so the targets stay sorted: ([2, m + num_dst],
    [m + num_dst]). Targets out of that order get their loops appended instead."""
    dst = edge_index[1]
    m, dev = dst.numel(), dst.device
    loops = torch.arange(num_dst, device=dev)
    if m and bool((dst[-1] >= num_dst) | (dst[1:] < dst[:-1]).any()):
        return (torch.cat([edge_index, torch.stack([loops, loops])], dim=1),
                torch.cat([weight, loop_weight]))
    ends = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
    at_edge = torch.arange(m, device=dev) + dst      # t loops precede target t's edges
    at_loop = ends + loops                          # after target t's edges
    ei = torch.empty(2, m + num_dst, dtype=edge_index.dtype, device=dev)
    w = torch.empty(m + num_dst, dtype=weight.dtype, device=dev)
    ei[:, at_edge], w[at_edge] = edge_index, weight
    ei[0, at_loop], ei[1, at_loop], w[at_loop] = loops, loops, loop_weight
    return ei, w


def build_model(kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                dropout: float = 0.5, heads: int = 4) -> GNN:
    """A :class:`GNN` of ``num_layers`` PyG convolutions (``kind`` in ``sage``, ``gcn``,
    ``gat``) from ``in_dim`` through ``hidden`` to ``out_dim`` channels, ReLU (GAT: ELU)
    and ``dropout`` between them (GAT: ``heads`` attention heads in the hidden layers).

    It takes the call stock PyG models take on a sampled batch, ``model(data.x,
    data.edge_index, num_sampled_nodes_per_hop=..., num_sampled_edges_per_hop=...)``,
    and computes only the rows the next layer reads (SAGE and GCN through a CSR
    ``spmm``); its first ``data.batch_size`` rows are the seeds' outputs [batch_size,
    out_dim].
    """
    return GNN(kind, in_dim, hidden, out_dim, num_layers, dropout=dropout, heads=heads)
