"""What one training step (or evaluation forward) of a :class:`GNN` allocates, computed
from the shapes of a sampled batch, before anything that large is allocated.

The memory planner measures a real step on a sampled batch; this estimate comes
first and keeps that measurement from running a step that cannot fit (a huge
class count, hidden size, fanout or batch), and it names the batch size that
would. It charges, in float32:

* the optimizer (training only): gradients, Adam's two moments, and the step's
  temporaries (two of the largest parameter);
* per layer ``l`` (reading the first ``L - l + 1`` hops of the batch and writing
  rows for the first ``L - l``, as :meth:`~ooc.executor.training.models.GNN.forward`
  runs it): the gradient of its input rows when it flows back (the first layer's
  input is the batch's gathered rows, which the caller holds and measures); SAGE's
  aggregated rows (it aggregates, then transforms), GCN's aggregated or transformed rows
  (whichever order costs fewer FLOPs:
  :func:`~ooc.executor.training.models.aggregates_first`), GAT's transformed rows (it
  transforms every row it reads, then aggregates); its output rows
  (:data:`HIDDEN_OUTPUT_COPIES` in hidden layers); the output layer's rows are the
  logits, ``rows x C``;
* the layer's aggregation buffers (:func:`message_elements`, what the aggregation
  of the model allocates per edge: index arrays for SAGE's and GCN's sparse
  product, messages for GAT);
* the loss over the seeds (log-softmax, its gradient, one temporary).

Against the real step's RSS peak above the batch's rows it is an upper bound (the
ratios are in ``docs/benchmarks.md``, the memory budget), which is what the gate needs
(the planner runs and measures every step that this bound lets fit), and not much more,
since a looser one refuses batches that fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

F32 = 4


@dataclass(frozen=True)
class StepEstimate:
    """Bytes above the resident model of one step (``total``) and its largest parts."""

    optimizer: int
    layers: int
    messages: int
    logits: int
    loss: int

    @property
    def total(self) -> int:
        return self.optimizer + self.layers + self.messages + self.logits + self.loss


#: Float-sized elements per edge of a sparse (CSR) aggregation: the adjacency's column
#: ids and values, its transpose in the backward pass, and (GCN) the edge list with the
#: targets' self loops and their weights put in between.
CSR_EDGE_ELEMENTS = {"sage": 9, "gcn": 20}
#: Float copies of a hidden layer's output rows a step holds at its fullest: SAGE's and
#: GCN's GEMM output with its bias or root term added in place (``addmm``), then the
#: activation's result and mask (:func:`~ooc.executor.training.activation.relu_dropout`:
#: one byte per element) and the gradient; GAT's attention sum and its parts besides.
HIDDEN_OUTPUT_COPIES = {"sage": 2, "gcn": 2, "gat": 4}


def message_elements(kind: str, rows: int, edges: int, d_in: int, d_out: int, heads: int,
                     backward: bool) -> int:
    """Float elements a layer's aggregation holds at its fullest (``backward``: gradients
    flow back into the layer's input). SAGE and GCN aggregate a sampled batch through a
    CSR adjacency and one ``spmm`` (:func:`~ooc.executor.training.models.target_csr`):
    index arrays per edge (:data:`CSR_EDGE_ELEMENTS`), no row per edge. GAT gathers the
    transformed rows (``d_out``) per edge and self loop and their weighted copies, and
    ~10 attention values per edge and head (scores, softmax, dropout, gradients).
    """
    if kind in CSR_EDGE_ELEMENTS:
        return CSR_EDGE_ELEMENTS[kind] * (edges + (rows if kind == "gcn" else 0))
    m = edges + rows
    return 4 * m * d_out + 10 * m * heads


def layer_work(nodes: Sequence[int], edges: Sequence[int], num_layers: int,
               bipartite: bool = True) -> list[tuple[int, int, int]]:
    """``(rows read, rows written, edges)`` of layer ``l``: it reads the first
    ``L - l + 1`` hops and their edges and writes rows for the first ``L - l`` hops
    (``bipartite``, as the built-in models run a sampled batch) or for every row it
    reads."""
    out = []
    for l in range(num_layers):
        rows_in = sum(nodes[:num_layers + 1 - l])
        rows_out = sum(nodes[:max(1, num_layers - l)]) if bipartite else rows_in
        out.append((rows_in, rows_out, sum(edges[:num_layers - l])))
    return out


def step_bytes(model, nodes: Sequence[int], edges: Sequence[int], batch_size: int,
               train: bool = True) -> StepEstimate | None:
    """The estimate for ``model`` (a :class:`~ooc.executor.training.models.GNN`; None for
    another model, or one not on the CPU, whose step is not in the process's RSS) on a
    batch with per-hop node and edge counts ``nodes``/``edges``.

    Per layer: the gradient of its input rows when it flows back (training; the rows
    themselves are the previous layer's output, the first layer's the batch's rows);
    SAGE's aggregated rows, GCN's aggregated or transformed rows, GAT's transformed rows;
    its output rows :data:`HIDDEN_OUTPUT_COPIES` times
    in hidden layers and three times in the output layer (the two linear maps' outputs
    and their sum, then the gradient).
    """
    from ooc.executor.training.models import GNN, aggregates_first

    if not isinstance(model, GNN) or any(p.device.type != "cpu" for p in model.parameters()):
        return None
    params = [p.numel() for p in model.parameters() if p.requires_grad]
    optimizer = (3 * sum(params) + 2 * max(params, default=0)) * F32 if train else 0
    layers = messages = logits = 0
    work = layer_work(list(nodes), list(edges), model.num_layers)
    for l, (rows, rows_out, m) in enumerate(work):
        d_in, d_out = model.dims[l], model.dims[l + 1]
        backward = train and l > 0
        if backward:  # the input's gradient (the input is the previous layer's output)
            layers += rows * d_in * F32
        if model.kind == "sage" or (model.kind == "gcn" and aggregates_first(
                rows, rows_out, m + rows_out, d_in, d_out)):
            layers += rows_out * d_in * F32  # the aggregated rows, kept for backward
        else:  # GCN (where cheaper) and GAT transform every row they read, then aggregate
            layers += rows * d_out * F32
        if l == model.num_layers - 1:
            logits = 3 * rows_out * d_out * F32
        else:
            layers += HIDDEN_OUTPUT_COPIES[model.kind] * rows_out * d_out * F32
        messages += message_elements(model.kind, rows_out, m, d_in, d_out,
                                     model.config["heads"], backward) * F32
    loss = (3 if train else 1) * int(batch_size) * model.dims[-1] * F32
    return StepEstimate(optimizer=int(optimizer), layers=int(layers), messages=int(messages),
                        logits=int(logits), loss=int(loss))
