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
   training builds it (:func:`ooc.executor.loader.stack.build_mode`, so the neighbor
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
4. **The expected epoch time** from those rates (see :func:`predict_epoch`).

The report (a JSON-friendly dict) carries the measurements, the
recommendation, the arithmetic as text lines, the curves, and ``sizes`` — the
part ``python -m ooc.train --sizes sizes.json`` reads (:func:`load_sizes`).
"""
from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...storage.errors import OocError

#: Cache sizes of the miss-ratio curves, as fractions of the feature table.
CURVE_FRACTIONS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
                   0.7, 0.8, 0.9, 1.0)
#: Version of the ``sizes`` block read by ``ooc.train --sizes``.
SIZES_VERSION = 1
MiB = 1 << 20


def _fmt(n: float) -> str:
    from ...cli import format_size

    return format_size(n)


class _Stage:
    """Wall seconds, process CPU seconds and peak RSS of a block."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.peak = 0

    def __enter__(self) -> "_Stage":
        from .budget import reset_hwm

        gc.collect()
        self._hwm = reset_hwm()
        self._t, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        from .budget import hwm_bytes, rss_bytes

        self.wall += time.perf_counter() - self._t
        self.cpu += time.process_time() - self._c
        self.peak = max(self.peak, hwm_bytes() if self._hwm else rss_bytes())


# -- the sizes file ------------------------------------------------------------------------------


def sizes_block(dataset, config, plan) -> dict[str, Any]:
    """What ``ooc.train --sizes`` applies: the recommended cache bytes and superbatch size."""
    return {"version": SIZES_VERSION, "mode": config.mode,
            "feature_cache_size": int(plan.feature_cache_bytes),
            "neighbor_cache_size": int(plan.neighbor_cache_bytes),
            "superbatch_size": int(plan.superbatch_size) if plan.superbatch_size else None,
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
        raise OocError(f"{p}: sizes file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OocError(f"{p}: cannot read sizes file ({getattr(e, 'strerror', None) or e})") \
            from None
    except json.JSONDecodeError as e:
        raise OocError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None
    s = doc.get("sizes", doc) if isinstance(doc, dict) else None
    if not isinstance(s, dict) or s.get("version") != SIZES_VERSION:
        raise OocError(f"{p}: not a sizes file of tools/size_caches.py (no 'sizes' block of "
                       f"version {SIZES_VERSION})")
    for key in ("feature_cache_size", "neighbor_cache_size"):
        v = s.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise OocError(f"{p}: sizes.{key} must be a non-negative integer, got {v!r}")
    sb = s.get("superbatch_size")
    if sb is not None and (not isinstance(sb, int) or isinstance(sb, bool) or sb < 1):
        raise OocError(f"{p}: sizes.superbatch_size must be a positive integer, got {sb!r}")
    ds = s.get("dataset") or {}
    if dataset is not None and ds.get("num_nodes") not in (None, dataset.num_nodes):
        raise OocError(f"{p}: sizes were profiled on a dataset of {ds.get('num_nodes'):,} nodes; "
                       f"{dataset.path} has {dataset.num_nodes:,}")
    return s


# -- the epoch-time model --------------------------------------------------------------------


def predict_epoch(mode: str, num_batches: int, superbatch_size: int | None,
                  per_batch: dict[str, tuple[float, float]], switch_s: float,
                  cores: int) -> dict[str, Any]:
    """Expected seconds of one training epoch from per-batch stage costs.

    Args:
        per_batch: stage -> (wall seconds, process-CPU seconds) per batch, for
            ``sample`` (sampling + writing runtime files; on-demand modes:
            sampling only), ``changesets``, ``load``, ``gather`` (at the
            predicted miss ratio, updates included) and ``compute``
            (convert + transfer + forward/backward/step).
        switch_s: seconds of one cache switch (``ooc``, per superbatch).
        cores: CPUs the process may use.

    ``ooc``: the first superbatch is sampled and its changesets computed before
    training starts (``startup``); then the main loop runs ``num_batches``
    batches while the inspector prepares the rest. Its threads overlap, so
    that part takes the longest of (the main thread's compute, the gather
    thread's gather + load, the inspector's sampling + changesets, all their
    CPU seconds over the cores), plus one switch per superbatch.
    ``static`` / ``baseline``: sampling and gather run on the pipeline thread
    beside the compute thread: the longer of the two, or the CPU bound.
    """
    w = {k: v[0] for k, v in per_batch.items()}
    c = {k: v[1] for k, v in per_batch.items()}
    nb = int(num_batches)
    out: dict[str, Any] = {"num_batches": nb, "cores": cores}
    if mode == "ooc":
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
        total = startup + overlap + k * switch_s
        out.update(superbatches=k, startup_s=startup, overlapped_s=overlap,
                   switches_s=k * switch_s, terms_s=terms,
                   formula="startup S*(sample+changesets) + max(terms) + superbatches*switch")
    else:
        terms = {"compute_thread": nb * w["compute"],
                 "pipeline_thread": nb * (w["sample"] + w["gather"]),
                 "cpu_bound": nb * (c["compute"] + c["sample"] + c["gather"]) / cores}
        total = max(terms.values())
        out.update(terms_s=terms, formula="max(terms)")
    out["epoch_s"] = total
    return out


# -- the schedule training runs, simulated -------------------------------------------------


def simulate_epoch(mode: str, trace: list[np.ndarray], num_nodes: int, capacity: int,
                   superbatch_size: int | None = None, hot_order: np.ndarray | None = None,
                   device: str = "cpu") -> dict[str, int]:
    """Feature-cache misses of one training epoch, counted as the trainer counts them.

    Args:
        trace: the epoch's batches in order, each the int64 node ids one batch
            gathers (``SampledBatch.node_ids``).
        capacity: feature-cache rows.
        superbatch_size: ``ooc``: batches per superbatch.
        hot_order: ``static``: node ids by decreasing out-degree.

    ``ooc`` runs the changesets training runs (:func:`ooc.executor.loader.stack._changeset_fn`:
    Belady per superbatch of ``superbatch_size`` batches, the cache carried from one
    superbatch to the next) and replays them on a bool [N] residency mask: a switch
    reads the ``init`` ids not yet cached (``switch_reads``), batch i misses the ids
    not cached when it is gathered, then its changeset is applied. ``static`` caches
    ``hot_order[:capacity]``; ``baseline`` has no cache. Returns ``lookups``,
    ``misses`` (gather misses: the trainer's ``feature_misses``), ``switch_reads``
    and ``superbatches``.
    """
    lookups = int(sum(len(t) for t in trace))
    cap = int(min(capacity, num_nodes))
    out = {"lookups": lookups, "misses": lookups, "switch_reads": 0, "superbatches": 0}
    if mode == "baseline" or cap <= 0:
        return out
    cached = np.zeros(num_nodes, dtype=bool)
    if mode == "static":
        cached[np.asarray(hot_order, dtype=np.int64)[:cap]] = True
        out["misses"] = int(sum(int((~cached[t]).sum()) for t in trace))
        return out
    from ..loader.stack import _changeset_fn

    fn = _changeset_fn(num_nodes, cap, device)
    s = max(1, int(superbatch_size or len(trace)))
    misses = switch = 0
    for a in range(0, len(trace), s):
        cs = fn(trace[a:a + s])
        init = np.asarray(cs.init_ids, dtype=np.int64)
        switch += int((~cached[init]).sum())
        cached[:] = False
        cached[init] = True
        for j, ids in enumerate(trace[a:a + s]):
            misses += int((~cached[ids]).sum())
            in_ids, out_ids, _ = cs.step(j)
            cached[np.asarray(out_ids, dtype=np.int64)] = False
            cached[np.asarray(in_ids, dtype=np.int64)] = True
        out["superbatches"] += 1
    out.update(misses=misses, switch_reads=switch)
    return out


def miss_curves(mode: str, trace: list[np.ndarray], num_nodes: int, superbatch_size: int,
                hot_order: np.ndarray, capacities: np.ndarray, device: str = "cpu"
                ) -> dict[str, Any]:
    """Miss ratios of the epoch ``trace`` at each capacity (rows).

    ``ooc``: :func:`simulate_epoch` of the ``ooc`` schedule with this superbatch
    size (gather misses, what training reports; ``ooc_with_switch`` adds the
    switches' reads); ``static_degree``: the degree-ordered static cache; ``lru``:
    LRU from a cold start over the whole trace, for reference.
    """
    from ...inspector import policies as P

    caps = np.asarray(capacities, dtype=np.int64)
    acc = max(1, int(sum(len(t) for t in trace)))
    ooc, ooc_sw, static = [], [], []
    for c in caps:
        r = simulate_epoch("ooc", trace, num_nodes, int(c), superbatch_size, device=device)
        ooc.append(r["misses"] / acc)
        ooc_sw.append((r["misses"] + r["switch_reads"]) / acc)
        static.append(simulate_epoch("static", trace, num_nodes, int(c),
                                     hot_order=hot_order)["misses"] / acc)
    lru = [float(v) / acc for v in P.miss_curve_lru(trace, caps)]
    return {"ooc": ooc, "ooc_with_switch": ooc_sw, "static_degree": static, "lru": lru,
            "accesses": acc}


# -- the profile ------------------------------------------------------------------------------


def profile(dataset, config, options, budget: int, reserve: int | None = None,
            trace_batches: int | None = None, compute_steps: int = 6,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Profile ``config.mode`` on ``dataset`` under ``budget`` bytes; return the report.

    Args:
        dataset: an opened dataset.
        config: :class:`~ooc.executor.training.trainer.TrainConfig` (mode, model, fanouts, ...).
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

    from ...inspector.sampler import derive_seed, epoch_batches
    from .budget import default_reserve, plan_memory
    from ..training.models import build_model
    from ..training.trainer import resolve_device

    t_start = time.perf_counter()
    config.validate()
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    model = build_model(config.model, dataset.feature_dim, config.hidden, dataset.num_classes,
                        config.num_layers, dropout=config.dropout, heads=config.heads).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    reserve = default_reserve(int(budget)) if reserve is None else int(reserve)
    log(f"size_caches: memory plan (the same code as ooc.train --memory-budget) under "
        f"{_fmt(budget)}")
    plan = plan_memory(dataset, config, int(budget), options, model=model, reserve=reserve)
    mode = config.mode
    n = dataset.num_nodes
    row_bytes = dataset.layout.row_bytes
    seed_batches = epoch_batches(dataset.train_idx, config.batch_size, config.seed, 1,
                                 shuffle=True)
    nb = len(seed_batches)
    S = int(plan.superbatch_size or nb)
    T = int(trace_batches or nb)
    T = max(1, min(T, nb))
    S0 = max(1, min(S, T))   # the superbatch the stages are timed on

    # -- the mode with the recommended sizes, built as training builds it -------------------------
    rec = replace(options, feature_cache_size=plan.feature_cache_bytes,
                  neighbor_cache_size=plan.neighbor_cache_bytes,
                  superbatch_size=plan.superbatch_size if mode == "ooc" else None,
                  memory_budget=None)
    log(f"size_caches: building the {mode} mode with the recommended sizes "
        f"(feature cache {_fmt(plan.feature_cache_bytes)}, neighbor cache "
        f"{_fmt(plan.neighbor_cache_bytes)}, superbatch {plan.superbatch_size})")
    from ..loader.stack import build_mode, hot_nodes

    stages: dict[str, _Stage] = {k: _Stage() for k in
                                 ("sample", "write", "changesets", "load", "switch", "gather",
                                  "update", "compute")}
    with _Stage() as build_st:
        mp = build_mode(dataset, config, rec)
    reader_backend = mp.info.get("reader_backend")
    gpu: dict[str, Any] = {"available": bool(torch.cuda.is_available())}
    try:
        pipe = mp.train
        sampler = pipe.inspector.sampler if mode == "ooc" else pipe.sampler
        cache = pipe.cache
        features = mp.features
        bseeds = [derive_seed(config.seed, 1, b) for b in range(T)]
        log(f"size_caches: sampling {T} batches (superbatch sampling stage)")
        with stages["sample"]:
            batches = sampler.sample_many(seed_batches[:T], bseeds)
        trace = [np.asarray(b.node_ids, dtype=np.int64) for b in batches]
        ids_per_batch = float(np.mean([len(t) for t in trace]))
        runtime: dict[str, Any] = {}
        cs = None
        if mode == "ooc":
            import tempfile

            from ...inspector.runtime import (FlatChangesets, SuperbatchSamples, read_changesets,
                                             read_samples, remove_superbatch, write_changesets,
                                             write_samples)
            from ..loader.stack import _changeset_fn

            rt = Path(mp.info["runtime_dir"])
            folder = Path(tempfile.mkdtemp(prefix="profile-", dir=rt))
            try:
                with stages["write"]:
                    samples = SuperbatchSamples.from_batches(batches[:S0], len(config.fanouts))
                    sbytes = write_samples(folder, samples)
                fn = _changeset_fn(n, cache.capacity, config.device)
                fn(trace[:2])  # warm-up: the first call may compile the kernels (not timed)
                with stages["changesets"]:
                    cs = FlatChangesets.from_changesets(fn(trace[:S0]))
                if gpu["available"]:
                    gpu.update(_gpu_changesets(trace[:S0], n, cache.capacity, S))
                cbytes = write_changesets(folder, cs)
                with stages["load"]:
                    samples, cs = read_samples(folder), read_changesets(folder)
            finally:
                remove_superbatch(folder)
                try:
                    folder.rmdir()
                except OSError:
                    pass
            runtime = {"sample_bytes_per_batch": sbytes / S0,
                       "changeset_bytes_per_batch": cbytes / S0,
                       "bytes_per_batch": (sbytes + cbytes) / S0,
                       "planned_bytes_per_batch": plan.runtime_bytes_per_batch,
                       "superbatch_bytes": (sbytes + cbytes) / S0 * S}
        if not gpu["available"]:
            gpu["note"] = "no CUDA device: the changeset pass runs on the CPU (numba)"

        # -- main loop: switch, gather, update, compute ------------------------------------------
        log("size_caches: main loop stage (gather with the feature cache, training steps)")
        read0 = features.read_s
        misses = lookups = updated = 0
        rows_list = []
        steps = max(2, min(int(compute_steps), T))
        if mode == "ooc":
            with stages["switch"]:
                switched = cache.switch(cs.init_ids, features)
        else:
            switched = 0
        read_switch = features.read_s - read0
        gather_batches = min(S0, 32) if mode != "baseline" else min(T, 8)
        for j in range(gather_batches):
            with stages["gather"]:
                if cache is not None:
                    rows, m = cache.gather(trace[j], features)
                else:
                    rows, m = features.read(trace[j]), len(trace[j])
            misses += m
            lookups += len(trace[j])
            if cs is not None:
                with stages["update"]:
                    i_ids, o_ids, i_pos = cs.step(j)
                    cache.update(i_ids, o_ids, i_pos, rows)
                updated += len(i_ids)
            if j < steps:
                rows_list.append(rows)
            del rows
        read_gather = features.read_s - read0 - read_switch
        step_s = _time_steps(model, optimizer, batches[:steps], rows_list, dataset, device,
                             stages["compute"])
        del rows_list
    finally:
        mp.close()

    # -- the epoch training will run, simulated; curves over the cache size --------------------
    log(f"size_caches: simulating the {mode} schedule over {T} batches (cache carried across "
        f"superbatches of {S}) and the miss-ratio curves")
    hot = hot_nodes(dataset)
    cs_device = "cpu" if not gpu["available"] else "cuda"
    t0 = time.perf_counter()
    sim = simulate_epoch(mode, trace, n, int(plan.feature_cache_rows), S, hot_order=hot,
                         device=cs_device)
    caps = sorted({max(1, int(round(f * n))) for f in CURVE_FRACTIONS}
                  | ({int(plan.feature_cache_rows)} if plan.feature_cache_rows else set()))
    curves = miss_curves(mode, trace, n, S, hot, np.array(caps, np.int64), device=cs_device)
    curves_s = time.perf_counter() - t0
    rec_rows = int(plan.feature_cache_rows)
    policy = {"ooc": "ooc", "static": "static_degree"}.get(mode)
    pred_miss = sim["misses"] / max(sim["lookups"], 1)
    measured_miss = misses / max(lookups, 1)

    # -- rates and the expected epoch -----------------------------------------------------------
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_row_read = read_gather / max(misses, 1)
    g = stages["gather"]
    gather_other = max(0.0, g.wall - read_gather) / max(lookups, 1)
    gather_cpu_per_lookup = g.cpu / max(lookups, 1)
    pred_miss_rows = pred_miss * ids_per_batch
    gather_wall = pred_miss_rows * per_row_read + ids_per_batch * gather_other
    # CPU: scale the measured CPU by the predicted vs measured miss rows (reads dominate)
    gather_cpu = g.cpu / max(gather_batches, 1) * (
        (pred_miss_rows + 1) / (misses / max(gather_batches, 1) + 1)) if misses else \
        gather_cpu_per_lookup * ids_per_batch
    u = stages["update"]
    upd = (u.wall / max(gather_batches, 1), u.cpu / max(gather_batches, 1))
    per_batch: dict[str, tuple[float, float]] = {
        "sample": ((stages["sample"].wall + stages["write"].wall) / T,
                   (stages["sample"].cpu + stages["write"].cpu) / T),
        "changesets": (stages["changesets"].wall / S0, stages["changesets"].cpu / S0),
        "load": (stages["load"].wall / S0, stages["load"].cpu / S0),
        "gather": (gather_wall + upd[0], gather_cpu + upd[1]),
        "compute": step_s,
    }
    switch_s = 0.0
    if mode == "ooc":
        # the simulated switch reads, scaled from the trace to the epoch, per superbatch
        k = max(1, -(-nb // S))
        rows_per_switch = sim["switch_reads"] * (nb / T) / k
        switch_s = rows_per_switch * (read_switch / switched if switched else per_row_read)
    epoch = predict_epoch(mode, nb, S, per_batch, switch_s, cores)
    from ..loader.pipelines import PREFETCH

    # -- recommendation and its arithmetic ------------------------------------------------------
    st = plan.stages
    peaks = plan.stage_peaks
    working = plan.working
    feat_total = plan.feature_cache_rows * (row_bytes + 8)
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
    if mode != "baseline":
        nbytes = plan.neighbor_cache_bytes
        arith += [
            f"neighbor cache = min(full cache, 25% of F) = {_fmt(nbytes)} (sampling runs while "
            f"training: both caches are resident at once)",
            f"feature cache = (F - neighbor cache) / (row {row_bytes} B + 8 B of slot "
            f"bookkeeping) = {plan.feature_cache_rows:,} rows = "
            f"{_fmt(plan.feature_cache_bytes)} ({plan.feature_cache_rows / n:.1%} of the "
            f"{n:,} rows); W + caches = {_fmt(working + nbytes + feat_total)} <= B - R = "
            f"{_fmt(budget - reserve)}",
        ]
    if mode == "ooc":
        bpb = plan.runtime_bytes_per_batch
        arith.append(
            f"superbatch S = runtime disk budget / ((ahead 1 + 1) x bytes per batch) = "
            f"{_fmt(options.runtime_disk_budget)} / (2 x {_fmt(bpb)}) = "
            f"{plan.superbatch_size_disk if plan.superbatch_size_disk is not None else 'n/a'}"
            f"; capped by the epoch ({nb} batches) and so that the superbatch in flight "
            f"(samples and the changeset pass) takes at most 1/4 of what the rest of W "
            f"leaves of B - R: S = {plan.superbatch_size}")
        if runtime:
            arith.append(f"measured runtime files: {_fmt(runtime['bytes_per_batch'])} per batch "
                         f"(planned upper bound {_fmt(bpb)}), {_fmt(runtime['superbatch_bytes'])} "
                         f"per superbatch")
        if gpu.get("changeset_peak_bytes_for_S") is not None:
            arith.append(f"changeset pass on CUDA: {_fmt(gpu['changeset_peak_bytes_trace'])} peak "
                         f"for {S0} batches -> {_fmt(gpu['changeset_peak_bytes_for_S'])} for S "
                         f"(limit {_fmt(gpu['total_bytes'])})")
    terms = epoch["terms_s"]
    arith.append(
        f"epoch = {epoch['formula']}: " + (f"startup {epoch['startup_s']:.2f}s + " if mode == "ooc"
                                           else "")
        + "max(" + ", ".join(f"{k} {v:.2f}s" for k, v in terms.items()) + ")"
        + (f" + {epoch['superbatches']} x switch {switch_s:.2f}s" if mode == "ooc" else "")
        + f" = {epoch['epoch_s']:.2f}s; per batch: "
        + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in per_batch.items())
        + f"; gather at the predicted miss ratio {pred_miss:.3f} "
          f"({pred_miss_rows:,.0f} rows x {per_row_read * 1e6:.1f} us/row read)")

    fr = [c / n for c in caps]
    report: dict[str, Any] = {
        "tool": "size_caches",
        "dataset": {"path": str(Path(dataset.path).resolve()), "num_nodes": n,
                    "num_edges": dataset.num_edges, "feature_dim": dataset.feature_dim,
                    "row_bytes": row_bytes, "feature_bytes": n * row_bytes,
                    "disk_bytes": dataset.disk_bytes(), "train_nodes": int(len(dataset.train_idx))},
        "config": {"mode": mode, "model": config.model, "fanouts": list(config.fanouts),
                   "batch_size": config.batch_size, "hidden": config.hidden,
                   "device": str(device), "seed": config.seed},
        "budget_bytes": int(budget), "reserve_bytes": int(reserve),
        "runtime_disk_budget_bytes": int(options.runtime_disk_budget),
        "measured": {
            "setup_rss_bytes": st["setup_rss"],
            "peak_rss_bytes": dict(peaks),
            "profile_peak_rss_bytes": {k: v.peak for k, v in stages.items() if v.wall}
            | {"build_mode": build_st.peak},
            "stage_seconds": {k: {"wall": v.wall, "cpu": v.cpu} for k, v in stages.items()},
            "trace_batches": T, "ids_per_batch": ids_per_batch,
            "batch_node_fraction": ids_per_batch / n,
            "runtime_files": runtime,
            "sampling_batches_per_s": T / max(stages["sample"].wall, 1e-9),
            "sampling_nodes_per_s": T * ids_per_batch / max(stages["sample"].wall, 1e-9),
            "gather_rows_per_s": lookups / max(g.wall, 1e-9),
            "read_s_per_missed_row": per_row_read,
            "gather_s_per_lookup_besides_reads": gather_other,
            "gather_measured_miss_ratio": measured_miss,
            "switch_rows_read": int(switched),
            "compute_s_per_batch": step_s[0],
            "build_mode_s": build_st.wall,
            "curves_s": curves_s,
            "gpu": gpu,
            "reader_backend": reader_backend,
        },
        "memory_plan": plan.as_dict(),
        "recommendation": {
            "feature_cache_bytes": int(plan.feature_cache_bytes),
            "feature_cache_rows": int(plan.feature_cache_rows),
            "feature_cache_fraction": plan.feature_cache_rows / n,
            "neighbor_cache_bytes": int(plan.neighbor_cache_bytes),
            "superbatch_size": plan.superbatch_size,
            "min_budget_bytes": int(plan.min_budget),
            "predicted_miss_ratio": pred_miss,
            "predicted_miss_policy": policy,
            "simulated_trace": {**sim, "batches": T, "superbatch_size": S},
            "expected_epoch_s": epoch["epoch_s"],
            "epoch_model": epoch,
            "per_batch_s": {k: {"wall": v[0], "cpu": v[1]} for k, v in per_batch.items()},
            "train_args": _train_args(plan, mode),
        },
        "arithmetic": arith,
        "miss_curves": {"capacity_rows": caps, "capacity_fraction": fr,
                        "recommended_rows": rec_rows, **curves},
        "sizes": sizes_block(dataset, config, plan),
        "profile_s": time.perf_counter() - t_start,
    }
    return report


def _train_args(plan, mode: str) -> list[str]:
    a = []
    if mode != "baseline":
        a += ["--feature-cache-size", str(int(plan.feature_cache_bytes)),
              "--neighbor-cache-size", str(int(plan.neighbor_cache_bytes))]
    if mode == "ooc" and plan.superbatch_size:
        a += ["--superbatch-size", str(int(plan.superbatch_size))]
    return a


def _time_steps(model, optimizer, batches, rows_list, dataset, device, stage: _Stage
                ) -> tuple[float, float]:
    """(wall, CPU) seconds per training step (convert + transfer + step); the
    first step is warm-up and not counted."""
    import torch
    import torch.nn.functional as F

    from ..loader.batch import to_data

    model.train()
    walls, cpus = [], []
    for i, (b, rows) in enumerate(zip(batches, rows_list)):
        ids = np.asarray(b.node_ids, dtype=np.int64)
        t0, c0 = time.perf_counter(), time.process_time()
        y = np.asarray(dataset.labels[ids[:int(b.num_seeds)]], dtype=np.int64)
        data = to_data(b, rows, y).to(device)
        optimizer.zero_grad(set_to_none=True)
        out = model(data.x, data.edge_index, data.num_sampled_nodes, data.num_sampled_edges)
        loss = F.cross_entropy(out[:data.batch_size], data.y, ignore_index=-1)
        loss.backward()
        optimizer.step()
        float(loss.item())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    stage.wall += sum(walls)
    stage.cpu += sum(cpus)
    if not walls:
        return 0.0, 0.0
    return float(np.median(walls)), float(np.median(cpus))


def _gpu_changesets(trace, num_nodes: int, capacity: int, S: int) -> dict[str, Any]:
    """CUDA peak memory of the changeset pass over the trace, scaled to S batches."""
    import torch

    from ...inspector.changesets import precompute_changesets

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


# -- the plot ----------------------------------------------------------------------------------


def plot_curves(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """Miss ratio vs feature-cache size of the schedule training runs, the
    recommended size marked; PNG written to a temp name, then renamed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mc = report["miss_curves"]
    rec = report["recommendation"]
    ds = report["dataset"]
    cfg = report["config"]
    mode = cfg["mode"]
    x = np.array(mc["capacity_fraction"]) * 100
    sb = rec.get("superbatch_size")
    series = [("ooc", f"ooc as trained (Belady changesets, superbatch {sb}, cache carried)",
               "-o", "C0"),
              ("ooc_with_switch", "ooc, counting the superbatch switches' reads", ":o", "C0"),
              ("static_degree", "static degree-ordered (PaGraph)", "-s", "C1"),
              ("lru", "LRU, cold start (reference)", "-^", "C2")]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    for key, label, style, color in series:
        if key.startswith("ooc") and mode != "ooc":
            continue
        ax.plot(x, np.array(mc[key]) * 100, style, ms=4, lw=1.8, label=label, color=color)
    fr = rec["feature_cache_fraction"] * 100
    pm = rec["predicted_miss_ratio"] * 100
    if fr > 0:
        ax.axvline(fr, color="k", ls="--", lw=1.2)
        ax.plot([fr], [pm], "k*", ms=12, zorder=5)
    # the callout sits in the lower left of the axes, inside the canvas whatever the point
    ax.annotate(f"recommended: {rec['feature_cache_rows']:,} rows "
                f"({fr:.1f}%, {_fmt(rec['feature_cache_bytes'])})\n"
                f"predicted miss ratio {pm:.1f}%, epoch {rec['expected_epoch_s']:.1f} s",
                xy=(max(fr, x.min()), pm), xycoords="data", xytext=(0.03, 0.06),
                textcoords="axes fraction", fontsize=9, ha="left", va="bottom",
                bbox=dict(boxstyle="round", fc="white", ec="0.6"),
                arrowprops=dict(arrowstyle="->", color="0.3"))
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100) if t >= x.min() * 0.9]
    ax.set_xticks(ticks, [f"{t}%" for t in ticks])
    ax.set_xlim(x.min() * 0.9, 110)
    ax.set_ylim(0, 105)
    ax.set_xlabel(f"feature cache size (% of the {ds['num_nodes']:,}-row feature table, log scale)")
    ax.set_ylabel("miss ratio (% of feature lookups read)")
    m = report["measured"]
    ax.set_title(f"Feature-cache miss ratio of one {mode} epoch ({m['trace_batches']} batches "
                 f"of {cfg['batch_size']}, fanouts {','.join(map(str, cfg['fanouts']))};\n"
                 f"{m['batch_node_fraction']:.1%} of the nodes per batch)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8.5)
    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp.png")
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, out)
    except OSError as e:
        raise OocError(f"{out}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return out


__all__ = ["CURVE_FRACTIONS", "load_sizes", "miss_curves", "plot_curves", "predict_epoch",
           "profile", "simulate_epoch", "sizes_block"]
