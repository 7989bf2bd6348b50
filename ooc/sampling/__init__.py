"""Sampling: the neighbour sampler, the epoch plan, and the inspector that samples a
superbatch ahead of training and writes its samples and Belady changesets as runtime files."""
from ooc.sampling.epoch_plan import EpochPlan, unplanned_seed
from ooc.sampling.sampler import NeighborSampler, SampledBatch, derive_seed, epoch_batches

__all__ = ["EpochPlan", "unplanned_seed", "NeighborSampler", "SampledBatch", "derive_seed", "epoch_batches"]
