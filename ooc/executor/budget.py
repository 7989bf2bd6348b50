"""The memory budget: measured working memory per stage, the rest to the caches.

Ginex §3.5: cache sizes are the memory left after the peak usage of each
stage and a reserve, found by a short offline profile. Here the profile runs
in the training process itself, before the caches exist:

1. ``setup``: RSS now (interpreter, torch, the dataset's in-memory arrays,
   the model).
2. ``probe``: the kernel's RSS high-water mark is reset
   (``/proc/self/clear_refs`` ← 5) and a few batches are sampled with the
   mode's uncached neighbour path, gathered with its uncached feature path
   (every row a miss: the largest read buffers) and one training step is
   run on a copy of the model; the new ``VmHWM`` is the peak of one
   sample → gather → train iteration, readers' buffers included.
3. What the probe cannot see, computed: the batches queued between the
   stages (``PREFETCH + 2`` batches of rows), the feature cache's
   address table (int32 [N]) and free list, and for ``ooc`` the superbatch
   in flight (runtime samples of up to three superbatches: being sampled,
   having its changesets computed, being consumed) plus the changeset pass
   (Belady simulation arrays over N and over the superbatch's accesses).

``free = budget - working - reserve``. The neighbor cache (``static`` and
``ooc``; its int64 [N] address table counts in it) takes
``neighbor_fraction`` of ``free`` (capped at the full cache; in this engine
sampling runs while training, so both caches are resident at once), and the
feature cache the rest: ``rows = free_left / (row_bytes + 8)``.

A budget below the working memory fails with the smallest budget that can
work.
"""
from __future__ import annotations

import copy
import gc
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..memory import anon_rss_bytes, trim_malloc
from ..memory import current_rss_bytes as rss_bytes
from ..memory import peak_rss_bytes as hwm_bytes
from ..memory import reset_peak_rss as reset_hwm
from ..storage.errors import OocError
from .pipelines import PREFETCH

MiB = 1 << 20


@dataclass
class MemoryPlan:
    """Cache sizes under a memory budget and how they were derived (bytes)."""

    budget: int
    reserve: int
    working: int
    stages: dict[str, int] = field(default_factory=dict)
    feature_cache_rows: int = 0
    feature_cache_bytes: int = 0
    neighbor_cache_bytes: int = 0
    superbatch_size: int | None = None
    min_budget: int = 0
    #: peak RSS (absolute, bytes) of the probe's sample stage and of its main loop
    #: (gather + one training step), each from a fresh high-water mark
    stage_peaks: dict[str, int] = field(default_factory=dict)
    runtime_bytes_per_batch: float = 0.0
    ids_per_batch: float = 0.0
    #: superbatch size the runtime disk budget alone allows (before the memory cap)
    superbatch_size_disk: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_reserve(budget: int) -> int:
    """Headroom for what the single-batch probe cannot see (allocator slack,
    the inspector's threads working beside the gather thread): 10% of the
    budget, at least 48 MiB. Measured on the 4.3 GiB bench dataset at 1 GiB:
    5% left the peak 3% over the budget."""
    return max(48 * MiB, budget // 10)


def warm_up_kernels(mode: str, dim: int, dtype) -> None:
    """Compile (or load from numba's on-disk cache) every kernel the mode runs
    after planning, on a tiny in-memory graph, before anything is measured.

    On a first run (cold cache) numba compiles a kernel the first time it is
    called; LLVM then needs ~100 MB for a moment. A kernel first called
    mid-epoch, with the caches already full, would push the peak past the
    budget; compiled here, that transient happens while nothing else is held.
    The probe below covers the sampler and the readers; this covers the
    neighbor cache, the feature cache and the changeset pass.
    """
    from ..inspector.changesets import precompute_changesets
    from ..inspector.neighbor_cache import build_neighbor_cache
    from ..inspector.neighbors import CachedNeighbors, InMemoryNeighbors
    from ..inspector.sampler import NeighborSampler
    from .feature_cache import FeatureCache

    n = 32
    src = np.arange(4 * n, dtype=np.int64) % n
    dst = (np.arange(4 * n, dtype=np.int64) * 7 + 3) % n
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[order].astype(np.int32)
    if mode != "baseline":
        cache = build_neighbor_cache(indptr, indices, 8 * n + 64)
        source = CachedNeighbors(cache, InMemoryNeighbors(indices))
        NeighborSampler(indptr, source, [3, 2]).sample_many(
            [np.arange(4, dtype=np.int64), np.arange(4, 8, dtype=np.int64)], [1, 2])
        x = np.zeros((n, dim), dtype=np.dtype(dtype))

        class _Rows:
            @staticmethod
            def read(ids: np.ndarray) -> np.ndarray:
                return x[ids]

        fc = FeatureCache(n, 4, dim, x.dtype)
        fc.switch(np.array([0, 1]), _Rows)
        rows, _ = fc.gather(np.array([0, 2, 3]), _Rows)
        fc.update(np.array([2]), np.array([0]), np.array([1]), rows)
    if mode == "ooc":
        precompute_changesets([np.array([0, 1]), np.array([1, 2]), np.array([0, 3])], n, 2)


def plan_memory(dataset, config, budget: int, options=None, model=None, probes: int = 2,
                neighbor_fraction: float = 0.25, reserve: int | None = None) -> MemoryPlan:
    """Measure the working memory of ``config.mode`` and size the caches.

    Args:
        dataset: an opened dataset.
        config: the :class:`~ooc.executor.trainer.TrainConfig`.
        budget: bytes the process may use.
        options: :class:`~ooc.executor.modes.ModeOptions` (explicit cache sizes
            are kept and count against the budget; superbatch size).
        model: the model to probe a training step with (a copy is trained);
            None skips the step.
        probes: batches in the probe.
        neighbor_fraction: share of the free memory for the neighbor cache.
        reserve: bytes held back (default :func:`default_reserve`).

    Raises:
        OocError: the budget is below the working memory (the message gives
            the smallest budget that can work).
    """
    from ..inspector.neighbor_cache import full_cache_bytes
    from ..inspector.pipeline import bytes_per_batch
    from ..inspector.sampler import NeighborSampler, derive_seed, epoch_batches
    from .modes import ModeOptions, ThreadedMmapFeatures, ThreadedMmapNeighbors, drop_mapping

    opts = options or ModeOptions()
    mode = config.mode
    budget = int(budget)
    reserve = default_reserve(budget) if reserve is None else int(reserve)
    n = dataset.num_nodes
    row_bytes = dataset.layout.row_bytes
    stages: dict[str, int] = {}

    warm_up_kernels(mode, dataset.feature_dim, dataset.feature_dtype)
    gc.collect()
    trim_malloc()  # LLVM's freed compile-time memory, when the warm-up compiled
    setup = rss_bytes()
    stages["setup_rss"] = setup

    # -- probe: sample, gather (all misses), one training step -------------------------------
    seed_batches = epoch_batches(dataset.train_idx, config.batch_size, config.seed, 1,
                                 shuffle=True)
    k = max(1, min(probes, len(seed_batches)))
    bseeds = [derive_seed(config.seed, 1, b) for b in range(k)]
    closers = []
    if mode == "baseline":
        nsrc = ThreadedMmapNeighbors(dataset.indices, opts.io_threads)
        feats = ThreadedMmapFeatures(dataset.file("features.bin"), dataset.layout,
                                     opts.io_threads)
        closers += [nsrc.close, feats.close]
    else:
        from ..inspector.neighbors import DirectNeighbors
        from ..storage.direct import DirectFeatures, DirectReader

        reader = DirectReader(dataset.file("indices.bin"), queue_depth=opts.queue_depth,
                              backend=opts.io_backend)
        nsrc = DirectNeighbors(dataset.file("indices.bin"), dataset.indptr, reader=reader,
                               dtype=dataset.index_dtype)
        nsrc._own = True
        feats = DirectFeatures(dataset.file("features.bin"), dataset.layout,
                               queue_depth=opts.queue_depth, backend=opts.io_backend)
        closers += [nsrc.close, feats.close]
    hwm_ok = reset_hwm()
    sampler = NeighborSampler(dataset.indptr, nsrc, list(config.fanouts),
                              num_threads=config.num_threads)
    batches = sampler.sample_many(seed_batches[:k], bseeds)
    ids_per_batch = float(np.mean([b.num_nodes for b in batches]))
    # the stage peaks (Ginex §3.5): sample, then main loop (gather + step) from a fresh
    # high-water mark; their maximum is the HWM of the whole probe
    peak_sample = hwm_bytes() if hwm_ok else max(rss_bytes(), setup)
    hwm_ok = reset_hwm() and hwm_ok
    rows = [feats.read(b.node_ids) for b in batches]
    if model is not None:
        _probe_step(model, batches[0], rows[0], dataset)
    peak_main = hwm_bytes() if hwm_ok else max(rss_bytes(), setup)
    peak = max(peak_sample, peak_main)
    bpb = bytes_per_batch(batches, len(config.fanouts), with_changesets=True)
    for c in closers:
        c()
    del batches, rows
    if mode == "baseline":
        drop_mapping(dataset.indices)
    gc.collect()
    stages["probe_peak"] = max(0, peak - setup)
    stage_peaks = {"sample": int(peak_sample), "main_loop": int(peak_main)}
    batch_rows_bytes = int(ids_per_batch * row_bytes)
    # the prefetch queue + the one the gather thread holds + the one computing
    stages["queued_batches"] = (PREFETCH + 2) * batch_rows_bytes

    # -- computed parts -------------------------------------------------------------------------
    if mode != "baseline":
        stages["feature_address_table"] = 4 * n
    s = s_disk = None
    if mode == "ooc":
        from ..inspector.pipeline import superbatch_size_for_budget

        nb = len(seed_batches)
        if opts.superbatch_size:
            s_disk = None
        else:
            s_disk = superbatch_size_for_budget(opts.runtime_disk_budget, bpb, ahead=1)
        s = opts.superbatch_size or min(s_disk, nb)
        s = max(1, min(int(s), nb))

        def sb_bytes(size: int) -> int:
            samples = 3 * size * bpb
            changeset = 24 * n + 40 * size * ids_per_batch
            return int(samples + changeset)

        # keep the superbatch's memory to at most a quarter of what the probe leaves
        room = budget - setup - stages["probe_peak"] - reserve
        if opts.superbatch_size is None and room > 0:
            while s > 1 and sb_bytes(s) > room // 4:
                s = max(1, s // 2)
        stages["superbatch"] = sb_bytes(s)
    working = setup + sum(v for key, v in stages.items() if key != "setup_rss")
    plan = MemoryPlan(budget=budget, reserve=reserve, working=working, stages=stages,
                      superbatch_size=s, min_budget=working + reserve,
                      stage_peaks=stage_peaks, runtime_bytes_per_batch=float(bpb),
                      ids_per_batch=ids_per_batch,
                      superbatch_size_disk=s_disk)
    free = budget - working - reserve
    explicit_f = opts.feature_cache_size
    explicit_n = opts.neighbor_cache_size if mode != "baseline" else 0
    need_min = working + reserve + (explicit_f or 0) + (explicit_n or 0)
    plan.min_budget = need_min
    if free < (explicit_f or 0) + (explicit_n or 0) or free < 0:
        raise OocError(f"--memory-budget {_fmt(budget)} is below the working memory of mode "
                       f"{mode} ({_fmt(working)} + {_fmt(reserve)} reserve"
                       + (" + the requested caches" if explicit_f or explicit_n else "")
                       + f"); the smallest budget that can work is {_fmt(need_min)}")
    if mode == "baseline":
        return plan  # no application caches: the rest is the page cache's
    full_n = full_cache_bytes(dataset.indptr, dataset.index_dtype.itemsize)
    if explicit_n is not None:
        nbytes = int(explicit_n)
    else:
        nbytes = int(min(full_n, neighbor_fraction * free))
        if nbytes < 8 * n + 8 * n // 8:   # not even the address table plus a few lists
            nbytes = 0
    left = free - nbytes
    if explicit_f is not None:
        fbytes = int(explicit_f)
    else:
        frows = int(min(n, max(0, left) // (row_bytes + 8)))
        fbytes = frows * row_bytes
    plan.neighbor_cache_bytes = nbytes
    plan.feature_cache_bytes = fbytes
    plan.feature_cache_rows = int(min(n, fbytes // row_bytes))
    return plan


def _probe_step(model, batch, rows, dataset) -> None:
    """One forward/backward/Adam step on a copy of ``model`` (RNG state kept)."""
    import torch
    import torch.nn.functional as F

    from .batch import to_data

    state = torch.get_rng_state()
    try:
        m = copy.deepcopy(model)
        m.train()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        ids = np.asarray(batch.node_ids, dtype=np.int64)
        y = np.asarray(dataset.labels[ids[:int(batch.num_seeds)]], dtype=np.int64)
        dev = next(m.parameters()).device
        data = to_data(batch, rows, y).to(dev)
        out = m(data.x, data.edge_index, data.num_sampled_nodes, data.num_sampled_edges)
        loss = F.cross_entropy(out[:data.batch_size], data.y, ignore_index=-1)
        loss.backward()
        opt.step()
        del m, opt, data, out, loss
    finally:
        torch.set_rng_state(state)


def _fmt(nbytes: float) -> str:
    from ..cli import format_size

    return format_size(nbytes)


def child_peak_rss() -> int:
    """Peak RSS of waited-for children (ru_maxrss of RUSAGE_CHILDREN), bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


__all__ = ["MemoryPlan", "anon_rss_bytes", "child_peak_rss", "default_reserve", "hwm_bytes",
           "plan_memory", "reset_hwm", "rss_bytes"]

if os.name != "posix":  # pragma: no cover
    raise ImportError("ooc.executor.budget needs /proc (Linux)")
