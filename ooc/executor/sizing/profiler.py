"""Offline profiler: cache and superbatch sizes from a short measured run (Ginex §3.5).

``profile(dataset, config, options, budget)`` runs, in this process:

1. **The memory plan** — :func:`ooc.executor.sizing.budget.plan_memory`, the very code
   ``python -m ooc.train --memory-budget`` runs (auto sizing): setup RSS, the
   peak of the loop's fullest moment (batches in flight gathered, one
   training step, evaluation), the computed parts (cache tables, build
   transients, the superbatch in flight). It gives the recommended cache
   bytes and the superbatch size; a budget too small fails with the smallest
   budget that works.
2. **The stages with the recommended sizes** — the mode is built exactly as
   training builds it (:func:`ooc.executor.loader.stack.build_stack`, so the neighbor
   cache is built and saved once and training reuses it), then timed on the
   first ``trace_batches`` batches of epoch 1 (the same seeds training uses):
   superbatch sampling and its runtime files (bytes per batch measured on the
   written files), the changeset pass (peak RSS; CUDA peak memory when a GPU
   is present), loading the runtime files, the cache switch, gather with the
   Belady feature cache (read seconds per missed row, seconds per lookup),
   cache updates, and a few training steps (convert + transfer + compute).
   Each stage's wall and process-CPU seconds are recorded, and its peak RSS.
3. **The epoch training will run, simulated** (:func:`simulate_epoch`): the
   whole of epoch 1 is sampled (the seeds training uses; ``trace_batches``
   caps it) and the mode's cache replayed over it: for ``ooc`` the very
   changeset code training runs, superbatches of the recommended size, the
   cache carried from one to the next, each switch's reads counted apart.
   The predicted miss ratio is its gather misses over lookups, what
   training reports. **Miss-ratio curves** repeat it at 1%..100% of the
   feature table (``ooc`` at this superbatch size, the static
   degree-ordered cache, LRU for reference).
4. **A rehearsal** (:mod:`ooc.executor.sizing.rehearsal`): the epoch's first batches
   trained with the recommended sizes as training runs them (the same stack and loader,
   the stages sharing the cores), from a cold page cache.
5. **The expected times**: the rehearsal extrapolated (:func:`extrapolate_epoch`: its
   warm-up and steady seconds per batch, corrected by the simulated device reads of
   :func:`device_reads`) to the first epoch and to a later one (the cache kept), and
   the run of ``config.epochs`` epochs with the stack's build (:func:`run_time`); the
   stage model (:func:`predict_epoch`, each stage timed alone, overlapped on paper) is
   reported beside them.

The report (a JSON-friendly dict) carries the measurements, the
recommendation, the arithmetic as text lines, the curves, and ``sizes`` — the
part ``python -m ooc.train --sizes sizes.json`` reads (:func:`load_sizes`).
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.caches import miss_curves as P
from ooc.caches.changesets import precompute_changesets
from ooc.caches.feature_cache import row_cost
from ooc.caches.miss_curves import lru_stack_distances
from ooc.caches.policies import BeladyCache, StaticCache, degree_order
from ooc.core.errors import InvalidValue, IOFailure, NotFound, OocError
from ooc.core.sizes import format_size
from ooc.executor.loader.pipelines import PREFETCH
from ooc.executor.loader.presets import resolve_preset
from ooc.executor.loader.packing import predict_packing
from ooc.executor.loader.stack import build_stack, disk_rates
from ooc.executor.sizing.budget import default_reserve, hwm_bytes, plan_memory, reset_hwm, rss_bytes
from ooc.executor.sizing.rehearsal import rehearsal_shape, rehearse, warm_batches
from ooc.sampling.epoch_plan import EpochPlan
from ooc.sampling.runtime import (
    FlatChangesets,
    SuperbatchSamples,
    read_changesets,
    read_samples,
    remove_superbatch,
    write_changesets,
    write_samples,
)
from ooc.storage.layout import PAGE
from ooc.storage.pagecache import drop_page_cache

#: Cache sizes of the miss-ratio curves, as fractions of the feature table.
CURVE_FRACTIONS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
                   0.7, 0.8, 0.9, 1.0)
#: Version of the ``sizes`` block read by ``ooc.train --sizes``.
SIZES_VERSION = 1
MiB = 1 << 20


def _fmt(n: float) -> str:
    return format_size(n)


class _Stage:
    """Wall seconds, process CPU seconds and peak RSS of a block."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.peak = 0
        self.count = 0

    def __enter__(self) -> "_Stage":
        gc.collect()
        self._hwm = reset_hwm()
        self._t, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._t
        self.cpu += time.process_time() - self._c
        self.peak = max(self.peak, hwm_bytes() if self._hwm else rss_bytes())


# -- the sizes file ------------------------------------------------------------------------------


def sizes_block(dataset, config, plan, options=None) -> dict[str, Any]:
    """What ``ooc.train --sizes`` applies: the recommended cache bytes and superbatch size,
    and the read gap the profile read with (``options.read_gap``)."""
    return {"version": SIZES_VERSION, "mode": config.mode,
            "feature_cache_size": int(plan.feature_cache_bytes),
            "neighbor_cache_size": int(plan.neighbor_cache_bytes),
            "superbatch_size": int(plan.superbatch_size) if plan.superbatch_size else None,
            "read_gap": None if options is None else int(options.read_gap),
            "memory_budget": int(plan.budget),
            "dataset": {"path": str(Path(dataset.path).resolve()), "num_nodes": dataset.num_nodes,
                        "num_edges": dataset.num_edges, "feature_dim": dataset.feature_dim},
            "batch_size": config.batch_size, "fanouts": list(config.fanouts)}


def load_sizes(path: str | os.PathLike, dataset=None) -> dict[str, Any]:
    """The ``sizes`` block of a profiler report (or a bare sizes file).

    Raises:
        OocError: unreadable or invalid file, or made for another dataset.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise NotFound(f"{p}: sizes file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise IOFailure(f"{p}: cannot read sizes file ({getattr(e, 'strerror', None) or e})") \
            from None
    except json.JSONDecodeError as e:
        raise InvalidValue(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise InvalidValue(f"{p}: nested too deeply to be a sizes file") from None
    s = doc.get("sizes", doc) if isinstance(doc, dict) else None
    if not isinstance(s, dict) or s.get("version") != SIZES_VERSION:
        raise InvalidValue(f"{p}: not a sizes file of python -m ooc.size (no 'sizes' block of "
                       f"version {SIZES_VERSION})")
    for key in ("feature_cache_size", "neighbor_cache_size", "read_gap"):
        v = s.get(key)
        if key == "read_gap" and v is None:  # optional: sizes files before it
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidValue(f"{p}: sizes.{key} must be a non-negative integer, got {v!r}")
    sb = s.get("superbatch_size")
    if sb is not None and (not isinstance(sb, int) or isinstance(sb, bool) or sb < 1):
        raise InvalidValue(f"{p}: sizes.superbatch_size must be a positive integer, got {sb!r}")
    ds = s.get("dataset") or {}
    if dataset is not None and ds.get("num_nodes") not in (None, dataset.num_nodes):
        raise InvalidValue(f"{p}: sizes were profiled on a dataset of {ds.get('num_nodes'):,} nodes; "
                       f"{dataset.path} has {dataset.num_nodes:,}")
    return s


# -- the epoch-time model --------------------------------------------------------------------


def _superbatch_epoch(nb: int, superbatch_size: int | None, w: dict, c: dict,
                      switch_s: float, cores: int) -> dict[str, Any]:
    s = max(1, min(int(superbatch_size or nb), nb))
    k = -(-nb // s)
    startup = s * (w["sample"] + w["changesets"])
    rest = nb - s
    terms = {"compute_thread": nb * w["compute"],
             "gather_thread": nb * (w["gather"] + w["load"]),
             "inspector_threads": rest * (w["sample"] + w["changesets"]),
             "cpu_bound": (nb * (c["compute"] + c["gather"] + c["load"])
                           + rest * (c["sample"] + c["changesets"])) / cores}
    overlap = max(terms.values())
    return {"superbatches": k, "startup_s": startup, "overlapped_s": overlap,
            "switches_s": k * switch_s, "terms_s": terms,
            "formula": "startup S*(sample+changesets) + max(terms) + superbatches*switch",
            "epoch_s": startup + overlap + k * switch_s}


def _on_demand_epoch(nb: int, superbatch_size: int | None, w: dict, c: dict,
                     switch_s: float, cores: int) -> dict[str, Any]:
    terms = {"compute_thread": nb * w["compute"],
             "pipeline_thread": nb * (w["sample"] + w["gather"]),
             "cpu_bound": nb * (c["compute"] + c["sample"] + c["gather"]) / cores}
    return {"terms_s": terms, "formula": "max(terms)", "epoch_s": max(terms.values())}


#: The epoch-time model of each schedule (see :func:`predict_epoch`).
EPOCH_MODELS = {"superbatch": _superbatch_epoch, "on_demand": _on_demand_epoch}


def predict_epoch(preset, num_batches: int, superbatch_size: int | None,
                  per_batch: dict[str, tuple[float, float]], switch_s: float,
                  cores: int) -> dict[str, Any]:
    """Expected seconds of one training epoch from per-batch stage costs.

    Args:
        preset: a preset name, preset or cache policy (its schedule picks the model).
        per_batch: stage -> (wall seconds, process-CPU seconds) per batch, for
            ``sample`` (sampling + writing runtime files; on-demand schedule:
            sampling only), ``changesets``, ``load``, ``gather`` (at the
            predicted miss ratio, updates included) and ``compute``
            (convert + transfer + forward/backward/step).
        switch_s: seconds of one cache switch (superbatch schedule, per superbatch).
        cores: CPUs the process may use.

    Superbatch schedule (``ooc``): the first superbatch is sampled and its
    changesets computed before training starts (``startup``); then the main
    loop runs ``num_batches`` batches while the inspector prepares the rest.
    Its threads overlap, so that part takes the longest of (the main thread's
    compute, the gather thread's gather + load, the inspector's sampling +
    changesets, all their CPU seconds over the cores), plus one switch per
    superbatch. On-demand schedule (``static``, ``baseline``): sampling and
    gather run on the pipeline thread beside the compute thread: the longer of
    the two, or the CPU bound.
    """

    schedule = resolve_preset(preset).policy.schedule
    w = {k: v[0] for k, v in per_batch.items()}
    c = {k: v[1] for k, v in per_batch.items()}
    nb = int(num_batches)
    out: dict[str, Any] = {"num_batches": nb, "cores": cores}
    out.update(EPOCH_MODELS[schedule](nb, superbatch_size, w, c, switch_s, cores))
    return out


def extrapolate_epoch(num_batches: int, superbatch_size: int | None, rehearsal,
                      reads: dict[str, Any], startup_s: float = 0.0) -> dict[str, Any]:
    """Expected seconds of one training epoch from a rehearsal of its first batches
    (:class:`~ooc.executor.sizing.rehearsal.Rehearsal`), which ran the stages together
    as training runs them.

    ``epoch = warm-up x W / W_r + (num_batches - W) x (steady + reads x busy)``, where
    ``W`` is the epoch's warm-up (its first superbatch of ``superbatch_size``, else its
    first batch) and ``W_r`` the rehearsal's:

    - ``warm-up``: the rehearsal's seconds to the end of its warm-up, scaled by
      ``W / W_r`` (the first superbatch's sampling, changesets, cache fill and batches
      grow with it);
    - ``steady``: the rehearsal's seconds per batch after its warm-up;
    - ``reads``: the epoch's device reads per batch after its warm-up minus the
      rehearsal's (``reads``: ``epoch_per_batch``, ``rehearsal_per_batch``,
      ``seconds_each``; see :func:`device_reads`), times the seconds each;
    - ``busy``: the share of the rehearsal's steady part the thread making batches was
      busy (reads an idle producer hides cost nothing).

    A later epoch starts with the cache the previous one left (no fill): ``later_epoch_s
    = startup_s + num_batches x (steady + later reads x busy)``, with ``startup_s`` the
    seconds before its first batch (the first superbatch's sampling and changesets) and
    the reads per batch of the traced epoch's second half (``reads["later_per_batch"]``).
    """

    r = rehearsal
    nb = int(num_batches)
    w = warm_batches(nb, superbatch_size)
    each, base = reads["seconds_each"], reads["rehearsal_per_batch"]
    more = (reads["epoch_per_batch"] - base) * each
    terms = {"warm_up": r.warm_s * w / max(r.warm_batches, 1),
             "steady": (nb - w) * r.steady_s,
             "reads": (nb - w) * more * r.steady_busy}
    later_reads = reads.get("later_per_batch", reads["epoch_per_batch"])
    later = startup_s + nb * max(0.0, r.steady_s + (later_reads - base) * each * r.steady_busy)
    return {"num_batches": nb, "warm_batches": w, "terms_s": terms, "rehearsal": r.as_dict(),
            "reads": reads,
            "formula": "warm_up x W / W_r + (num_batches - W) x (steady + reads x busy)",
            "epoch_s": max(r.warm_s, sum(terms.values())), "later_epoch_s": later,
            "later_startup_s": startup_s}


def run_time(build_s: float, first_s: float, later_s: float, epochs: int) -> dict[str, Any]:
    """Expected seconds of a training run of ``epochs`` epochs: the stack's build (a
    static cache's fill, a saved neighbor cache's load), the first epoch (a superbatch
    cache fills during it), then the later ones."""
    e = max(1, int(epochs))
    return {"epochs": e, "build_s": build_s, "first_epoch_s": first_s,
            "later_epoch_s": later_s, "total_s": build_s + first_s + (e - 1) * later_s}


def device_reads(dataset, preset, batches: list, rehearsal, superbatch_size: int | None,
                 capacity: int, page_cache_bytes: int, hot_order: np.ndarray | None = None,
                 device: str = "cpu", epoch_reads: int | None = None) -> dict[str, Any]:
    """Reads from the device per batch after the warm-up, in the traced epoch
    (``batches``, :class:`~ooc.sampling.sampler.SampledBatch` in order, superbatches of
    ``superbatch_size``) and in the rehearsal (its first ``rehearsal.batches``, its
    superbatch size), and the seconds one costs.

    O_DIRECT readers read the feature rows their cache of ``capacity`` rows misses plus
    those its switches load (the preset's policy replayed, :func:`simulate_epoch`), each
    costing the rehearsal's steady feature-read seconds over its steady reads. Readers
    through the kernel's page cache (``preset.readers.page_cache``) read a page only
    when the page cache has dropped it: the pages of each batch's feature rows (4 KiB,
    or one row when rows are larger; in stored order) and of its sampled nodes'
    neighbour lists, through one LRU of ``page_cache_bytes`` (what a memory cgroup at
    the budget leaves beside the process), each costing the rehearsal's steady seconds
    of the thread that samples and gathers over its steady page reads.

    ``epoch_reads``: the O_DIRECT reads of the whole trace at ``superbatch_size`` when
    the caller has simulated them already (misses plus switch reads); each prefix is
    simulated once.
    """

    trace = [np.asarray(b.node_ids, dtype=np.int64) for b in batches]
    if resolve_preset(preset).readers.page_cache:
        per_batch = _page_cache_misses(dataset, batches, page_cache_bytes)

        def count(tr: list, sb: int | None) -> int:
            return int(per_batch[:len(tr)].sum())
        name, seconds = "page", rehearsal.steady_busy * rehearsal.steady_s * \
            rehearsal.steady_batches
    else:
        known: dict[tuple[int, int | None], int] = {}
        if epoch_reads is not None:
            known[len(trace), superbatch_size] = int(epoch_reads)

        def count(tr: list, sb: int | None) -> int:
            if (len(tr), sb) not in known:
                r = simulate_epoch(preset, tr, dataset.num_nodes, capacity, sb,
                                   hot_order=hot_order, device=device,
                                   pages=dataset.row_pages())
                known[len(tr), sb] = int(r["misses"] + r["switch_reads"])
            return known[len(tr), sb]
        name, seconds = "row", rehearsal.steady_read_s

    def steady(tr: list, warm: int, sb: int | None) -> float:
        return (count(tr, sb) - count(tr[:warm], sb)) / (len(tr) - warm) if len(tr) > warm \
            else 0.0

    k = min(int(rehearsal.batches), len(trace))
    epoch = steady(trace, warm_batches(len(trace), superbatch_size), superbatch_size)
    rehearsed = steady(trace[:k], int(rehearsal.warm_batches), rehearsal.superbatch_size)
    each = seconds / max(rehearsed * rehearsal.steady_batches, 1.0)
    # a later epoch: the reads of the trace's second half (whole superbatches before it),
    # once the first superbatches have filled the cache
    half = -(-(len(trace) // 2) // (superbatch_size or 1)) * (superbatch_size or 1)
    later = steady(trace, half, superbatch_size) if 0 < half < len(trace) else epoch
    return {"unit": name, "epoch_per_batch": epoch, "rehearsal_per_batch": rehearsed,
            "later_per_batch": later, "seconds_each": each}


def _page_cache_misses(dataset, batches: list, cache_bytes: int) -> np.ndarray:
    """Pages each batch reads through an LRU page cache of ``cache_bytes`` (int64
    [len(batches)]): its feature rows' (4 KiB pages, or a row each when rows are larger:
    the unit the cache is counted in) and the first and last page of each sampled node's
    neighbour list in ``indices.bin`` (a longer list is sampled, not read whole)."""

    row_bytes = dataset.layout.row_bytes
    unit = max(PAGE, row_bytes)
    base = -(-dataset.num_nodes * row_bytes // unit)  # neighbour pages after the rows'
    isz = dataset.indices.dtype.itemsize
    pages = []
    for b in batches:
        ids = np.asarray(b.node_ids, dtype=np.int64)
        rows = ids if dataset.row_of is None else np.asarray(dataset.row_of[ids], np.int64)
        targets = ids[:int(sum(b.num_sampled_nodes[:-1]))]
        lo = np.asarray(dataset.indptr[targets], dtype=np.int64) * isz
        hi = np.maximum(np.asarray(dataset.indptr[targets + 1], dtype=np.int64) * isz - 1, lo)
        pages.append(np.unique(np.concatenate([rows * row_bytes // unit,
                                               base + lo // PAGE, base + hi // PAGE])))
    missed = lru_stack_distances(pages) >= max(0, int(cache_bytes)) // unit
    at = np.concatenate([[0], np.cumsum(missed)])[np.cumsum([0] + [len(p) for p in pages])]
    return np.diff(at).astype(np.int64)


# -- the schedule training runs, simulated -------------------------------------------------


def simulate_epoch(preset, trace: list[np.ndarray], num_nodes: int, capacity: int,
                   superbatch_size: int | None = None, hot_order: np.ndarray | None = None,
                   device: str = "cpu", pages=None) -> dict[str, int]:
    """Feature-cache misses of one training epoch, counted as the trainer counts them:
    the preset's policy replayed over ``trace`` (see
    :meth:`ooc.caches.policies.CachePolicy.simulate`).

    Args:
        preset: a preset name, preset or cache policy.
        trace: the epoch's batches in order, each the int64 node ids one batch
            gathers (``SampledBatch.node_ids``).
        capacity: feature-cache rows.
        superbatch_size: batches per superbatch (superbatch schedule).
        hot_order: node ids by decreasing out-degree (static policy).
        pages: the dataset's :meth:`~ooc.storage.dataset.Dataset.row_pages` (page-mates).
    """

    return resolve_preset(preset).policy.simulate(trace, num_nodes, capacity, superbatch_size,
                                                  hot_order=hot_order, device=device, pages=pages)


def miss_curves(trace: list[np.ndarray], num_nodes: int, superbatch_size: int,
                hot_order: np.ndarray, capacities: np.ndarray, device: str = "cpu",
                pages=None) -> dict[str, Any]:
    """Miss ratios of the epoch ``trace`` at each capacity (rows).

    ``ooc``: the Belady schedule at this superbatch size with the hot ids counted as used
    after each superbatch, as training runs it (gather misses, what training reports;
    ``ooc_with_switch`` adds the switches' reads);
    ``static_degree``: the degree-ordered static cache; ``lru``: LRU from a cold
    start over the whole trace, for reference.
    """

    caps = np.asarray(capacities, dtype=np.int64)
    acc = max(1, int(sum(len(t) for t in trace)))
    belady, static = BeladyCache(), StaticCache()
    ooc, ooc_sw, stat = [], [], []
    for c in caps:
        r = belady.simulate(trace, num_nodes, int(c), superbatch_size, hot_order=hot_order,
                            device=device, pages=pages)
        ooc.append(r["misses"] / acc)
        ooc_sw.append((r["misses"] + r["switch_reads"]) / acc)
        stat.append(static.simulate(trace, num_nodes, int(c), hot_order=hot_order)["misses"] / acc)
    lru = [float(v) / acc for v in P.miss_curve_lru(trace, caps)]
    return {"ooc": ooc, "ooc_with_switch": ooc_sw, "static_degree": stat, "lru": lru,
            "accesses": acc}


# -- the profile ------------------------------------------------------------------------------


@dataclass
class _Shape:
    """The epoch and the part of it the profile looks at (batches)."""

    nb: int        # batches per epoch
    S: int         # superbatch size (the epoch when there are no superbatches)
    T: int         # batches traced (rates, simulation, curves)
    S0: int        # the superbatch the stages are timed on

    @classmethod
    def of(cls, nb: int, plan, trace_batches: int | None) -> "_Shape":
        S = int(plan.superbatch_size or nb)
        T = max(1, min(int(trace_batches or nb), nb))
        return cls(nb, S, T, max(1, min(S, T)))


@dataclass
class _Measured:
    """What the stages measured with the recommended sizes."""

    stages: dict[str, _Stage]
    build: _Stage
    reader_backend: str | None
    trace: list
    batches: list
    ids_per_batch: float
    runtime: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    misses: int = 0
    lookups: int = 0
    switched: int = 0
    read_switch: float = 0.0
    read_gather: float = 0.0
    gather_batches: int = 0
    step_s: tuple[float, float] = (0.0, 0.0)
    #: batches the timed changeset passes covered, and the pass for the next superbatch
    changeset_batches: int = 0
    next_changesets: Callable[[list], Any] | None = None


def profile(dataset, config, options, budget: int, reserve: int | None = None,
            trace_batches: int | None = None, compute_steps: int = 6,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Profile ``config.mode`` on ``dataset`` under ``budget`` bytes; return the report.

    Args:
        dataset: an opened dataset.
        config: :class:`~ooc.executor.training.config.TrainConfig` (mode, model, fanouts, ...).
        options: :class:`~ooc.executor.loader.stack.ModeOptions` (runtime disk budget,
            queue depth, runtime dir; explicit cache sizes are kept).
        budget: memory budget, bytes.
        reserve: headroom bytes (default :func:`~ooc.executor.sizing.budget.default_reserve`).
        trace_batches: batches sampled for the rates and curves (default: the
            superbatch size, at most 128, at most the epoch).
        compute_steps: training steps timed (the first is warm-up, not counted).

    Raises:
        OocError: the budget is below the working memory (with the smallest
            budget that can work).
    """
    import torch


    t_start = time.perf_counter()
    config.validate()
    preset = resolve_preset(config.mode)
    model, optimizer, device = _model_for(dataset, config)
    reserve = default_reserve(int(budget)) if reserve is None else int(reserve)
    log(f"ooc.size: memory plan (the same code as ooc.train --memory-budget) under "
        f"{_fmt(budget)}")
    plan = plan_memory(dataset, config, int(budget), options, model=model, reserve=reserve,
                       preset=preset)
    epoch1 = EpochPlan(dataset.train_idx, config.batch_size, config.seed, 1)
    shape = _Shape.of(len(epoch1), plan, trace_batches)
    gpu = {"available": bool(torch.cuda.is_available())}
    m = _measure(dataset, config, options, plan, preset, shape, epoch1, gpu,
                 (model, optimizer, device, compute_steps), log)
    reh = _rehearse(dataset, config, options, plan, preset, shape, epoch1,
                    (model, optimizer, device), log)
    log(f"ooc.size: simulating the {preset.name} schedule over {shape.T} batches (cache "
        f"carried across superbatches of {shape.S}) and the miss-ratio curves")
    sim, curves, sim_hot = _simulate(dataset, preset, plan, shape, m, gpu)
    rates = _rates(m, sim, shape, preset)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    staged = predict_epoch(preset, shape.nb, shape.S, rates["per_batch"], rates["switch_s"], cores)
    reads = device_reads(dataset, preset, m.batches, reh, plan.superbatch_size,
                         int(plan.feature_cache_rows), int(budget) - plan.working,
                         hot_order=sim_hot, device="cuda" if gpu["available"] else "cpu",
                         epoch_reads=sim["misses"] + sim["switch_reads"])
    packing = _packing(dataset, preset, options, plan, shape, m, sim_hot, log) \
        if preset.policy.schedule == "superbatch" and plan.feature_cache_rows else None
    del sim_hot  # 8 bytes per node
    epoch = _expected_times(plan, shape, rates, reh, reads, config.epochs)
    epoch["stage_model"] = staged
    arith = _arithmetic(dataset, preset, options, plan, budget, reserve, shape, m, rates, epoch)
    report = _report(dataset, config, preset, options, plan, budget, reserve, shape, m, sim,
                     curves, rates, epoch, arith, device)
    report["packing"] = packing
    report["profile_s"] = time.perf_counter() - t_start
    return report


def _packing(dataset, preset, options, plan, shape: _Shape, m: _Measured, hot: np.ndarray,
             log: Callable[[str], None]) -> dict[str, Any] | None:
    """The disk's seconds of the traced epoch's misses read directly and packed
    (:func:`~ooc.executor.loader.packing.predict_packing` at the disk's measured rates),
    which the ``auto`` preset would pick per window and why; None where reads do not
    bypass the page cache (nothing to measure)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rates-", dir=Path(options.runtime_dir)
                                   if options.runtime_dir else Path(dataset.path)))
    try:
        info: dict[str, Any] = {}
        rates = disk_rates(dataset, options, folder, info)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if rates is None:
        return None
    cap = int(plan.feature_cache_rows)
    policy = preset.policy
    fn = policy.changesets(dataset.num_nodes, cap, "cpu", None, np.sort(hot[:cap]))
    row_of = dataset.row_of

    def rows_of(ids: np.ndarray) -> np.ndarray:
        return ids if row_of is None else np.asarray(row_of[ids], dtype=np.int64)

    out = predict_packing(m.trace, fn, shape.S, rows_of, dataset.num_nodes,
                          dataset.layout.row_bytes, options.read_gap, rates,
                          getattr(policy, "window_rows", 1 << 23))
    out["rates"] = info["disk_rates"]
    scale = shape.nb / max(1, len(m.trace))
    d, pk = out["direct_s"] * scale, out["packed_s"] * scale
    pick = "packed" if pk < d else "direct"
    log(f"ooc.size: the epoch's {out['miss_rows'] * scale:,.0f} missed rows cost the disk "
        f"{d:.1f} s read directly (random reads at {1 / rates.op_s:,.0f} a second) and "
        f"{pk:.1f} s packed (sweeps at {PAGE / rates.page_s / 1e6:,.0f} MB/s, segments written "
        f"at {rates.write_bps / 1e6:,.0f} MB/s and read back): {pick} is faster; per window, "
        f"auto packs {out['windows_packed']} of {out['windows']}")
    out.update(direct_epoch_s=d, packed_epoch_s=pk, auto_epoch_s=out["auto_s"] * scale,
               pick=pick)
    return out


def _expected_times(plan, shape: _Shape, rates: dict, reh, reads: dict, epochs: int
                    ) -> dict[str, Any]:
    """The first and later epochs (:func:`extrapolate_epoch`) and the run of ``epochs``
    epochs (:func:`run_time`); a later epoch starts by sampling its first superbatch and
    computing its changesets, at the stage rates."""
    pb = rates["per_batch"]
    startup = 0.0
    if plan.superbatch_size:
        startup = min(plan.superbatch_size, shape.nb) * (pb["sample"][0] + pb["changesets"][0])
    epoch = extrapolate_epoch(shape.nb, plan.superbatch_size, reh, reads, startup_s=startup)
    epoch["run"] = run_time(reh.build_s, epoch["epoch_s"], epoch["later_epoch_s"], epochs)
    return epoch


def compare_presets(dataset, config, options, budget: int, presets, reserve: int | None = None,
                    trace_batches: int | None = None, log: Callable[[str], None] = print
                    ) -> dict[str, Any]:
    """:func:`profile` each preset in ``presets`` (names) under the same budget and
    recommend the one with the shortest expected run (:func:`run_time`: its build, first
    epoch and ``config.epochs - 1`` later epochs).

    Returns the recommended preset's report, plus ``recommended_preset`` and
    ``presets``: per preset its expected epoch, predicted miss ratio, cache sizes,
    per-batch stage seconds and ``sizes`` block (or ``error`` when the budget cannot
    hold it). The report's ``sizes`` (what ``ooc.train --sizes`` applies) name the
    recommended preset.

    Raises:
        OocError: no preset fits the budget (the first preset's reason).
    """
    reports: dict[str, dict[str, Any]] = {}
    errors: dict[str, OocError] = {}
    for name in presets:
        log(f"ooc.size: profiling preset {name}")
        try:
            reports[name] = profile(dataset, replace(config, mode=name), options, budget,
                                    reserve=reserve, trace_batches=trace_batches, log=log)
        except OocError as e:
            errors[name] = e
            log(f"ooc.size: preset {name} does not fit: {e}")
    if not reports:
        raise errors[next(iter(presets))]
    best = min(reports, key=lambda k: reports[k]["recommendation"]["expected_run_s"])
    summary: dict[str, Any] = {name: {"error": str(e)} for name, e in errors.items()}
    for name, r in reports.items():
        rec = r["recommendation"]
        summary[name] = {k: rec[k] for k in ("expected_epoch_s", "expected_later_epoch_s",
                                              "expected_run_s", "predicted_miss_ratio",
                                              "feature_cache_rows", "neighbor_cache_bytes",
                                              "superbatch_size", "per_batch_s")}
        summary[name]["compute_steps_timed"] = r["measured"]["compute_steps_timed"]
        em = rec["epoch_model"]
        summary[name]["epoch_terms_s"] = em["terms_s"]
        summary[name]["stage_model_epoch_s"] = em["stage_model"]["epoch_s"]
        summary[name]["rehearsal"] = em["rehearsal"]
        summary[name]["device_reads"] = em["reads"]
        summary[name]["run"] = rec["run"]
        summary[name]["sizes"] = r["sizes"]
    out = dict(reports[best])
    out["recommended_preset"] = best
    out["presets"] = summary
    out["profile_s"] = sum(r["profile_s"] for r in reports.values())
    return out


def _model_for(dataset, config):
    """The config's model (seeded as training seeds it), its Adam optimizer and device."""
    import torch

    from ooc.executor.training.models import build_model
    from ooc.executor.training.trainer import resolve_device

    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    model = build_model(config.model, dataset.feature_dim, config.hidden, dataset.num_classes,
                        config.num_layers, dropout=config.dropout, heads=config.heads).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    return model, optimizer, device


def _recommended_options(options, plan):
    """``options`` with the plan's cache and superbatch sizes (no budget left to plan)."""
    return replace(options, feature_cache_size=plan.feature_cache_bytes,
                   neighbor_cache_size=plan.neighbor_cache_bytes,
                   superbatch_size=plan.superbatch_size, memory_budget=None)


def _rehearse(dataset, config, options, plan, preset, shape: _Shape, epoch1: EpochPlan,
              training, log):
    """:func:`~ooc.executor.sizing.rehearsal.rehearse` the epoch's first batches with the
    recommended sizes."""

    k, s_r = rehearsal_shape(shape.nb, plan.superbatch_size)
    log(f"ooc.size: rehearsing the first {k} batches as training runs them"
        + (f" (superbatches of {s_r})" if s_r else ""))
    model, optimizer, device = training
    return rehearse(dataset, config, _recommended_options(options, plan), preset,
                    np.concatenate(epoch1.batches[:k]), s_r, model, optimizer, device)


def _measure(dataset, config, options, plan, preset, shape: _Shape, epoch1: EpochPlan, gpu,
             training, log) -> _Measured:
    """Build the stack with the recommended sizes, as training builds it, and time its
    stages on the first ``shape.T`` batches of epoch 1."""

    rec = _recommended_options(options, plan)
    log(f"ooc.size: building the {preset.name} mode with the recommended sizes "
        f"(feature cache {_fmt(plan.feature_cache_bytes)}, neighbor cache "
        f"{_fmt(plan.neighbor_cache_bytes)}, superbatch {plan.superbatch_size})")
    stages = {k: _Stage() for k in ("sample", "write", "changesets", "load", "switch", "gather",
                                    "update", "compute")}

    drop_page_cache(dataset.path)  # reads are timed cold, as a training run starts them
    with _Stage() as build_st:
        stack = build_stack(dataset, config, rec, preset=preset)
    try:
        pipe = stack.train
        log(f"ooc.size: sampling {shape.T} batches (superbatch sampling stage)")
        with stages["sample"]:
            batches = pipe.sampler.sample_many(*epoch1.first(shape.T))
        trace = [np.asarray(b.node_ids, dtype=np.int64) for b in batches]
        m = _Measured(stages, build_st, stack.info.get("reader_backend"), trace, batches,
                      float(np.mean([len(t) for t in trace])))
        cs = None
        if preset.policy.schedule == "superbatch":
            cs = _superbatch_stages(stack, preset, config, shape, m, gpu, dataset.row_pages())
        if not gpu["available"]:
            gpu["note"] = "no CUDA device: the changeset pass runs on the CPU (numba)"
        m.gpu = gpu
        log("ooc.size: main loop stage (gather with the feature cache, training steps)")
        _main_loop(stack, cs, shape, m, dataset, training)
    finally:
        stack.close()
    return m


def _superbatch_stages(stack, preset, config, shape: _Shape, m: _Measured, gpu: dict, pages):
    """Write, compute and load one superbatch's runtime files (timed); its changesets
    (``pages``: the dataset's row pages, for page-mates)."""
    import tempfile


    st, S0, n = m.stages, shape.S0, stack.train.cache.num_nodes
    capacity = stack.train.cache.capacity
    folder = Path(tempfile.mkdtemp(prefix="profile-", dir=Path(stack.info["runtime_dir"])))
    try:
        with st["write"]:
            samples = SuperbatchSamples.from_batches(m.batches[:S0], len(config.fanouts))
            sbytes = write_samples(folder, samples)
        preset.policy.changesets(n, capacity, config.device, pages)(m.trace[:2])  # compile
        fn = preset.policy.changesets(n, capacity, config.device, pages)
        with st["changesets"]:
            cs = FlatChangesets.from_changesets(fn(m.trace[:S0]))
        m.changeset_batches, m.next_changesets = S0, fn
        if gpu["available"]:
            gpu.update(_gpu_changesets(m.trace[:S0], n, capacity, shape.S))
        cbytes = write_changesets(folder, cs)
        with st["load"]:
            samples, cs = read_samples(folder), read_changesets(folder)
    finally:
        remove_superbatch(folder)
        try:
            folder.rmdir()
        except OSError:
            pass
    m.runtime = {"sample_bytes_per_batch": sbytes / S0, "changeset_bytes_per_batch": cbytes / S0,
                 "bytes_per_batch": (sbytes + cbytes) / S0,
                 "superbatch_bytes": (sbytes + cbytes) / S0 * shape.S}
    return cs


def _main_loop(stack, cs, shape: _Shape, m: _Measured, dataset, training) -> None:
    """Switch (with changesets), gather through the cache, apply the changesets; then time
    the training step (:func:`_time_steps`)."""
    model, optimizer, device, compute_steps = training
    features, cache, st = stack.features, stack.train.cache, m.stages
    read0 = features.read_s
    if cs is not None:
        with st["switch"]:
            m.switched = cache.switch(cs.init_ids, features)
    m.read_switch = features.read_s - read0
    m.gather_batches = min(shape.T, max(shape.S0, 8), 32)
    for j in range(m.gather_batches):
        if cs is not None and j and j % shape.S == 0:  # the next superbatch, as training runs it
            cs = _next_superbatch(m, shape, j, cache, features)
        step = cs.step(j % shape.S) if cs is not None else None
        mates = mate_rows = None
        if step is not None:
            mates = step.mates(len(m.trace[j]))
            mate_rows = np.empty((len(mates), cache.cache.shape[1]), cache.cache.dtype)
        with st["gather"]:
            if cache is not None:
                rows, miss = cache.gather(m.trace[j], features, mates=mates, mates_out=mate_rows)
            else:
                rows, miss = features.read(m.trace[j]), len(m.trace[j])
        m.misses += miss
        m.lookups += len(m.trace[j])
        if step is not None:
            with st["update"]:
                cache.update(step.in_ids, step.out_ids, step.in_positions, rows, mate_rows)
        del rows
    m.read_gather = features.read_s - read0 - m.read_switch
    m.step_s = _time_steps(model, optimizer, m.batches, features, dataset, device,
                           st["compute"], compute_steps)


def _next_superbatch(m: _Measured, shape: _Shape, j: int, cache, features):
    """Changesets of the superbatch starting at batch ``j`` (the cache carried from the
    previous one) and its switch, each timed into its stage."""
    from ooc.caches.changesets import FlatChangesets

    chunk = m.trace[j:j + shape.S]
    assert m.next_changesets is not None  # set by _superbatch_stages, which made the first cs
    with m.stages["changesets"]:
        cs = FlatChangesets.from_changesets(m.next_changesets(chunk))
    m.changeset_batches += len(chunk)
    read0 = features.read_s
    with m.stages["switch"]:
        m.switched += cache.switch(cs.init_ids, features)
    m.read_switch += features.read_s - read0
    return cs


def _simulate(dataset, preset, plan, shape: _Shape, m: _Measured, gpu: dict):
    """The epoch's misses under the recommended size, the miss-ratio curves, and the
    nodes by decreasing out-degree (the static cache's order)."""

    n = dataset.num_nodes
    hot = degree_order(dataset)
    device = "cuda" if gpu["available"] else "cpu"
    t0 = time.perf_counter()
    pages = dataset.row_pages()
    sim = simulate_epoch(preset, m.trace, n, int(plan.feature_cache_rows), shape.S,
                         hot_order=hot, device=device, pages=pages)
    caps = sorted({max(1, int(round(f * n))) for f in CURVE_FRACTIONS}
                  | ({int(plan.feature_cache_rows)} if plan.feature_cache_rows else set()))
    curves = miss_curves(m.trace, n, shape.S, hot, np.array(caps, np.int64), device=device,
                         pages=pages)
    curves["capacity_rows"] = caps
    curves["curves_s"] = time.perf_counter() - t0
    return sim, curves, hot


#: Gather misses below this many rows are too few to time reads by.
MIN_TIMED_READS = 1024


def _rates(m: _Measured, sim: dict, shape: _Shape, preset) -> dict[str, Any]:
    """Per-batch (wall, CPU) seconds of each stage at the predicted miss ratio, and
    the seconds of one switch."""
    st, T, S0 = m.stages, shape.T, shape.S0
    pred_miss = sim["misses"] / max(sim["lookups"], 1)
    # seconds per row read: the gathers' own, or with the switches' reads pooled in when
    # the gathers missed too few rows to time (a first superbatch the switch filled)
    per_row_read = (m.read_gather / m.misses if m.misses >= MIN_TIMED_READS
                    else (m.read_gather + m.read_switch) / max(m.misses + m.switched, 1))
    g = st["gather"]
    gather_other = max(0.0, g.wall - m.read_gather) / max(m.lookups, 1)
    pred_miss_rows = pred_miss * m.ids_per_batch
    gather_wall = pred_miss_rows * per_row_read + m.ids_per_batch * gather_other
    gb = max(m.gather_batches, 1)
    # CPU: the measured CPU scaled by the predicted vs measured miss rows (reads dominate)
    gather_cpu = (g.cpu / gb * ((pred_miss_rows + 1) / (m.misses / gb + 1)) if m.misses
                  else g.cpu / max(m.lookups, 1) * m.ids_per_batch)
    u = st["update"]
    per_batch: dict[str, tuple[float, float]] = {
        "sample": ((st["sample"].wall + st["write"].wall) / T,
                   (st["sample"].cpu + st["write"].cpu) / T),
        "changesets": (st["changesets"].wall / max(m.changeset_batches, 1),
                       st["changesets"].cpu / max(m.changeset_batches, 1)),
        "load": (st["load"].wall / S0, st["load"].cpu / S0),
        "gather": (gather_wall + u.wall / gb, gather_cpu + u.cpu / gb),
        "compute": m.step_s,
    }
    switch_s = 0.0
    if sim["superbatches"]:
        # the simulated switch reads, scaled from the trace to the epoch, per superbatch
        k = max(1, -(-shape.nb // shape.S))
        rows_per_switch = sim["switch_reads"] * (shape.nb / T) / k
        switch_s = rows_per_switch * (m.read_switch / m.switched if m.switched else per_row_read)
    return {"per_batch": per_batch, "switch_s": switch_s, "pred_miss": pred_miss,
            "pred_miss_rows": pred_miss_rows, "per_row_read": per_row_read,
            "gather_other": gather_other, "measured_miss": m.misses / max(m.lookups, 1)}


def _arithmetic(dataset, preset, options, plan, budget, reserve, shape: _Shape, m: _Measured,
                rates: dict, epoch: dict) -> list[str]:
    """The recommendation's arithmetic, as text lines."""

    st, peaks, working = plan.stages, plan.stage_peaks, plan.working
    n, row_bytes = dataset.num_nodes, dataset.layout.row_bytes
    arith = [
        f"budget B = {_fmt(budget)}; reserve R = {_fmt(reserve)} "
        f"(max(48 MiB, 10% of B): allocator slack, the order the pipeline's threads allocate in)",
        f"measured: setup RSS {_fmt(st['setup_rss'])} (kernels {plan.kernels}); peak with "
        f"{PREFETCH + 2} batches in flight: sampled {_fmt(peaks.get('sample', 0))}, gathered + "
        f"one training step {_fmt(peaks.get('train_loop', 0))}"
        + (f", evaluation {_fmt(peaks['eval_loop'])}" if "eval_loop" in peaks else ""),
        "working memory W = " + " + ".join(st) + " = "
        + " + ".join(_fmt(v) for v in st.values()) + f" = {_fmt(working)}",
        f"free F = B - W - R = {_fmt(budget)} - {_fmt(working)} - {_fmt(reserve)} = "
        f"{_fmt(budget - working - reserve)}; smallest budget that works: "
        f"{plan.min_budget // MiB} MiB",
    ]
    if preset.caches:
        nbytes = plan.neighbor_cache_bytes
        cost = row_cost(row_bytes, n)
        feat_total = plan.feature_cache_rows * cost
        arith += [
            f"neighbor cache = min(full cache, 25% of F) = {_fmt(nbytes)} (sampling runs while "
            f"training: both caches are resident at once)",
            f"feature cache = (F - neighbor cache) / (row {row_bytes} B + {cost - row_bytes} B "
            f"of slot bookkeeping) = {plan.feature_cache_rows:,} rows = "
            f"{_fmt(plan.feature_cache_bytes)} ({plan.feature_cache_rows / n:.1%} of the "
            f"{n:,} rows); W + caches = {_fmt(working + nbytes + feat_total)} <= B - R = "
            f"{_fmt(budget - reserve)}",
        ]
    if plan.superbatch_size:
        arith += _superbatch_arithmetic(options, plan, shape, m)
    return arith + _epoch_arithmetic(shape, rates, epoch)


def _epoch_arithmetic(shape: _Shape, rates: dict, epoch: dict) -> list[str]:
    """The rehearsal, the expected epochs and run, and the stage model, as text lines."""
    arith: list[str] = []
    staged, reh, reads = epoch["stage_model"], epoch["rehearsal"], epoch["reads"]
    terms = staged["terms_s"]
    arith.append(
        f"rehearsal: {reh['batches']} batches trained as training runs them"
        + (f" (superbatches of {reh['superbatch_size']})" if reh["superbatch_size"] else "")
        + f": warm-up ({reh['warm_batches']} batches) {reh['warm_s']:.2f}s, then "
          f"{reh['steady_s_per_batch']:.3f}s a batch, producer busy {reh['steady_busy']:.0%}, "
          f"miss ratio {reh['miss_ratio']:.3f}; device reads per batch after the warm-up "
          f"({reads['unit']}s): epoch {reads['epoch_per_batch']:,.0f}, rehearsal "
          f"{reads['rehearsal_per_batch']:,.0f}, {reads['seconds_each'] * 1e6:.1f} us each")
    arith.append(
        f"epoch = {epoch['formula']} = "
        + " + ".join(f"{k} {v:.2f}s" for k, v in epoch["terms_s"].items())
        + f" = {epoch['epoch_s']:.2f}s")
    run = epoch["run"]
    arith.append(
        f"later epochs (the cache kept): startup {epoch['later_startup_s']:.2f}s + "
        f"{shape.nb} x (steady + reads x busy at {reads['later_per_batch']:,.0f} reads a batch)"
        f" = {epoch['later_epoch_s']:.2f}s; a run of {run['epochs']} epochs = build "
        f"{run['build_s']:.2f}s + first {run['first_epoch_s']:.2f}s + {run['epochs'] - 1} x "
        f"{run['later_epoch_s']:.2f}s = {run['total_s']:.2f}s")
    arith.append(
        f"stage model (each stage timed alone): {staged['formula']}: "
        + (f"startup {staged['startup_s']:.2f}s + " if "startup_s" in staged else "")
        + "max(" + ", ".join(f"{k} {v:.2f}s" for k, v in terms.items()) + ")"
        + (f" + {staged['superbatches']} x switch {rates['switch_s']:.2f}s"
           if "superbatches" in staged else "")
        + f" = {staged['epoch_s']:.2f}s; per batch: "
        + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in rates["per_batch"].items())
        + f"; gather at the predicted miss ratio {rates['pred_miss']:.3f} "
          f"({rates['pred_miss_rows']:,.0f} rows x {rates['per_row_read'] * 1e6:.1f} us/row read)")
    return arith


def _superbatch_arithmetic(options, plan, shape: _Shape, m: _Measured) -> list[str]:
    bpb = plan.runtime_bytes_per_batch
    out = [f"superbatch S = runtime disk budget / ((ahead 1 + 1) x bytes per batch) = "
           f"{_fmt(options.runtime_disk_budget)} / (2 x {_fmt(bpb)}) = "
           f"{plan.superbatch_size_disk if plan.superbatch_size_disk is not None else 'n/a'}"
           f"; capped by the epoch ({shape.nb} batches) and so that the superbatch in flight "
           f"(samples and the changeset pass) takes at most 1/4 of what the rest of W "
           f"leaves of B - R: S = {plan.superbatch_size}"]
    if m.runtime:
        out.append(f"measured runtime files: {_fmt(m.runtime['bytes_per_batch'])} per batch "
                   f"(planned upper bound {_fmt(bpb)}), {_fmt(m.runtime['superbatch_bytes'])} "
                   f"per superbatch")
    gpu = m.gpu
    if gpu.get("changeset_peak_bytes_for_S") is not None:
        out.append(f"changeset pass on CUDA: {_fmt(gpu['changeset_peak_bytes_trace'])} peak "
                   f"for {shape.S0} batches -> {_fmt(gpu['changeset_peak_bytes_for_S'])} for S "
                   f"(limit {_fmt(gpu['total_bytes'])})")
    return out


def _report(dataset, config, preset, options, plan, budget, reserve, shape: _Shape,
            m: _Measured, sim, curves, rates, epoch, arith, device) -> dict[str, Any]:
    """The profile's report (see :func:`profile`); takes ``capacity_rows`` and
    ``curves_s`` out of ``curves``."""
    n, row_bytes = dataset.num_nodes, dataset.layout.row_bytes
    if m.runtime:
        m.runtime["planned_bytes_per_batch"] = plan.runtime_bytes_per_batch
    caps = curves.pop("capacity_rows")
    curves_s = curves.pop("curves_s")
    return {
        "tool": "size_caches",
        "dataset": {"path": str(Path(dataset.path).resolve()), "num_nodes": n,
                    "num_edges": dataset.num_edges, "feature_dim": dataset.feature_dim,
                    "row_bytes": row_bytes, "feature_bytes": n * row_bytes,
                    "disk_bytes": dataset.disk_bytes(), "train_nodes": int(len(dataset.train_idx))},
        "config": {"mode": preset.name, "model": config.model, "fanouts": list(config.fanouts),
                   "batch_size": config.batch_size, "hidden": config.hidden,
                   "device": str(device), "seed": config.seed},
        "budget_bytes": int(budget), "reserve_bytes": int(reserve),
        "runtime_disk_budget_bytes": int(options.runtime_disk_budget),
        "measured": _measured_block(n, plan, shape, m, rates, curves_s),
        "memory_plan": plan.as_dict(),
        "recommendation": _recommendation(n, preset, plan, shape, sim, rates, epoch),
        "arithmetic": arith,
        "miss_curves": {"capacity_rows": caps, "capacity_fraction": [c / n for c in caps],
                        "recommended_rows": int(plan.feature_cache_rows), **curves},
        "sizes": sizes_block(dataset, config, plan, options),
    }


def _measured_block(n: int, plan, shape: _Shape, m: _Measured, rates: dict,
                    curves_s: float) -> dict[str, Any]:
    """The report's ``measured`` block: the memory plan's measurements, the stages'
    seconds and peaks, and the rates derived from them (``n``: the dataset's nodes)."""
    st, g = m.stages, m.stages["gather"]
    return {
        "setup_rss_bytes": plan.stages["setup_rss"],
        "peak_rss_bytes": dict(plan.stage_peaks),
        "profile_peak_rss_bytes": {k: v.peak for k, v in st.items() if v.wall}
        | {"build_mode": m.build.peak},
        "stage_seconds": {k: {"wall": v.wall, "cpu": v.cpu} for k, v in st.items()},
        "trace_batches": shape.T, "ids_per_batch": m.ids_per_batch,
        "batch_node_fraction": m.ids_per_batch / n,
        "runtime_files": m.runtime,
        "sampling_batches_per_s": shape.T / max(st["sample"].wall, 1e-9),
        "sampling_nodes_per_s": shape.T * m.ids_per_batch / max(st["sample"].wall, 1e-9),
        "gather_rows_per_s": m.lookups / max(g.wall, 1e-9),
        "read_s_per_missed_row": rates["per_row_read"],
        "gather_s_per_lookup_besides_reads": rates["gather_other"],
        "gather_measured_miss_ratio": rates["measured_miss"],
        "switch_rows_read": int(m.switched),
        "compute_s_per_batch": m.step_s[0],
        "compute_steps_timed": st["compute"].count,
        "build_mode_s": m.build.wall,
        "curves_s": curves_s,
        "gpu": m.gpu,
        "reader_backend": m.reader_backend,
    }


def _recommendation(n: int, preset, plan, shape: _Shape, sim: dict, rates: dict,
                    epoch: dict) -> dict[str, Any]:
    """The report's ``recommendation`` block: the plan's sizes, the predicted miss
    ratio and epoch time, and the ``ooc.train`` arguments that apply them."""
    return {
        "feature_cache_bytes": int(plan.feature_cache_bytes),
        "feature_cache_rows": int(plan.feature_cache_rows),
        "feature_cache_fraction": plan.feature_cache_rows / n,
        "neighbor_cache_bytes": int(plan.neighbor_cache_bytes),
        "superbatch_size": plan.superbatch_size,
        "min_budget_bytes": int(plan.min_budget),
        "predicted_miss_ratio": rates["pred_miss"],
        "predicted_miss_policy": preset.policy.curve,
        "simulated_trace": {**sim, "batches": shape.T, "superbatch_size": shape.S},
        "expected_epoch_s": epoch["epoch_s"],
        "expected_later_epoch_s": epoch["later_epoch_s"],
        "expected_run_s": epoch["run"]["total_s"],
        "run": epoch["run"],
        "epoch_model": epoch,
        "per_batch_s": {k: {"wall": v[0], "cpu": v[1]}
                        for k, v in rates["per_batch"].items()},
        "train_args": _train_args(plan, preset),
    }


def _train_args(plan, preset) -> list[str]:
    a = []
    if preset.caches:
        a += ["--feature-cache-size", str(int(plan.feature_cache_bytes)),
              "--neighbor-cache-size", str(int(plan.neighbor_cache_bytes))]
    if plan.superbatch_size:
        a += ["--superbatch-size", str(int(plan.superbatch_size))]
    return a


#: At least this many seconds of training steps are timed (up to ``4 * compute_steps`` steps).
COMPUTE_MIN_S = 1.0


def _time_steps(model, optimizer, batches, features, dataset, device, stage: _Stage,
                compute_steps: int) -> tuple[float, float]:
    """(wall, CPU) medians per training step (convert + transfer + forward/backward/step).

    The rows of up to ``compute_steps`` of the traced ``batches`` are read first (not
    timed); one step is warm-up, then at least ``compute_steps - 1`` steps and
    :data:`COMPUTE_MIN_S` seconds are timed (at most ``4 * compute_steps`` steps), cycling
    through those batches when the trace is shorter. A step's cost depends on the
    batch's shape, not on which rows it holds, so the rows come straight from the
    feature source rather than through the cache."""
    import torch

    from ooc.executor.loader.batch import to_data
    from ooc.executor.training.step import default_loss, model_call, train_step

    n = max(1, min(int(compute_steps), len(batches)))
    rows_list = [features.read(np.asarray(b.node_ids, dtype=np.int64)) for b in batches[:n]]
    model.train()
    call = model_call(model)
    walls: list[float] = []
    cpus: list[float] = []
    want, cap = max(1, int(compute_steps) - 1), 4 * max(1, int(compute_steps))
    i = 0
    while i <= want or (sum(walls) < COMPUTE_MIN_S and i <= cap):
        b, rows = batches[i % n], rows_list[i % n]
        ids = np.asarray(b.node_ids, dtype=np.int64)
        t0, c0 = time.perf_counter(), time.process_time()
        y = dataset.read_labels(ids[:int(b.num_seeds)])
        data = to_data(b, rows, y).to(device)
        train_step(call, optimizer, default_loss, data)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        i += 1
    stage.wall += sum(walls)
    stage.cpu += sum(cpus)
    stage.count = len(walls)
    return float(np.median(walls)), float(np.median(cpus))


def _gpu_changesets(trace, num_nodes: int, capacity: int, S: int) -> dict[str, Any]:
    """CUDA peak memory of the changeset pass over the trace, scaled to S batches."""
    import torch


    dev = torch.device("cuda")
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    t0 = time.perf_counter()
    precompute_changesets(trace, num_nodes, capacity, device=dev)
    torch.cuda.synchronize(dev)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) - base
    total = torch.cuda.get_device_properties(dev).total_memory
    scaled = int(peak * max(1.0, S / max(len(trace), 1)))
    return {"device": torch.cuda.get_device_name(dev), "total_bytes": int(total),
            "changeset_peak_bytes_trace": int(peak), "changeset_peak_bytes_for_S": scaled,
            "changeset_s_trace": dt, "fits": scaled <= 0.8 * total}


__all__ = ["CURVE_FRACTIONS", "compare_presets", "device_reads", "extrapolate_epoch", "load_sizes",
           "miss_curves", "predict_epoch", "profile", "run_time", "simulate_epoch",
           "sizes_block"]
