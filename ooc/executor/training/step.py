"""One training step and one evaluation forward on a batch ``Data``.

The trainer, the memory planner's probe and the profiler all step a model
through these, so what they measure is what training runs.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from ooc.executor.training.models import GNN

#: A loss: (outputs of the seeds [batch_size, C], labels int64 [batch_size]) -> scalar.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def default_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the labeled seeds (label -1: unlabeled, ignored)."""
    return F.cross_entropy(out, y, ignore_index=-1)


def model_call(model: torch.nn.Module) -> Callable[[Any], torch.Tensor]:
    """How to call ``model`` on a batch ``Data``; returns its output for every node.

    ooc's built-in :class:`GNN` takes the per-hop counts positionally; a model whose
    ``forward`` accepts ``num_sampled_nodes_per_hop`` / ``num_sampled_edges_per_hop``
    (PyG's ``GraphSAGE``, ``GCN``, ``GAT``, ...) gets them by keyword and trims each
    layer's computation to the hops it needs; any other model is called as
    ``model(x, edge_index)``.
    """
    if isinstance(model, GNN):
        return lambda d: model(d.x, d.edge_index, d.num_sampled_nodes, d.num_sampled_edges)
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "num_sampled_nodes_per_hop" in params and "num_sampled_edges_per_hop" in params:
        return lambda d: model(d.x, d.edge_index,
                               num_sampled_nodes_per_hop=d.num_sampled_nodes,
                               num_sampled_edges_per_hop=d.num_sampled_edges)
    return lambda d: model(d.x, d.edge_index)


def train_step(call: Callable[[Any], torch.Tensor], optimizer: torch.optim.Optimizer,
               loss: Loss, data) -> tuple[torch.Tensor, float]:
    """Zero the gradients, forward, loss over the seeds, backward, optimizer step.

    Returns the seeds' outputs [batch_size, C] and the loss value. A non-finite
    loss takes no step (the weights stay as they were); the caller decides.
    """
    optimizer.zero_grad(set_to_none=True)
    out = call(data)[:data.batch_size]
    value = loss(out, data.y[:data.batch_size])
    v = float(value.item())
    if math.isfinite(v):
        value.backward()
        optimizer.step()
    return out, v


def eval_forward(call: Callable[[Any], torch.Tensor], data) -> torch.Tensor:
    """The seeds' outputs [batch_size, C] without gradients (the model in eval mode)."""
    with torch.no_grad():
        return call(data)[:data.batch_size]
