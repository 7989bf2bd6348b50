"""Inspector: superbatch sampling (with the neighbor cache) and Belady changesets."""
from .changesets import Changesets, ChangesetStep, precompute_changesets
from .neighbor_cache import NeighborCache, build_neighbor_cache, load_or_build_neighbor_cache
from .neighbors import (CachedNeighbors, DirectNeighbors, InMemoryNeighbors, NeighborRequest,
                        MmapNeighbors, NeighborSource)
from .policies import (count_misses_belady, count_misses_lru, count_misses_static, degree_order,
                       hottest, miss_curve_belady, miss_curve_lru, miss_curve_static)
from .sampler import NeighborSampler, SampledBatch, derive_seed, epoch_batches

__all__ = [
    "ChangesetStep", "Changesets", "count_misses_belady", "count_misses_lru", "count_misses_static",
    "degree_order", "hottest", "miss_curve_belady", "miss_curve_lru", "miss_curve_static",
    "precompute_changesets",
    "CachedNeighbors", "DirectNeighbors", "InMemoryNeighbors", "NeighborCache", "NeighborRequest",
    "NeighborSampler", "NeighborSource", "SampledBatch", "build_neighbor_cache", "derive_seed",
    "MmapNeighbors", "epoch_batches", "load_or_build_neighbor_cache",
]
