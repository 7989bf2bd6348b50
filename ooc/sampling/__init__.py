"""Sampling: the neighbour sampler, the epoch plan, and the inspector that samples a
superbatch ahead of training and writes its samples and Belady changesets as runtime files."""
from ooc.sampling.sampler import NeighborSampler, SampledBatch, derive_seed, epoch_batches

__all__ = ["NeighborSampler", "SampledBatch", "derive_seed", "epoch_batches"]
