"""The memory budget: measured working memory, the rest to the caches.

Ginex §3.5: cache sizes are the memory left after the peak usage of each
stage and a reserve, found by a short offline profile. Here the profile runs
in the training process itself, before any cache exists, and everything it
adds up is resident set size (``VmRSS``/``VmHWM``: anonymous memory and the
file pages this process maps):

1. ``setup_rss``: RSS once the mode's numba kernels are loaded (interpreter,
   torch and PyG, the dataset's in-memory arrays, the model, and the node -> row
   map of a dataset stored in a locality order: 4 bytes a node, faulted in first
   since an epoch's reads make all of it resident). On a cold numba
   cache the kernels are first compiled in a child process
   (:func:`compile_kernels`), so this process never holds LLVM's compile-time
   memory and a first run measures what later runs do.
2. ``loop_peak``: the worst moment of the training loop, reproduced
   deterministically. The pipeline holds at most
   :func:`~ooc.executor.loader.pipelines.batches_in_flight` gathered batches
   (each gather thread's queue and the batch it makes, and the one training:
   ``PREFETCH + 2`` with one thread), so the probe samples that many batches
   of epoch 1 with the mode's uncached neighbour path, gathers all their rows
   with its uncached feature path (every row a miss: the largest reader
   buffers) and runs one training step
   of the model itself (Adam at learning rate 0: the weights stay as they are;
   its state included) with the largest of them; the kernel's high-water mark
   (reset through ``/proc/self/clear_refs``) gives the peak above
   ``setup_rss``. Evaluation (larger batches on Planetoid splits) is probed
   the same way with a no-grad forward, plus the Adam state and gradients
   training keeps meanwhile, and the larger of the two counts. A step is run
   only when its computed estimate (:mod:`.step_memory`: optimizer state,
   every layer's rows at the sampled hop sizes, message buffers, logits, loss)
   fits beside what is held; one that does not is charged its estimate and
   the refusal names the largest batch size that fits, so a huge class count,
   hidden size, fanout or batch is refused instead of killed.
3. Computed: the feature cache's tables beside its rows (int32 [N] address
   table, and for ``ooc`` the switch's bool [N] mask), the transient of
   building the neighbor cache or the degree order (N-sized temporaries and
   the ``indices.bin`` pages a build maps, before the feature cache is
   filled: counted where larger than the loop), and for ``ooc`` the
   superbatch in flight (runtime samples of up to three superbatches: being
   sampled, loaded, being consumed; plus the changeset pass's arrays over N and over
   the superbatch's accesses; where an epoch is one superbatch, the loaded one beside
   the loop, its sampling and changesets happening before the loop starts).

Steps 1 and 2 are :func:`measure_working`; the plan is composed from it, the dataset's
shape and the budget by :func:`~ooc.executor.sizing.plan.compose_plan` (step 3 and what
follows). ``free = budget - working - reserve`` with ``reserve = max(48 MiB, budget/10)``
(:func:`default_reserve`). The neighbor cache (``static`` and ``ooc``; its
map of cached nodes counts in it) takes ``neighbor_fraction`` of
``free`` (capped at the full cache; sampling runs while training, so both
caches are resident at once), and the feature cache the rest:
``rows = free_left / row_cost`` (the row, its place on the free stack and in
the cache's id map: :func:`~ooc.caches.feature_cache.row_cost`).

A budget below ``working + reserve`` is refused with the smallest budget
that works: the smallest whole MiB ``B`` with ``B - default_reserve(B) >=
(1 + STABILITY) x working`` (the same reserve rule as the check, and room
for the measurement's run-to-run spread), so the suggestion is accepted as
it is. For ``ooc`` with an automatic superbatch size the suggestion is for
the smallest superbatch (1 batch); larger budgets get larger superbatches.

``baseline`` reads through memmaps: the pages it touches are in its RSS
until dropped, and each fault also maps the page-cache pages around it
(fault-around). Its readers drop them (``MADV_DONTNEED``) as they go, so its
RSS holds a bounded window of the files (its readers' ``mapped_bytes_bound``,
counted as ``mapped_file_pages``); the page cache keeps the pages (the
baseline's cache is the kernel's, outside the process and bounded by a
memory cgroup where one is used).
"""
from __future__ import annotations

import gc
import os
from dataclasses import asdict
from typing import Any

import numpy as np

from ooc.caches.feature_cache import FeatureCache
from ooc.caches.neighbor_cache import (
    CachedNeighbors,
    build_neighbor_cache,
    compute_out_degrees,
    degree_dtype,
    full_cache_bytes,
)
from ooc.caches.policies import POLICIES, CachePolicy
from ooc.core.errors import BudgetError, setting
from ooc.core.jit import compile_in_child
from ooc.core.memory import anon_rss_bytes, trim_malloc, tune_malloc
from ooc.core.memory import current_rss_bytes as rss_bytes
from ooc.core.memory import peak_rss_bytes as hwm_bytes
from ooc.core.memory import reset_peak_rss as reset_hwm
from ooc.core.sizes import format_size
from ooc.executor.loader.pipelines import batches_in_flight, gather_threads
from ooc.executor.loader.presets import Preset, resolve_preset
from ooc.executor.loader.readers import READERS
from ooc.executor.loader.stack import EVAL_SEED_OFFSET, ModeOptions, open_sampler
from ooc.executor.sizing.plan import (
    NEIGHBOR_FRACTION,
    STABILITY,
    DatasetShape,
    MemoryPlan,
    Working,
    compose_plan,
    default_reserve,
    explicit_neighbor_bytes,
    fits,
    requested_cache_bytes,
    smallest_budget,
    suggest_budget,
)
from ooc.executor.sizing.step_memory import step_bytes
from ooc.sampling.link_plan import epoch_plan
from ooc.sampling.pipeline import bytes_per_batch
from ooc.sampling.sampler import NeighborSampler
from ooc.storage import open_dataset
from ooc.storage.features import InMemoryFeatures
from ooc.storage.neighbors import InMemoryNeighbors
from ooc.storage.pagecache import touch_pages

MiB = 1 << 20
#: A step too large to run is charged its estimate times this (the estimate's low end
#: is 0.8x the measured step) plus torch's first-call allocations, so that the
#: budget a refusal suggests runs.
SKIPPED_STEP_FACTOR = 1.25
SKIPPED_STEP_EXTRA = 16 * MiB


# -- the kernels, compiled before anything is measured ------------------------------------------


def compile_kernels(dataset, config, options=None, timeout: float = 600.0,
                    preset=None) -> str:
    """Compile (or find in numba's on-disk cache) every kernel the preset
    (default ``config.mode``) runs, in a child process, so that this process only loads them.

    See :func:`~ooc.core.jit.compile_in_child`: the first run measures what later
    runs do. The child runs :func:`warm_up_kernels` and samples and gathers one small
    batch of the dataset with the mode's uncached paths (the probe's
    kernels, with the dataset's dtypes). Returns how it went, in words; on
    any failure the kernels compile in this process instead.
    """

    preset = resolve_preset(config.mode if preset is None else preset)
    opts = options or _default_options()
    key = (f"train|{preset.readers.name}-{preset.policy.name}|"
           f"{np.dtype(dataset.feature_dtype).str}|{np.dtype(dataset.index_dtype).str}")
    return compile_in_child(key, "ooc.executor.sizing.budget:_child_main", [
        preset.readers.name, preset.policy.name, str(dataset.path),
        ",".join(str(f) for f in config.fanouts), str(config.num_threads or 0),
        str(opts.queue_depth), str(opts.io_threads), opts.io_backend], timeout)


def _default_options():
    return ModeOptions()


def _child_main(argv: list[str]) -> None:
    """``compile_kernels``'s child: READERS POLICY DATA FANOUTS THREADS QUEUE_DEPTH
    IO_THREADS BACKEND (a policy not in :data:`~ooc.caches.policies.POLICIES`
    is warmed up as the base policy; its own kernels then compile in the parent)."""

    readers, policy, path, fanouts, threads, qd, io_threads, backend = argv
    preset = Preset("child", READERS[readers](), POLICIES.get(policy, CachePolicy)())
    ds = open_dataset(path)
    warm_up_kernels(preset, ds.feature_dim, ds.feature_dtype, ds.index_dtype, ds.num_edges)
    opts = _default_options()
    opts.queue_depth, opts.io_threads, opts.io_backend = int(qd), int(io_threads), backend
    src, sampler = open_sampler(ds, preset, opts, [int(f) for f in fanouts.split(",")],
                                int(threads) or None)
    try:
        seeds = np.asarray(ds.train_idx[:8], dtype=np.int64)
        if len(seeds):
            ds.read_labels(seeds)  # the label reader's page kernels
            b = sampler.sample_many([seeds, seeds], [1, 2])[0]
            rows = src.features.read(b.node_ids)
            k = b.node_ids.shape[0]  # a batch's misses into its rows
            src.features.read_into(b.node_ids, rows, np.arange(k, dtype=np.int64))
    finally:
        src.close()


def warm_up_kernels(preset, dim: int, dtype, index_dtype=np.int32, num_edges: int = 0,
                    device: str | None = "cpu") -> None:
    """Compile (or load from numba's on-disk cache) every kernel the preset runs
    after planning, on a tiny in-memory graph, before anything is measured.

    numba compiles a kernel once per argument type, read-only arrays apart: the tiny
    graph's arrays have the types the dataset's have (read-only, ids of ``index_dtype``,
    degree counters of a graph of ``num_edges`` edges), and its neighbor cache holds
    part of it (the selection's tie-break runs) and is checked as a loaded one is.

    On a first run (cold cache) numba compiles a kernel the first time it is
    called; LLVM then needs ~100 MB for a moment. A kernel first called
    mid-epoch, with the caches already full, would push the peak past the
    budget; compiled here, that transient happens while nothing else is held.
    The probe below covers the sampler and the readers; this covers the
    neighbor cache, the feature cache and the policy's own kernels, these run where
    training on ``device`` runs them (the changesets on CUDA load torch's sort and scan
    kernels there, host memory the set-up then holds).
    """
    from ooc.executor.training.activation import warm_up as warm_up_activation

    n = 32
    src = np.arange(4 * n, dtype=np.int64) % n
    dst = (np.arange(4 * n, dtype=np.int64) * 7 + 3) % n
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[order].astype(index_dtype)
    if preset.neighbor_cache:
        indptr.setflags(write=False)  # as the dataset's memmaps are
        indices.setflags(write=False)
        degrees = degree_dtype(num_edges)
        cache = build_neighbor_cache(indptr, indices, full_cache_bytes(indptr, indices.itemsize) // 2,
                                     compute_out_degrees(indices, n, dtype=degrees), degrees)
        cache.check(indptr, "warm-up")
        source = CachedNeighbors(cache, InMemoryNeighbors(np.array(indices)))
        NeighborSampler(indptr, source, [3, 2]).sample_many(
            [np.arange(4, dtype=np.int64), np.arange(4, 8, dtype=np.int64)], [1, 2])
    if preset.policy.caches:
        rows_of = InMemoryFeatures(np.zeros((n, dim), dtype=np.dtype(dtype)), "warm-up")
        fc = FeatureCache(n, 4, dim, rows_of.dtype)
        fc.switch(np.array([0, 1]), rows_of)
        rows, _ = fc.gather(np.array([0, 2, 3]), rows_of)
        fc.update(np.array([2]), np.array([0]), np.array([1]), rows)
    preset.policy.warm_up(n, device)
    warm_up_activation()


def plan_memory(dataset, config, budget: int, options=None, model=None,
                neighbor_fraction: float = NEIGHBOR_FRACTION, reserve: int | None = None,
                preset=None, workers: int = 1, seeds=None) -> MemoryPlan:
    """Measure the working memory of the preset and size its caches.

    Args:
        dataset: an opened dataset.
        config: the :class:`~ooc.executor.training.config.TrainConfig` (mode, fanouts,
            batch sizes, seed, whether it evaluates).
        budget: bytes the process may use.
        options: :class:`~ooc.executor.loader.stack.ModeOptions` (explicit cache sizes
            are kept and count against the budget; superbatch size).
        model: the model to probe a training step (and evaluation) with, on a
            copy; None probes sampling and gathering only.
        neighbor_fraction: share of the free memory for the neighbor cache.
        reserve: bytes held back (default :func:`default_reserve`).
        preset: a preset name, :class:`~ooc.executor.loader.presets.Preset` or cache
            policy (default ``config.mode``).
        workers: the training pipeline's gather threads (each holds its queue and the
            batch it makes: :func:`~ooc.executor.loader.pipelines.batches_in_flight`).
        seeds: what the training pipeline's batches are made of (node ids or a link
            loader's :class:`~ooc.sampling.link_plan.EdgeSeeds`; default the dataset's
            training nodes): the probe samples its first batches.

    Raises:
        OocError: the budget is below what the preset needs (the message gives
            the smallest budget that works, see :func:`suggest_budget`).
    """

    tune_malloc()  # a budget holds only with freed batch arrays returned to the OS
    preset = resolve_preset(config.mode if preset is None else preset)
    opts = options or _default_options()
    budget = int(budget)
    reserve = default_reserve(budget) if reserve is None else int(reserve)
    working = measure_working(dataset, config, opts, model, preset, budget - reserve, workers,
                              seeds)
    shape = DatasetShape.of(dataset, full_neighbor_cache=explicit_neighbor_bytes(preset, opts)
                            is None)
    plan = compose_plan(shape, working, budget, preset, opts, batch_size=config.batch_size,
                        reserve=reserve, neighbor_fraction=neighbor_fraction)
    if not fits(plan, preset, opts):
        raise _refusal(plan, preset, requested_cache_bytes(preset, opts), working.too_large)
    return plan


def measure_working(dataset, config, opts, model, preset, limit: int,
                    workers: int = 1, seeds=None) -> Working:
    """The preset's working memory, measured in this process: ``setup_rss`` (kernels
    loaded, the row map resident), the probed loop's peak above it (:func:`_probe`) and
    the file pages its readers may keep mapped beside it (computed: the probe cannot
    see them). (The node -> feature row map of a dataset stored in a locality order,
    4 bytes a node that an epoch's reads make resident, is made resident before
    ``setup_rss`` is measured, so it is in that.)

    ``limit``: the absolute RSS a probed step must fit under (budget - reserve);
    ``workers``: the training pipeline's gather threads; ``seeds``: as
    :func:`plan_memory`'s.
    """
    kernels = compile_kernels(dataset, config, opts, preset=preset)
    warm_up_kernels(preset, dataset.feature_dim, dataset.feature_dtype,  # loads them here
                    dataset.index_dtype, dataset.num_edges, config.device)
    if dataset.row_of is not None:
        touch_pages(dataset.row_of)
    gc.collect()
    trim_malloc()
    setup = rss_bytes()
    probe = _probe(dataset, config, opts, model, preset, limit=limit,
                   in_flight=batches_in_flight(gather_threads(preset.policy.schedule, workers)),
                   seeds=seeds)
    return Working(setup_rss=setup, loop_peak=max(0, max(probe["peaks"].values()) - setup),
                   mapped_file_pages=preset.readers.mapped_bytes_bound(dataset, opts,
                                                                       probe["max_edges"]),
                   bytes_per_batch=probe["bytes_per_batch"], ids_per_batch=probe["ids_per_batch"],
                   stage_peaks={k: int(v) for k, v in probe["peaks"].items()},
                   step_estimate=probe["step_estimate"], too_large=probe["too_large"],
                   kernels=kernels)


def _refusal(plan: MemoryPlan, preset, extra: int, too_large: str) -> BudgetError:
    """The error for a budget below the plan's working memory, the ``extra`` bytes of
    caches the options request and the reserve; it names the smallest budget that
    works (``too_large``: why a probed step was not run, or empty)."""
    return BudgetError(f"{setting('--memory-budget')} {_fmt(plan.budget)} is below what mode "
                       f"{preset.name} needs: {_fmt(plan.working)} working memory"
                       + (f" + {_fmt(extra)} of requested caches" if extra else "")
                       + f" + {_fmt(plan.reserve)} reserve; {too_large}the smallest budget "
                       f"that works is {plan.min_budget // MiB}MiB")


def _probe(dataset, config, opts, model, preset, limit: int | None = None,
           in_flight: int = batches_in_flight(1), seeds=None) -> dict[str, Any]:
    """Reproduce the loop's fullest moment and measure its peak RSS (absolute).

    Returns ``peaks`` (``sample``, ``train_loop``, ``eval_loop`` when the
    config evaluates), ``bytes_per_batch`` (runtime files), ``ids_per_batch``,
    ``max_edges`` (the most sampled edges of one batch) and ``step_estimate``.

    A step whose computed estimate (:func:`.step_memory.step_bytes`) does not fit
    under ``limit`` (absolute RSS) is not run: its estimate is charged instead, and
    ``too_large`` says why (the planner then refuses the budget).
    """

    preset.readers.before_probe(dataset)
    src, sampler = open_sampler(dataset, preset, opts, config.fanouts, config.num_threads)
    peaks: dict[str, int] = {}
    try:
        hold = _Holder(sampler, src.features, model, dataset, peaks, limit, in_flight,
                       preset.policy.mate_fraction(dataset.row_pages()))
        batches = hold(dataset.train_idx if seeds is None else seeds, config.batch_size,
                       config.seed, 1, True,
                       "sample", "train_loop", "--batch-size")
        bpb = bytes_per_batch(batches, len(config.fanouts), with_changesets=True)
        max_edges = max(int(sum(b.num_sampled_edges)) for b in batches)
        ids_per_batch = float(np.mean([b.num_nodes for b in batches]))
        del batches
        # a loader's settings (no model) have no evaluation
        if model is not None and (config.eval_final or config.eval_every <= config.epochs):
            split = max((dataset.val_idx, dataset.test_idx), key=len)
            if len(split):
                hold(split, config.eval_batch_size or config.batch_size,
                     config.seed + EVAL_SEED_OFFSET, 0, False, None, "eval_loop",
                     "--eval-batch-size")
                peaks["eval_loop"] += _training_state_bytes(model)
    finally:
        src.close()
        preset.readers.after_probe(dataset)
        gc.collect()
        trim_malloc()
    return {"peaks": peaks, "bytes_per_batch": bpb, "ids_per_batch": ids_per_batch,
            "max_edges": max_edges, "step_estimate": hold.estimate, "too_large": hold.too_large}


class _Holder:
    """Holds what the pipeline holds at its fullest (``in_flight`` batches sampled
    and gathered, one step on the largest) and records the peak RSS; a step whose
    computed estimate does not fit under ``limit`` is refused instead of run."""

    def __init__(self, sampler, features, model, dataset, peaks: dict[str, int],
                 limit: int | None = None, in_flight: int = batches_in_flight(1),
                 mates: float = 0.0):
        self.sampler, self.features, self.model = sampler, features, model
        self.dataset, self.peaks, self.limit = dataset, peaks, limit
        self.in_flight = int(in_flight)
        #: page-mate rows the gather thread holds from a batch's read to the cache update,
        #: as a fraction of the batch's rows
        self.mates = float(mates)
        self.estimate: dict[str, int] = {}
        #: why a step was not run (its estimate did not fit), for the refusal
        self.too_large = ""

    def sample(self, ids, bs: int, seed: int, epoch: int, shuffle: bool) -> list:
        """The first ``in_flight`` sampled batches of ``bs`` seeds of that epoch."""

        return self.sampler.sample_many(*epoch_plan(ids, bs, seed, epoch, shuffle)
                                        .first(self.in_flight))

    def __call__(self, ids, bs: int, seed: int, epoch: int, shuffle: bool,
                 key_sample: str | None, key_loop: str, option: str) -> list:
        """``option``: the batch-size option of these batches (``--batch-size`` trains,
        ``--eval-batch-size`` evaluates)."""
        ok = reset_hwm()
        batches = self.sample(ids, bs, seed, epoch, shuffle)
        if key_sample:
            self.peaks[key_sample] = hwm_bytes() if ok else rss_bytes()
        train = option == "--batch-size"
        big = int(np.argmax([b.num_nodes for b in batches]))
        # the largest batch's rows are read (the reader's buffers grow as in the loop); the
        # others are held as rows of their shape: the same memory, without their reads
        dim, dtype = self.features.shape[1], self.features.dtype
        rows = [self.features.read(b.node_ids) if i == big
                else np.ones((b.num_nodes, dim), dtype=dtype) for i, b in enumerate(batches)]
        if train and self.mates:  # the gather thread's page-mate rows, until the update
            rows.append(np.ones((int(self.mates * batches[big].num_nodes), dim), dtype=dtype))
        if self.model is not None and self._fits(batches[big], (ids, bs, seed, epoch, shuffle),
                                                 option, train, key_loop):
            _probe_step(self.model, batches[big], rows[big], self.dataset, train=train)
        if key_loop not in self.peaks:
            self.peaks[key_loop] = hwm_bytes() if ok else rss_bytes()
        del rows
        gc.collect()
        trim_malloc()
        return batches

    def _step_bytes(self, batch, train: bool):
        return step_bytes(self.model, batch.num_sampled_nodes, batch.num_sampled_edges,
                          int(batch.num_seeds), train=train)

    def _fits(self, batch, epoch_args: tuple, option: str, train: bool, key_loop: str) -> bool:
        """Whether to run the step: its computed estimate fits beside what is held now,
        or the budget is below what is held already and the step is no larger than that
        (measured; the budget is refused later either way). Otherwise its peak is charged
        as held + the estimate (:data:`SKIPPED_STEP_FACTOR`, :data:`SKIPPED_STEP_EXTRA`),
        and, when some room is left, ``too_large`` says what the step needs and the
        largest batch size that would fit."""
        est = self._step_bytes(batch, train)
        if est is None:
            return True
        if train or not self.estimate:
            self.estimate = {**asdict(est), "total": est.total, "batch_nodes": int(batch.num_nodes)}
        held = rss_bytes()
        if self.limit is None or held + est.total <= self.limit:
            return True
        if held >= self.limit and est.total <= held:
            return True  # the budget is below what is held already: measure, refuse later
        self.peaks[key_loop] = max(hwm_bytes(), held + int(SKIPPED_STEP_FACTOR * est.total)
                                   + SKIPPED_STEP_EXTRA)
        if held >= self.limit:
            return False
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in asdict(est).items() if v)
        # 10% below the room: another run holds a little more or samples larger batches
        fit = self._largest_batch(epoch_args, train, int(0.9 * (self.limit - held)))
        what = "training step" if train else "evaluation forward"
        self.too_large = self.too_large or (
            f"one {what} on a batch of {epoch_args[1]} seeds ({batch.num_nodes:,} nodes) needs "
            f"about {_fmt(est.total)} ({parts}); "
            + (f"{setting(option)} {fit} would fit; at {setting(option)} {epoch_args[1]} "
               if fit >= 1 else
               f"not even one seed would fit (use a smaller {setting('--hidden')} or fewer "
               f"classes); "))
        return False

    def _largest_batch(self, epoch_args: tuple, train: bool, room: int) -> int:
        """The largest batch size below the given one whose sampled batches' step
        estimates all fit in ``room`` bytes (0: none), by bisection."""
        ids, bs, seed, epoch, shuffle = epoch_args
        lo, hi = 0, bs - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            need = max(self._step_bytes(b, train).total
                       for b in self.sample(ids, mid, seed, epoch, shuffle))
            lo, hi = (mid, hi) if need <= room else (lo, mid - 1)
        return lo


def _training_state_bytes(model) -> int:
    """What training keeps on the host between steps, and so while it evaluates: Adam's
    two moments and the last step's gradients of every trainable CPU parameter."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters()
                   if p.requires_grad and p.device.type == "cpu")


def _probe_step(model, batch, rows, dataset, train: bool = True) -> None:
    """One training step with Adam (``train``) or one no-grad forward in eval mode on
    ``model`` itself (:mod:`ooc.executor.training.step`), so no copy of a large model
    is held: Adam's learning rate is 0, so the weights stay as they are; gradients,
    buffers, the train/eval mode and the RNG state are put back."""
    import torch

    from ooc.executor.loader.batch import to_data
    from ooc.executor.training.step import eval_forward, model_call, train_step

    state = torch.get_rng_state()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    was_training = model.training
    try:
        for p in params:
            p.grad = None
        ids = np.asarray(batch.node_ids, dtype=np.int64)
        y = dataset.read_labels(ids[:int(batch.num_seeds)])
        data = to_data(batch, rows, y).to(params[0].device if params else "cpu")
        call = model_call(model)
        if train:
            model.train()
            opt = torch.optim.Adam([p for p in params if p.requires_grad], lr=0.0)
            train_step(call, opt, _probe_loss, data)
            del opt
        else:
            model.eval()
            eval_forward(call, data).argmax(-1)
        del data, call
    finally:
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            for k, b in model.named_buffers():
                b.copy_(buffers[k])
        model.train(was_training)
        torch.set_rng_state(state)


def _probe_loss(out, y):
    """The probe step's loss: cross-entropy over the labels within the output's width; a
    zero-weighted sum when there are none (a link encoder's embeddings, unlabelled seeds),
    so that the backward pass runs, and is measured, either way."""
    import torch

    from ooc.executor.training.step import default_loss

    y = torch.where(y < out.shape[-1], y, torch.full_like(y, -1))
    return default_loss(out, y) if bool((y >= 0).any()) else out.sum() * 0.0


def _fmt(nbytes: float) -> str:
    return format_size(nbytes)


def child_peak_rss() -> int:
    """Peak RSS of waited-for children (ru_maxrss of RUSAGE_CHILDREN), bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


__all__ = ["MemoryPlan", "NEIGHBOR_FRACTION", "STABILITY", "anon_rss_bytes", "child_peak_rss",
           "compile_kernels", "default_reserve", "hwm_bytes", "measure_working", "plan_memory",
           "reset_hwm", "rss_bytes", "smallest_budget", "suggest_budget"]

if os.name != "posix":  # pragma: no cover
    raise ImportError("ooc.executor.sizing.budget needs /proc (Linux)")
