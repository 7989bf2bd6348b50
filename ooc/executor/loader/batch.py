"""Sampled batches to PyG ``Data`` objects (NeighborLoader conventions).

Every mode's pipeline (:mod:`ooc.executor.loader.pipelines`) yields ``(batch,
rows)`` pairs; :func:`to_data` turns one into the ``Data`` a stock PyG model
(with ``trim_to_layer``) consumes.
"""
from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data


def to_data(batch, x: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor | None = None
            ) -> Data:
    """A PyG ``Data`` for a sampled batch, in NeighborLoader conventions.

    Args:
        batch: a ``SampledBatch`` (``node_ids`` seeds first, ``num_seeds``,
            local ``edge_index`` [2, m] with row 0 = neighbour and row 1 =
            sampled node, per-hop ``num_sampled_nodes`` / ``num_sampled_edges``).
        x: feature rows of ``batch.node_ids`` [n, dim] (converted to float32).
        labels: labels of all of ``batch.node_ids`` [n] (PyG's convention, what
            ``NodeLoader`` gives), or of the seeds [num_seeds] (what training reads);
            ``data.y`` holds them as given, the seeds' first.

    Returns:
        ``Data(x, edge_index, y, n_id, batch_size, num_sampled_nodes,
        num_sampled_edges)``.
    """
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    elif x.dtype != torch.float32:
        x = x.float()
    num_seeds = int(batch.num_seeds)
    data = Data(x=x, edge_index=torch.as_tensor(np.asarray(batch.edge_index, dtype=np.int64)))
    data.n_id = torch.as_tensor(np.asarray(batch.node_ids, dtype=np.int64))
    data.batch_size = num_seeds
    data.num_sampled_nodes = [int(v) for v in batch.num_sampled_nodes]
    data.num_sampled_edges = [int(v) for v in batch.num_sampled_edges]
    if labels is not None:
        data.y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    return data
