"""The models layer-wise inference runs: one layer at a time on a local graph.

:func:`as_layerwise` turns a model into a :class:`LayerwiseModel`:

* a model with ``num_layers`` and ``layer(l, x, edge_index, edge_weight=None)``
  (ooc's :class:`~ooc.executor.training.models.GNN`, or a user's own module
  following the protocol in :mod:`ooc.executor.inference.layerwise`) is used
  as it is; ``kind == "gcn"`` or ``gcn_norm = True`` asks for full-graph GCN
  weights;
* a stock PyG :class:`torch_geometric.nn.models.basic_gnn.BasicGNN`
  (``GraphSAGE``, ``GCN``, ``GAT``, ``GIN``, ``EdgeCNN``, ``PNA``) is run from its
  parts: ``convs[l]``, then for all but the last layer the norm and the
  activation in the order ``act_first`` says (dropout is the identity in eval
  mode). What cannot be computed one layer at a time on a node's
  in-neighbourhood is refused with one line: jumping knowledge, norms over the
  whole graph (``InstanceNorm``, ``GraphNorm``, ``LayerNorm(mode="graph")``,
  batch norm without running statistics), and GCN convolutions with
  ``improved=True`` or normalisation without self loops.

GCN: a ``GCNConv`` with ``normalize=True`` is called with ``normalize`` off and
the full-graph weights ``1/sqrt(deg(src) deg(dst))`` (in-degree without self
loops + 1, one self loop per target) that ``gcn_norm`` computes on the whole
graph; the flag is restored after the call.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable, Protocol, cast

import torch
from torch import Tensor

from ooc.core.errors import InvalidValue
from ooc.executor.training.models import GNN

LayerFn = Callable[[int, Tensor, Tensor, "Tensor | None"], Tensor]


class _TargetsLayerFn(Protocol):
    """A ``layer`` that also takes ``num_targets=`` (``LayerwiseModel.targets_only``)."""

    def __call__(self, l: int, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None, *,
                 num_targets: int) -> Tensor: ...


@dataclass
class LayerwiseModel:
    """A model as layer-wise inference sees it.

    Attributes:
        module: the user's module (put in eval mode; its state dict is the
            run's fingerprint).
        num_layers: number of layers.
        layer: ``layer(l, x, edge_index, edge_weight)`` -> [n_local, d_out]
            (x float32 [n_local, d_in], edge_index int64 [2, m] local ids,
            row 0 = source, row 1 = target).
        gcn_norm: the layers take full-graph GCN weights (``edge_weight`` float32
            [m], self loops in ``edge_index``).
        name: the model's name in the report.
        targets_only: ``layer`` takes ``num_targets=`` and computes only those
            first rows (see :meth:`targets`).
        aggregations: per layer, how its convolution reduces the in-neighbours' input
            rows when it is a plain reduction of them (``"mean"``, ``"sum"`` or
            ``"max"`` of the rows as they are, before any weight), else None: such a
            layer can be computed from each target's reduced row alone
            (:mod:`.streamed`).
        in_dim: the input width the model declares (ooc's ``GNN``, a stock ``BasicGNN``
            built with ``in_channels``), None when it declares none (then only running
            layer 0 tells).
    """
    module: torch.nn.Module
    num_layers: int
    layer: LayerFn
    gcn_norm: bool
    name: str
    targets_only: bool = False
    aggregations: tuple[str | None, ...] = ()
    in_dim: int | None = None

    def aggregation(self, l: int) -> str | None:
        """Layer ``l``'s plain reduction of its input rows (see ``aggregations``)."""
        return self.aggregations[l] if l < len(self.aggregations) else None

    def targets(self, l: int, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None,
                num_targets: int) -> Tensor:
        """Layer ``l``'s rows for the first ``num_targets`` local nodes, [num_targets, d_out]
        (every edge's target is below ``num_targets``): computed for those rows only
        where the layer can (SAGE and GAT convolutions run bipartite), else computed for
        every row and cut."""
        if self.targets_only:
            layer = cast(_TargetsLayerFn, self.layer)  # what targets_only says of it
            return layer(l, x, edge_index, edge_weight, num_targets=num_targets)
        return self.layer(l, x, edge_index, edge_weight)[:num_targets]

    def digest(self) -> str:
        """A digest of the state dict (weights and buffers)."""
        h = hashlib.sha256()
        for k, v in self.module.state_dict().items():
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:24]

    def out_dim(self, l: int, d_in: int) -> int:
        """Width of layer ``l``'s output, found by running it on one node of ``d_in``
        values; a layer that cannot take rows of that width is one :class:`InvalidValue`
        (with torch's reason)."""
        x = torch.zeros(1, d_in)
        try:
            if self.gcn_norm:
                h = self.layer(l, x, torch.zeros(2, 1, dtype=torch.long), torch.ones(1))
            else:
                h = self.layer(l, x, torch.zeros(2, 0, dtype=torch.long), None)
        except RuntimeError as e:  # torch's shape errors
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InvalidValue(f"{self.name}: layer {l + 1} of the model does not take "
                               f"{d_in}-dim input rows ({reason})") from None
        return int(h.shape[-1])


def as_layerwise(model: torch.nn.Module) -> LayerwiseModel:
    """``model`` as a :class:`LayerwiseModel` (put in eval mode), or a one-line
    :class:`OocError` saying why it cannot be run layer by layer."""
    from torch_geometric.nn.models.basic_gnn import BasicGNN


    if hasattr(model, "layer") and hasattr(model, "num_layers"):
        model.eval()
        gcn = getattr(model, "kind", None) == "gcn" or bool(getattr(model, "gcn_norm", False))
        # the model's own attributes, typed Any: mypy would type ``model.layer`` by
        # nn.Module.__getattr__ (Tensor | Module), which they never go through
        num_layers, layer = getattr(model, "num_layers"), getattr(model, "layer")  # noqa: B009
        convs = getattr(model, "convs", None) if isinstance(model, GNN) else None
        return LayerwiseModel(model, int(num_layers), layer, gcn,
                              str(getattr(model, "kind", type(model).__name__)),
                              targets_only=isinstance(model, GNN),
                              aggregations=_reductions(convs) if convs is not None else (),
                              in_dim=model.dims[0] if isinstance(model, GNN) else None)
    if isinstance(model, BasicGNN):
        return _stock(model)
    if isinstance(model, (str, os.PathLike)):
        raise InvalidValue(f"model: {model} is a path, not a model; ooc.load_model({str(model)!r}) "
                           f"loads the model of an ooc.train checkpoint")
    raise InvalidValue("the model does not follow the layer-wise protocol "
                   "(needs num_layers and layer(l, x, edge_index, edge_weight)) and is not a "
                   "stock PyG BasicGNN (GraphSAGE, GCN, GAT, GIN, EdgeCNN, PNA)")


# ----------------------------------------------------------------------------- stock PyG
def _stock(model) -> LayerwiseModel:
    """A stock PyG ``BasicGNN`` run layer by layer (see the module docstring)."""
    name = type(model).__name__
    if model.jk_mode is not None or hasattr(model, "lin"):
        raise InvalidValue(f"{name}(jk={model.jk_mode!r}): jumping knowledge combines every "
                       "layer's output; layer-wise inference runs one layer at a time")
    for l in range(model.num_layers - 1):
        why = _norm_problem(model.norms[l])
        if why:
            raise InvalidValue(f"{name}: norms[{l}] {why}; layer-wise inference supports "
                           "BatchNorm with running statistics, LayerNorm(mode='node') or none")
    gcn = _gcn_normalises(model)
    model.eval()
    in_dim = int(model.in_channels) if int(model.in_channels) > 0 else None  # -1: lazy
    return LayerwiseModel(model, int(model.num_layers), _StockLayers(model, gcn), gcn, name,
                          targets_only=True, aggregations=_reductions(model.convs),
                          in_dim=in_dim)


#: PyG aggregation names -> the reduction streamed aggregation computes.
_REDUCTIONS = {"mean": "mean", "add": "sum", "sum": "sum", "max": "max"}


def _reductions(convs) -> tuple[str | None, ...]:
    """Per convolution, the plain reduction of the in-neighbours' rows it aggregates
    (a ``SAGEConv`` without ``project``, aggregation ``mean``, ``sum``/``add`` or ``max``,
    whose messages are the rows as they are), else None."""
    from torch_geometric.nn import SAGEConv

    out: list[str | None] = []
    for conv in convs:
        aggr = getattr(conv, "aggr", None)
        ok = type(conv) is SAGEConv and not conv.project and isinstance(aggr, str)
        out.append(_REDUCTIONS.get(str(aggr)) if ok else None)
    return tuple(out)


def _norm_problem(norm: torch.nn.Module) -> str | None:
    """Why ``norm`` is not a per-node map in eval mode (None when it is)."""
    from torch_geometric.nn import norm as pyg_norm

    if isinstance(norm, (torch.nn.Identity, torch.nn.LayerNorm)):
        return None
    if isinstance(norm, pyg_norm.LayerNorm):
        return None if norm.mode == "node" else \
            f"LayerNorm(mode={norm.mode!r}) normalises over the whole graph"
    bn = norm.module if isinstance(norm, pyg_norm.BatchNorm) else norm
    if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
        return None if bn.track_running_stats else \
            "BatchNorm without running statistics normalises over the whole graph"
    return f"{type(norm).__name__} is not known to act on each node alone"


def _gcn_normalises(model) -> bool:
    """Whether the convolutions are GCNConv with the normalisation of ``gcn_norm`` with
    self loops (then they take full-graph weights); refuses the variants it cannot match."""
    from torch_geometric.nn import GCNConv

    convs = [c for c in model.convs if isinstance(c, GCNConv)]
    if not convs:
        return False
    norm = {bool(c.normalize) for c in convs}
    if len(convs) != len(model.convs) or len(norm) != 1:
        raise InvalidValue(f"{type(model).__name__}: GCN convolutions mixed with others or with "
                       "and without normalize; layer-wise inference needs one kind")
    if not norm.pop():
        return False  # a plain sum over in-edges: exact on the local graph as it is
    for c in convs:
        if c.improved or not c.add_self_loops:
            raise InvalidValue(f"{type(model).__name__}: GCNConv(improved={c.improved}, "
                           f"add_self_loops={c.add_self_loops}) is not supported layer-wise "
                           "(full-graph weights are computed for improved=False with self loops)")
    return True


class _StockLayers:
    """``layer(l, x, edge_index, edge_weight)`` of a stock ``BasicGNN``: conv, then
    (all but the last layer) norm and activation as ``act_first`` orders them."""

    def __init__(self, model, gcn: bool):
        self.model = model
        self.gcn = gcn

    def _conv(self, l: int, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None,
              num_targets: int | None) -> Tensor:
        from torch_geometric.nn import GATConv, SAGEConv

        conv = self.model.convs[l]
        n_t = x.size(0) if num_targets is None else int(num_targets)
        if not self.gcn and n_t < x.size(0) and isinstance(conv, (SAGEConv, GATConv)):
            return conv((x, x[:n_t]), edge_index, size=(x.size(0), n_t))
        if not self.gcn:
            return conv(x, edge_index)[:n_t]
        conv.normalize = False  # the weights are final: full-graph gcn_norm
        try:
            return conv(x, edge_index, edge_weight)[:n_t]
        finally:
            conv.normalize = True

    def __call__(self, l: int, x: Tensor, edge_index: Tensor,
                 edge_weight: Tensor | None = None, num_targets: int | None = None) -> Tensor:
        m = self.model
        h = self._conv(l, x, edge_index, edge_weight, num_targets)
        if l == m.num_layers - 1:
            return h
        if m.act is not None and m.act_first:
            h = m.act(h)
        h = m.norms[l](h)
        if m.act is not None and not m.act_first:
            h = m.act(h)
        return m.dropout(h)
