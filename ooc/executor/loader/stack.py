"""The loader's stack: one function that assembles readers, caches and a pipeline.

:func:`build_stack` is the only place the I/O stack is put together, for every
consumer (``ooc.NodeLoader``, the trainer, the PyG remote backend, the memory
planner's probe, the profiler). What it builds is the preset's
(:mod:`ooc.executor.loader.presets`):

1. the preset's readers open ``indices.bin`` and ``features.bin``
   (:mod:`ooc.executor.loader.readers`);
2. the Ginex neighbor cache goes in front of the neighbour reads when the
   readers allow one and its size is at least
   :data:`~ooc.caches.neighbor_cache.MIN_CACHE_BYTES`;
3. a :class:`~ooc.caches.feature_cache.FeatureCache` of the policy's
   size, filled by the policy (:mod:`ooc.caches.policies`);
4. the training pipeline of the policy's ``schedule`` (:data:`SCHEDULES`):
   ``on_demand`` samples then gathers each batch; ``superbatch`` runs the
   :class:`~ooc.sampling.pipeline.Inspector` ahead with the policy's changesets.

Every stack yields the same batches for one seed; only the I/O path and the
schedule differ.

Cache sizes come from :class:`ModeOptions` (explicit sizes), else from a
:class:`~ooc.executor.sizing.budget.MemoryPlan` (``--memory-budget``), else from
defaults scaled to the dataset (feature cache 10% of the rows, neighbor
cache 25% of the full neighbor cache).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.caches.feature_cache import FeatureCache
from ooc.caches.neighbor_cache import (
    MIN_CACHE_BYTES,
    CachedNeighbors,
    full_cache_bytes,
    load_or_build_neighbor_cache,
)
from ooc.core.errors import InvalidValue, IOFailure, setting
from ooc.executor.loader.packing import (
    SWEEP_PAGES,
    SWEEP_READ_BYTES,
    DiskRates,
    Packer,
    PackStats,
    measure_write_rate,
)
from ooc.executor.loader.pipelines import (
    BatchPipeline,
    OnDemandPipeline,
    PackedPipeline,
    SuperbatchPipeline,
)
from ooc.executor.loader.presets import Preset, resolve_preset
from ooc.executor.loader.readers import Sources, TimedFeature
from ooc.executor.settings import BY_NAME as _S
from ooc.executor.settings import MODE, SAMPLING, check_all, keywords_checked
from ooc.sampling.link_plan import EdgeSeeds, as_seeds, epoch_plan
from ooc.sampling.pipeline import Inspector, measure_bytes_per_batch, superbatch_size_for_budget
from ooc.sampling.sampler import NeighborSampler
from ooc.storage.atomic import pid_alive
from ooc.storage.direct import DirectFeatures
from ooc.storage.read_cost import measure_read_cost
from ooc.storage.ownership import made_by_ooc, mark
from ooc.storage.pagecache import release_mapped

#: Offset of the seed stream used to sample evaluation batches (as the trainer's).
EVAL_SEED_OFFSET = 0x5EED


@keywords_checked
@dataclass
class ModeOptions:
    """Cache and I/O settings: each field is the setting of the same name in
    :data:`ooc.executor.settings.MODE` (default, limits, help). Sizes are bytes; a
    size given as text (``"512MiB"``) becomes bytes in :meth:`validate`.

    Attributes:
        memory_budget: bytes the process may use (see :mod:`ooc.executor.sizing.budget`).
        feature_cache_size: feature cache bytes (rows x row bytes); None: from the
            memory plan or the default.
        neighbor_cache_size: neighbor cache bytes (its map of cached nodes included).
        superbatch_size: batches per superbatch (``ooc``); None: the largest whose
            runtime files fit ``runtime_disk_budget`` (Ginex §3.5), capped by the
            memory plan and the epoch length.
        runtime_dir: folder of runtime files (default ``<dataset>/runtime``).
        runtime_disk_budget: bytes of runtime files on disk (default 1 GiB).
        queue_depth: io_uring queue depth of the O_DIRECT readers.
        io_threads: threads of the baseline's memmap copies.
        io_backend: the O_DIRECT readers' backend (``auto`` or a name of
            :data:`ooc.storage.io_backends.REGISTRY`); baseline reads through memmaps.
        page_reads: the O_DIRECT readers read whole pages even where the device takes
            512 B reads (see :class:`~ooc.storage.direct.DirectReader`).
        read_gap: bytes between two wanted rows (small feature rows) or pages that the
            O_DIRECT readers read through rather than read both sides apart
            (``max_gap_bytes`` of :class:`~ooc.storage.direct.DirectReader`; 0: never).
    """

    superbatch_size: int | None = _S["superbatch_size"].field()
    runtime_dir: str | None = _S["runtime_dir"].field()
    runtime_disk_budget: int = _S["runtime_disk_budget"].field()
    feature_cache_size: int | None = _S["feature_cache_size"].field()
    neighbor_cache_size: int | None = _S["neighbor_cache_size"].field()
    queue_depth: int = _S["queue_depth"].field()
    io_threads: int = _S["io_threads"].field()
    memory_budget: int | None = _S["memory_budget"].field()
    io_backend: str = _S["io_backend"].field()
    page_reads: bool = _S["page_reads"].field()
    read_gap: int = _S["read_gap"].field()

    def validate(self) -> None:
        """Check every setting (one-line :class:`InvalidValue` naming it as the caller
        wrote it); sizes given as text become bytes."""
        check_all(self, MODE)


@keywords_checked
@dataclass
class SamplingSettings:
    """How a loader samples its batches: each field is the setting of the same name in
    :data:`ooc.executor.settings.SAMPLING` (default, limits, help); a
    :class:`~ooc.executor.training.config.TrainConfig` has the same fields, and
    :func:`build_stack` and the memory planner take either.

    Attributes:
        fanouts: neighbours sampled per layer (``-1``: all).
        batch_size: seeds per batch.
        seed: the sampling seed (:class:`~ooc.sampling.epoch_plan.EpochPlan`).
        num_threads: sampler threads (None: all cores).
        device: where the ``ooc`` preset computes its changesets (``auto``: CUDA when
            available), the declared default of a training run's ``device``.
        eval_batch_size: seeds per evaluation batch (None: ``batch_size``).
    """

    fanouts: list[int] = _S["fanouts"].field()
    batch_size: int = _S["batch_size"].field()
    seed: int = _S["seed"].field()
    num_threads: int | None = _S["num_threads"].field()
    device: str = _S["device"].field()
    eval_batch_size: int | None = _S["eval_batch_size"].field()

    def validate(self) -> None:
        """Check every setting (one-line :class:`InvalidValue` naming it)."""
        check_all(self, SAMPLING)


@dataclass
class Stack:
    """What :func:`build_stack` gives its consumer. Unpacks as ``(train, eval_factory, features)``.

    Attributes:
        preset: the preset it was built from.
        train: the training pipeline (``batches(epoch)`` yields ``(SampledBatch, rows)``).
        eval_factory: ids (int64 [n]) -> an on-demand pipeline over them, in order.
        features: the uncached feature source, timed.
        info: what was built (sizes, readers, superbatch size, runtime folder).
        on_demand: ``(seeds, config, shuffle)`` -> an on-demand pipeline of another
            loader over these readers and caches (its fanouts, batch size and seed;
            the feature cache only serves hits).
    """

    preset: Preset
    train: BatchPipeline
    eval_factory: Callable[[np.ndarray], BatchPipeline]
    features: Any
    info: dict = field(default_factory=dict)
    _close: list = field(default_factory=list, repr=False)
    on_demand: Callable[..., BatchPipeline] | None = field(default=None, repr=False)

    def __iter__(self):
        return iter((self.train, self.eval_factory, self.features))

    def close(self) -> None:
        for c in reversed(self._close):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._close.clear()


def default_sizes(dataset) -> tuple[int, int]:
    """(feature cache bytes, neighbor cache bytes) without a budget."""

    row = dataset.layout.row_bytes
    feat = (dataset.num_nodes // 10) * row
    nbr = full_cache_bytes(dataset.indptr, dataset.index_dtype.itemsize) // 4
    return feat, nbr


def cache_sizes(dataset, opts: ModeOptions, plan=None) -> tuple[int, int]:
    """(feature cache bytes, neighbor cache bytes): explicit options, else the plan's,
    else :func:`default_sizes`."""
    feat, nbr = default_sizes(dataset)
    if plan is not None:
        feat, nbr = plan.feature_cache_bytes, plan.neighbor_cache_bytes
    if opts.feature_cache_size is not None:
        feat = opts.feature_cache_size
    if opts.neighbor_cache_size is not None:
        nbr = opts.neighbor_cache_size
    return int(feat), int(nbr)


def open_sources(dataset, preset: Preset, opts: ModeOptions,
                 neighbor_cache_bytes: int = 0) -> Sources:
    """The preset's readers over ``dataset``, with the neighbor cache of
    ``neighbor_cache_bytes`` in front of the neighbour reads when the readers allow
    one and it is at least :data:`~ooc.caches.neighbor_cache.MIN_CACHE_BYTES`;
    loaded from disk or built and saved the first time (see
    :mod:`ooc.caches.neighbor_cache`)."""

    src = preset.readers.open(dataset, opts)
    src.info.update(neighbor_cache_bytes=0, neighbor_cache_nodes=0)
    if preset.neighbor_cache and neighbor_cache_bytes >= MIN_CACHE_BYTES:
        try:
            ncache = load_or_build_neighbor_cache(dataset, int(neighbor_cache_bytes))
        except BaseException:
            src.close()
            raise
        release_mapped(dataset.indices)
        src.neighbors = CachedNeighbors(ncache, src.neighbors)
        src.info.update(neighbor_cache_bytes=ncache.nbytes, neighbor_cache_nodes=ncache.num_cached)
    return src


def open_sampler(dataset, preset: Preset, opts: ModeOptions, fanouts, num_threads=None,
                 neighbor_cache_bytes: int = 0) -> tuple[Sources, NeighborSampler]:
    """The preset's readers (:func:`open_sources`) and a sampler of ``fanouts`` over their
    neighbour source with ``num_threads`` threads (None: numba's setting): what every
    consumer samples with (the stack, the memory planner's probe and kernel warm-up,
    :mod:`ooc.pyg`'s on-demand requests). Closing the sources releases both."""

    src = open_sources(dataset, preset, opts, neighbor_cache_bytes)
    try:
        sampler = NeighborSampler(dataset.node_offsets(), src.neighbors, list(fanouts),
                                  num_threads=num_threads)
    except BaseException:
        src.close()
        raise
    return src, sampler


@dataclass
class _Parts:
    """What a schedule builds its training pipeline from."""

    dataset: Any
    config: Any
    opts: ModeOptions
    plan: Any
    preset: Preset
    sampler: NeighborSampler
    features: Any
    cache: FeatureCache | None
    seeds: np.ndarray | EdgeSeeds
    shuffle: bool
    info: dict
    closers: list


def _on_demand(p: _Parts) -> BatchPipeline:
    return OnDemandPipeline(p.sampler, p.seeds, p.config.batch_size, p.config.seed,
                            p.features, shuffle=p.shuffle, cache=p.cache)


def superbatch_size(p: _Parts) -> int:
    """Batches per superbatch: the policy object's, the option, the plan's, else the largest
    whose runtime files fit the runtime disk budget (Ginex §3.5); at most the epoch."""

    cfg = p.config
    nb = max(1, -(-len(p.seeds) // cfg.batch_size))
    s = getattr(p.preset.policy, "superbatch_size", None) or p.opts.superbatch_size
    if s is None and p.plan is not None and p.plan.superbatch_size:
        s = p.plan.superbatch_size
    if s is None:
        sb, bseeds = epoch_plan(p.seeds, cfg.batch_size, cfg.seed, 1, p.shuffle).first()
        bpb = measure_bytes_per_batch(p.sampler, sb, bseeds, with_changesets=True, probes=2)
        s = superbatch_size_for_budget(runtime_files_budget(p.preset, p.opts), bpb, ahead=1,
                                       max_size=nb)
        p.info["runtime_bytes_per_batch"] = int(bpb)
    return max(1, min(int(s), nb))


#: Superbatches the packed path's inspector runs ahead at most.
MAX_AHEAD = 63


def runtime_files_budget(preset: Preset, opts: ModeOptions) -> int:
    """Bytes of the runtime disk budget the inspector's runtime files may take (the packed
    segments take the rest, :func:`packed_pipeline`)."""
    return max(1, int(opts.runtime_disk_budget * preset.policy.runtime_files_share))


def disk_rates(dataset, opts: ModeOptions, folder: Path, info: dict) -> DiskRates | None:
    """The disk's read costs (random reads of ``features.bin``, one second) and sequential
    write rate (in ``folder``), or None where reads do not bypass the page cache (every
    window is then packed); what was measured goes to ``info``."""
    cost = measure_read_cost(dataset.features_file, seconds=1.0, queue_depth=opts.queue_depth,
                             backend=opts.io_backend)
    if cost is None:
        info["disk_rates"] = None
        return None
    rates = DiskRates(cost.op_s, cost.page_s, measure_write_rate(folder))
    info["disk_rates"] = {"read_op_s": rates.op_s, "read_page_s": rates.page_s,
                          "write_bytes_per_s": rates.write_bps}
    return rates


def packed_pipeline(p: _Parts, insp: Inspector, rt: Path) -> BatchPipeline:
    """The superbatch schedule whose misses are packed: a :class:`Packer` with its own
    O_DIRECT reader of ``features.bin`` (the sweep's counters apart from the direct
    misses'), windows of at most half the packed segments' share of the runtime disk."""
    policy, opts, d = p.preset.policy, p.opts, p.dataset
    assert p.cache is not None
    sweep = DirectFeatures(d.features_file, d.file_layout, queue_depth=opts.queue_depth,
                           backend=opts.io_backend, page_reads=opts.page_reads,
                           max_gap_bytes=opts.read_gap, max_pages=SWEEP_PAGES,
                           max_read_bytes=SWEEP_READ_BYTES)
    p.closers.append(sweep.close)
    disk = opts.runtime_disk_budget - runtime_files_budget(p.preset, opts)
    rates = disk_rates(d, opts, rt, p.info) if getattr(policy, "chooses", False) else None
    packer = Packer(sweep, d.row_of, d.num_nodes, getattr(policy, "window_rows", 1 << 23),
                    max(1, disk // 2), PackStats(), rates, opts.read_gap)
    # the superbatches two windows span stay on disk: as many as the runtime files' share
    # holds (at least one a window)
    bpb = p.info.get("runtime_bytes_per_batch") or (
        p.plan.runtime_bytes_per_batch if p.plan is not None else 0) or \
        measure_bytes_per_batch(p.sampler, *epoch_plan(p.seeds, p.config.batch_size, p.config.seed,
                                                      1, p.shuffle).first(), probes=2)
    sb_bytes = max(1.0, float(bpb) * insp.superbatch_size)
    insp.ahead = int(max(1, min(MAX_AHEAD, runtime_files_budget(p.preset, opts) // sb_bytes - 1)))
    p.info.update(packed_window_rows=packer.window_rows, packed_disk_bytes=int(disk),
                  inspector_ahead=insp.ahead)
    return PackedPipeline(insp, p.seeds, p.config.batch_size, p.config.seed, p.features,
                          p.cache, packer, rt / "packed", shuffle=p.shuffle)


def _direct_misses(p: _Parts, insp: Inspector, rt: Path) -> BatchPipeline:
    assert p.cache is not None
    return SuperbatchPipeline(insp, p.seeds, p.config.batch_size, p.config.seed,
                              p.features, p.cache, shuffle=p.shuffle)


#: The superbatch schedule's pipeline by where a policy's misses come from (``misses_from``).
MISS_PATHS: dict[str, Callable[[_Parts, Inspector, Path], BatchPipeline]] = {
    "reads": _direct_misses, "packed": packed_pipeline}


def _superbatch(p: _Parts) -> BatchPipeline:
    s = superbatch_size(p)
    rt, remove_rt = runtime_folder(Path(p.opts.runtime_dir) if p.opts.runtime_dir
                                   else Path(p.dataset.path) / "runtime")
    p.closers.append(remove_rt)
    if p.cache is None:  # a policy with caches = False
        raise InvalidValue(f"cache policy {p.preset.policy.name!r}: the superbatch schedule needs a "
                       f"feature cache")
    policy = p.preset.policy
    changesets = policy.changesets(p.dataset.num_nodes, p.cache.capacity, p.config.device,
                                   p.dataset.row_pages(), policy.hot_ids(p.dataset,
                                                                         p.cache.capacity))
    insp = Inspector(p.sampler, rt, s, changesets=changesets)
    p.info.update(superbatch_size=s, runtime_dir=str(rt))
    return MISS_PATHS[p.preset.policy.misses_from](p, insp, rt)


#: Training pipelines by a policy's ``schedule``.
SCHEDULES: dict[str, Callable[[_Parts], BatchPipeline]] = {
    "on_demand": _on_demand, "superbatch": _superbatch}


def _feature_cache(dataset, preset: Preset, nbytes: int, info: dict) -> FeatureCache | None:
    if not preset.policy.caches:
        return None
    rows = int(min(dataset.num_nodes, max(0, nbytes) // dataset.layout.row_bytes))
    cache = FeatureCache(dataset.num_nodes, rows, dataset.feature_dim, dataset.feature_dtype)
    info.update(feature_cache_rows=cache.capacity, feature_cache_bytes=cache.cache.nbytes)
    return cache


def build_stack(dataset, config, options: ModeOptions | None = None, plan=None,
                seeds: np.ndarray | EdgeSeeds | None = None, shuffle: bool = True,
                preset: "str | Preset | Any | None" = None) -> Stack:
    """The loader stack of ``preset`` (default ``config.mode``) over ``dataset``.

    Args:
        dataset: an opened :class:`ooc.storage.Dataset`.
        config: the sampling settings: a :class:`SamplingSettings`, or a
            :class:`~ooc.executor.training.config.TrainConfig` (which has them and a mode).
        options: cache and I/O settings (defaults: :class:`ModeOptions`).
        plan: a :class:`~ooc.executor.sizing.budget.MemoryPlan` giving cache sizes and
            the superbatch size where ``options`` leaves them open.
        seeds: the training pipeline's seed nodes (int64 [n]; default the
            dataset's ``train_idx``), split into batches of ``config.batch_size``
            in a per-epoch seeded shuffle when ``shuffle``; or a link loader's
            :class:`~ooc.sampling.link_plan.EdgeSeeds` (batches of edges).
        preset: a preset name, a :class:`~ooc.executor.loader.presets.Preset` or a
            :class:`~ooc.caches.policies.CachePolicy`.
    """
    opts = options or ModeOptions()
    opts.validate()
    dataset.check_indices()  # once per opened dataset: ids in range, every block's CRC
    preset = resolve_preset(config.mode if preset is None else preset)
    seeds = as_seeds(dataset.train_idx if seeds is None else seeds)
    feat_bytes, nbr_bytes = cache_sizes(dataset, opts, plan)
    src, sampler = open_sampler(dataset, preset, opts, config.fanouts, config.num_threads,
                                nbr_bytes if preset.neighbor_cache else 0)
    info: dict[str, Any] = {"mode": preset.name, "readers": preset.readers.name,
                            "cache_policy": preset.policy.name, **src.info}
    closers = list(src.closers)
    try:
        features = TimedFeature(src.features)
        cache = _feature_cache(dataset, preset, feat_bytes, info)
        if cache is not None:
            preset.policy.fill(cache, dataset, features)
        parts = _Parts(dataset, config, opts, plan, preset, sampler, features, cache, seeds,
                       shuffle, info, closers)
        train = SCHEDULES[preset.policy.schedule](parts)
        closers.append(train.close)  # first at close: its threads end before the readers do
    except BaseException:
        for c in reversed(closers):
            c()
        raise
    def on_demand(ids: np.ndarray, cfg, shuffle: bool) -> BatchPipeline:
        # the feature cache only serves hits here (never updated), whatever its state
        own = sampler if (list(cfg.fanouts), cfg.num_threads) == \
            (sampler.fanouts, sampler.num_threads) else \
            NeighborSampler(sampler.offsets, sampler.source, list(cfg.fanouts),
                            num_threads=cfg.num_threads)
        return OnDemandPipeline(own, ids, cfg.batch_size, cfg.seed, features, shuffle=shuffle,
                                cache=cache)

    eval_config = dataclasses.replace(config, batch_size=config.eval_batch_size
                                      or config.batch_size, seed=config.seed + EVAL_SEED_OFFSET)
    return Stack(preset, train, lambda ids: on_demand(ids, eval_config, False), features, info,
                 closers, on_demand)


#: Runtime folders are named ``run<pid>-<random>`` inside the runtime parent.
_RUN_FOLDER = re.compile(r"^run(\d+)-")


def remove_stale_runs(parent: Path) -> list[Path]:
    """Delete ``parent/run<pid>-*`` folders carrying ooc's runtime marker whose process
    no longer exists (runs killed before they could clean up); returns what was removed.
    A user's folder of such a name, without the marker, stays."""

    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _RUN_FOLDER.match(p.name)
        if m and not pid_alive(int(m.group(1))) and made_by_ooc(p, "runtime"):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def runtime_folder(parent: Path) -> tuple[Path, Callable[[], None]]:
    """A fresh ``parent/run<pid>-<random>`` folder for this run's runtime files and
    the function that removes it (and ``parent`` when this call created it and it is
    empty again). Stale folders of dead processes in ``parent`` are removed first."""

    created = not parent.exists()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale_runs(parent)
        rt = Path(tempfile.mkdtemp(prefix=f"run{os.getpid()}-", dir=parent))
        mark(rt, "runtime")
    except OSError as e:
        raise IOFailure(f"{parent}: cannot create the runtime folder ({e.strerror or e}); "
                        f"give {setting('--runtime-dir')} a folder on a writable disk") from None

    def remove() -> None:
        shutil.rmtree(rt, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty

    return rt, remove
