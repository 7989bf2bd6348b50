"""Sampled batches to PyG ``Data`` objects, and the pluggable pieces of an epoch.

The training loop (:mod:`ooc.executor.trainer`) is the same for every mode;
what changes between ``baseline``, ``static`` and ``ooc`` are two pieces:

* a **batch producer**: ``batches(epoch)`` yields the batches of one epoch in
  order, each either a ``SampledBatch`` (the loop then reads its rows from the
  feature source) or a ``(SampledBatch, rows)`` pair when the producer
  gathered the rows itself (prefetching, caches...); ``len(producer)`` is the
  number of batches per epoch; optional ``stage_times() -> {stage: seconds}``
  reports the time its stages took during the last ``batches`` call, and
  ``synchronous = True`` says that time was spent inside the loop's ``next()``
  calls (so it is not counted again as a stall);
* a **feature source**: ``read(ids) -> np.ndarray [n, dim]`` returns the
  feature rows of ``ids`` (int64), in any float dtype.

``baseline`` is :class:`SamplingProducer` + :class:`MmapFeatureSource`: sample
each batch when it is needed, read features through a memmap of
``features.bin`` with kernel readahead off (``MADV_RANDOM``).
"""
from __future__ import annotations

import time
from typing import Iterator, Protocol, runtime_checkable

import numpy as np
import torch
from torch_geometric.data import Data


@runtime_checkable
class FeatureSource(Protocol):
    """Where feature rows come from."""

    def read(self, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - protocol
        """Rows of ``ids`` (int64 [n]) as an array [n, dim]."""
        ...


@runtime_checkable
class BatchProducer(Protocol):
    """Yields the batches of an epoch (``SampledBatch`` or ``(batch, rows)``)."""

    def batches(self, epoch: int) -> Iterator:  # pragma: no cover - protocol
        ...

    def __len__(self) -> int:  # pragma: no cover - protocol
        ...


class MmapFeatureSource:
    """Features through a memmap of ``features.bin`` (the page cache), readahead off."""

    def __init__(self, features):
        self.features = features
        if hasattr(features, "advise_random"):
            features.advise_random()

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def read(self, ids: np.ndarray) -> np.ndarray:
        return self.features.read(ids)


class SamplingProducer:
    """Batches of ``seeds`` in a seeded order, each sampled when it is needed.

    The order of the seeds in epoch ``e`` is ``epoch_batches(seeds,
    batch_size, seed, e, shuffle)`` and batch ``b`` is sampled with
    ``derive_seed(seed, e, b)``: nothing depends on a global RNG, so any epoch
    can be replayed (``--resume``) exactly.
    """

    def __init__(self, sampler, seeds: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool = True):
        self.sampler = sampler
        self.seeds = np.asarray(seeds, dtype=np.int64)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.sample_time_s = 0.0

    #: sampling happens inside ``next()`` of the loop, not on another thread
    synchronous = True

    def stage_times(self) -> dict[str, float]:
        return {"sample": self.sample_time_s}

    def __len__(self) -> int:
        return -(-len(self.seeds) // self.batch_size) if len(self.seeds) else 0

    def batches(self, epoch: int) -> Iterator:
        from ..inspector.sampler import derive_seed, epoch_batches

        seed_batches = epoch_batches(self.seeds, self.batch_size, self.seed, epoch,
                                     shuffle=self.shuffle)
        self.sample_time_s = 0.0
        for b, ids in enumerate(seed_batches):
            t0 = time.perf_counter()
            batch = self.sampler.sample(ids, derive_seed(self.seed, epoch, b))
            self.sample_time_s += time.perf_counter() - t0
            yield batch


def to_data(batch, x: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor | None = None
            ) -> Data:
    """A PyG ``Data`` for a sampled batch, in NeighborLoader conventions.

    Args:
        batch: a ``SampledBatch`` (``node_ids`` seeds first, ``num_seeds``,
            local ``edge_index`` [2, m] with row 0 = neighbour and row 1 =
            sampled node, per-hop ``num_sampled_nodes`` / ``num_sampled_edges``).
        x: feature rows of ``batch.node_ids`` [n, dim] (converted to float32).
        labels: labels of all of ``batch.node_ids`` [n], or of the seeds
            [num_seeds]; ``data.y`` holds the labels of the seeds.

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
        y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        data.y = y[:num_seeds]
    return data
