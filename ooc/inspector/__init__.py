"""Inspector: superbatch sampling (with the neighbor cache) and Belady changesets."""
from .neighbor_cache import NeighborCache, build_neighbor_cache, load_or_build_neighbor_cache
from .neighbors import (CachedNeighbors, DirectNeighbors, InMemoryNeighbors, NeighborRequest,
                        NeighborSource, open_neighbor_source)
from .sampler import NeighborSampler, SampledBatch, derive_seed, epoch_batches

__all__ = [
    "CachedNeighbors", "DirectNeighbors", "InMemoryNeighbors", "NeighborCache", "NeighborRequest",
    "NeighborSampler", "NeighborSource", "SampledBatch", "build_neighbor_cache", "derive_seed",
    "epoch_batches", "load_or_build_neighbor_cache", "open_neighbor_source",
]
