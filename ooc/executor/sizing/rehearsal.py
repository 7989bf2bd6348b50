"""The first batches of an epoch run as training runs them, timed.

The profiler's stage model (:func:`ooc.executor.sizing.profiler.predict_epoch`) times
each stage alone; in a training run the stages share the cores (the mmap preset's
page-fault threads slow the model's step, the inspector's sampling competes with the
gather), and the sum of the parts misses that. :func:`rehearse` builds the preset's
loader stack with the recommended sizes, exactly as ``ooc.train`` does, and trains on
the epoch's first batches through :class:`~ooc.executor.loader.node_loader.NodeLoader`
(the trainer's own loader) with the page cache dropped first.

A rehearsal has two parts: the *warm-up* (the first batch; with superbatches the first
superbatch, whose cache starts empty: its switch fills the cache and its batches
barely miss) and the *steady* part after it, whose seconds per batch, feature-read
seconds and busy producer thread
:func:`ooc.executor.sizing.profiler.extrapolate_epoch` scales to the whole epoch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ooc.executor.loader.stack import build_stack
from ooc.storage.pagecache import drop_page_cache

#: Batches rehearsed when the epoch has at least this many (fewer: the whole epoch).
REHEARSAL_BATCHES = 16
#: Largest superbatch a rehearsal uses (the epoch's superbatch when smaller).
REHEARSAL_SUPERBATCH = 8
#: A rehearsal stops after this many seconds once it has timed a few steady batches.
REHEARSAL_MAX_S = 60.0
#: Steady batches timed before :data:`REHEARSAL_MAX_S` may stop a rehearsal.
MIN_STEADY = 3


@dataclass
class Rehearsal:
    """What a rehearsal measured (seconds from the epoch's start).

    Attributes:
        batches: batches trained (the epoch's first ones).
        superbatch_size: batches per superbatch in the rehearsal (superbatch schedule).
        warm_batches: batches of the warm-up (1, or the first superbatch).
        warm_s: seconds to the end of the warm-up's last step (the pipeline's startup:
            threads, the first superbatch's sampling, changesets and cache fill).
        steady_s: mean seconds per batch after the warm-up (waits for the loader
            included); 0 when the rehearsal is all warm-up.
        steady_read_s: seconds the feature source spent reading in that part.
        steady_busy: share of that part the thread making batches was busy (0..1).
        miss_ratio: feature rows read by gathers / rows looked up, whole rehearsal.
        wall_s: seconds of the whole rehearsal.
        stage_s: the pipeline's stage seconds (``sample``, ``gather``, ...).
        build_s: seconds to build the stack before the epoch (a saved neighbor cache
            loaded, a static cache filled), what a training run pays once.
    """

    batches: int
    superbatch_size: int | None
    warm_batches: int
    warm_s: float
    steady_s: float
    steady_read_s: float
    steady_busy: float
    miss_ratio: float
    wall_s: float
    stage_s: dict[str, float]
    build_s: float = 0.0

    @property
    def steady_batches(self) -> int:
        return self.batches - self.warm_batches

    def as_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "superbatch_size": self.superbatch_size,
                "warm_batches": self.warm_batches, "warm_s": self.warm_s,
                "steady_s_per_batch": self.steady_s, "steady_read_s": self.steady_read_s,
                "steady_busy": self.steady_busy, "miss_ratio": self.miss_ratio,
                "wall_s": self.wall_s, "stage_s": dict(self.stage_s), "build_s": self.build_s}


def rehearsal_shape(num_batches: int, superbatch_size: int | None) -> tuple[int, int | None]:
    """(batches, superbatch size) of the rehearsal of an epoch of ``num_batches``
    batches: :data:`REHEARSAL_BATCHES` batches (the epoch when shorter) and superbatches
    of at most :data:`REHEARSAL_SUPERBATCH` and half the rehearsal, so that at least
    half of it runs after the first superbatch, crossing superbatch boundaries as the
    epoch does; with superbatches, whole ones (a short last superbatch would pay a
    whole switch for a few batches)."""
    k = max(1, min(int(num_batches), REHEARSAL_BATCHES))
    if superbatch_size is None:
        return k, None
    s = max(1, min(int(superbatch_size), REHEARSAL_SUPERBATCH, k // 2))
    return min(int(num_batches), -(-k // s) * s), s


def warm_batches(num_batches: int, superbatch_size: int | None) -> int:
    """Batches of an epoch's warm-up: its first superbatch, else its first batch."""
    return max(1, min(int(superbatch_size or 1), int(num_batches)))


def rehearse(dataset, config, options, preset, seeds: np.ndarray, superbatch_size: int | None,
             model, optimizer, device, max_s: float = REHEARSAL_MAX_S) -> Rehearsal:
    """Train on the batches of ``seeds`` (taken in order, ``config.batch_size`` a batch,
    sampled with epoch 1's seeds) through ``preset``'s stack built with ``options`` and
    ``superbatch_size``; stop early after ``max_s`` seconds once :data:`MIN_STEADY`
    steady batches are timed.

    Args:
        seeds: int64 [k * batch_size]: the epoch's first batches' seeds, in epoch order.
        options: :class:`~ooc.executor.loader.stack.ModeOptions` with the cache sizes set.
        model, optimizer, device: what the steps train (the profile's model).
    """

    opts = replace(options, superbatch_size=superbatch_size, memory_budget=None)
    seeds = np.asarray(seeds, dtype=np.int64)
    nb = -(-len(seeds) // int(config.batch_size))
    warm = warm_batches(nb, superbatch_size)
    drop_page_cache(dataset.path)  # a training run starts cold
    t0 = time.perf_counter()
    stack = build_stack(dataset, config, opts, seeds=seeds, shuffle=False, preset=preset)
    build_s = time.perf_counter() - t0
    try:
        marks = _train(dataset, config, stack, seeds, model, optimizer, device, warm, max_s)
        io = stack.train.io_stats()
        stages = stack.train.stage_times()
    finally:
        stack.close()
    ends, busy, read = (np.array(v) for v in zip(*marks, strict=True))
    k = len(ends)
    w = min(warm, k)
    span = ends[-1] - ends[w - 1]
    return Rehearsal(batches=k, superbatch_size=superbatch_size, warm_batches=w,
                     warm_s=float(ends[w - 1]), steady_s=float(span / (k - w)) if k > w else 0.0,
                     steady_read_s=float(read[-1] - read[w - 1]),
                     steady_busy=float(min(1.0, (busy[-1] - busy[w - 1]) / span)) if span > 0
                     else 0.0,
                     miss_ratio=io["feature_misses"] / max(io["feature_lookups"], 1),
                     wall_s=float(ends[-1]), stage_s={s: float(v) for s, v in stages.items()},
                     build_s=build_s)


def _train(dataset, config, stack, seeds, model, optimizer, device, warm: int, max_s: float
           ) -> list[tuple[float, float, float]]:
    """Train on the stack's batches; per step, (seconds since the start, seconds the
    producing thread has been busy, seconds the feature source has read)."""
    import torch

    from ooc.executor.loader.node_loader import GivenPipeline, NodeLoader
    from ooc.executor.training.step import default_loss, model_call, train_step

    pipe = stack.train
    loader = NodeLoader(dataset, config.fanouts, seeds, batch_size=config.batch_size,
                        num_workers=pipe.workers, preset=config.mode, seed=config.seed,
                        num_threads=config.num_threads, labels="seeds",
                        source=GivenPipeline(pipe))
    call = model_call(model)
    model.train()
    marks: list[tuple[float, float, float]] = []
    t0 = time.perf_counter()
    it = loader.batches(1)
    try:
        for data in it:
            train_step(call, optimizer, default_loss, data.to(device))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            st = pipe.stage_times()
            marks.append((time.perf_counter() - t0, sum(st.get(s, 0.0) for s in
                                                        pipe.producer_stages),
                          float(stack.features.read_s)))
            if marks[-1][0] > max_s and len(marks) > warm + MIN_STEADY:
                break
    finally:
        it.close()
    return marks


__all__ = ["REHEARSAL_BATCHES", "REHEARSAL_MAX_S", "REHEARSAL_SUPERBATCH", "Rehearsal",
           "rehearsal_shape", "rehearse", "warm_batches"]
