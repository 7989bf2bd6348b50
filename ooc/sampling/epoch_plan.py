"""The epoch plan: an epoch's seed batches and each batch's sampling seed.

Every consumer of an epoch's batches (the loader's pipelines, the memory planner's
probe, the profiler, :mod:`ooc.pyg` and the benchmarks) takes them from
:class:`EpochPlan`, so one ``(seed, epoch)`` gives the same batches everywhere.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.sampling.sampler import derive_seed, epoch_batches

__all__ = ["EpochPlan", "unplanned_seed"]


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """The batches of epoch ``epoch`` over ``ids`` and their sampling seeds.

    Attributes:
        ids: the seed nodes (int64 [n]), split into batches of ``batch_size`` (the last
            may be smaller), in a permutation drawn from ``(seed, epoch)`` when ``shuffle``.
        batch_size: seeds per batch (> 0).
        seed: the run's sampling seed.
        epoch: the epoch (the trainer's first is 1; evaluation uses 0).
        shuffle: shuffle the seeds (else batches in ``ids``' order).
    """

    ids: np.ndarray
    batch_size: int
    seed: int
    epoch: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        if int(self.batch_size) <= 0:
            raise InvalidValue(f"batch_size must be positive, got {self.batch_size}")

    def __len__(self) -> int:
        n = len(self.ids)
        return -(-n // int(self.batch_size)) if n else 0

    @functools.cached_property
    def batches(self) -> list[np.ndarray]:
        """The seed batches (int64 arrays), in order."""
        return epoch_batches(self.ids, int(self.batch_size), int(self.seed), int(self.epoch),
                             shuffle=self.shuffle)

    @functools.cached_property
    def seeds(self) -> list[int]:
        """Each batch's sampling seed: an independent stream per ``(seed, epoch, batch)``."""
        return [self.batch_seed(b) for b in range(len(self))]

    def batch_seed(self, batch: int) -> int:
        """The sampling seed of batch ``batch`` of this epoch."""
        return derive_seed(int(self.seed), int(self.epoch), int(batch))

    def first(self, count: int | None = None) -> tuple[list[np.ndarray], list[int]]:
        """``(batches, seeds)`` of the first ``count`` batches (all: None), the arguments
        of :meth:`~ooc.sampling.sampler.NeighborSampler.sample_many`."""
        end = len(self) if count is None else min(len(self), max(0, int(count)))
        return self.batches[:end], [self.batch_seed(b) for b in range(end)]


def unplanned_seed(seed: int, node_ids: np.ndarray) -> int:
    """The sampling seed of a batch no plan holds (a request :mod:`ooc.pyg` did not
    foresee): drawn from ``seed`` and the batch's node ids."""
    return derive_seed(int(seed), 0, zlib.crc32(np.ascontiguousarray(node_ids).tobytes()))
