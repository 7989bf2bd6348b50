"""The three training modes, built from a dataset, a config and a memory plan.

Every mode hands the trainer the same thing: a pipeline whose
``batches(epoch)`` yields ``(SampledBatch, rows)`` (see
:mod:`ooc.executor.loader.pipelines`), an evaluation pipeline factory and the feature
source. Only the schedule and the I/O path differ, never the batches:

``baseline`` (the papers' PyG+)
    Sampling over the ``indices.bin`` memmap, gather from the
    ``features.bin`` memmap; no application caches, the OS page cache is the
    cache. Given its best shot: readahead off (``madvise(MADV_RANDOM)``) on
    both maps, and ``io_threads`` threads (default 16, > 2× the cores) copying
    rows and neighbour ids out of the maps with nogil numba kernels, so page
    faults overlap.
``static`` (Ali+PG)
    The Ginex neighbor cache in front of O_DIRECT reads of ``indices.bin``,
    and a static feature cache of the highest out-degree nodes in front of
    O_DIRECT reads of ``features.bin``; each batch sampled then gathered.
``ooc`` (Ginex)
    The same neighbor cache; the :class:`~ooc.inspector.pipeline.Inspector`
    samples superbatches ahead and precomputes Belady changesets; the
    :class:`~ooc.executor.loader.pipelines.SuperbatchPipeline` switches and updates
    the feature cache; misses read with O_DIRECT.

Cache sizes come from :class:`ModeOptions` (explicit sizes), else from a
:class:`~ooc.executor.sizing.budget.MemoryPlan` (``--memory-budget``), else from
defaults scaled to the dataset (feature cache 10% of the rows, neighbor
cache 25% of the full neighbor cache).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...inspector.neighbors import CachedNeighbors, DirectNeighbors, NeighborRequest, NeighborSource
from ...inspector.sampler import NeighborSampler, epoch_batches, derive_seed
from ...storage.atomic import pid_alive
from ...storage.errors import OocError
from ...storage.pagecache import mapping_of
from ...storage.layout import RowTable
from . import _mmap_kernels as MK
from ..cache.feature_cache import FeatureCache
from .pipelines import BatchPipeline, OnDemandPipeline, SuperbatchPipeline

MODES = ("baseline", "static", "ooc")
#: Offset of the seed stream used to sample evaluation batches (as the trainer's).
EVAL_SEED_OFFSET = 0x5EED


@dataclass
class ModeOptions:
    """Mode settings (the CLI's cache and I/O options).

    Attributes:
        superbatch_size: batches per superbatch (``ooc``); None: the largest
            whose runtime files fit ``runtime_disk_budget`` (Ginex §3.5),
            capped by the memory plan and the epoch length.
        runtime_dir: folder of runtime files (default ``<dataset>/runtime``).
        runtime_disk_budget: bytes of runtime files on disk (default 1 GiB).
        feature_cache_size: feature cache bytes (rows × row bytes); None:
            from the memory plan or the default.
        neighbor_cache_size: neighbor cache bytes (address table included).
        queue_depth: io_uring queue depth of the O_DIRECT readers.
        io_threads: threads of the baseline's memmap copies.
        memory_budget: bytes the process may use (see :mod:`ooc.executor.sizing.budget`).
        io_backend: the O_DIRECT readers' backend (``auto`` or a name of
            :data:`ooc.storage.io_backends.REGISTRY`); baseline reads through memmaps.
    """

    superbatch_size: int | None = None
    runtime_dir: str | None = None
    runtime_disk_budget: int = 1 << 30
    feature_cache_size: int | None = None
    neighbor_cache_size: int | None = None
    queue_depth: int = 64
    io_threads: int = 16
    memory_budget: int | None = None
    io_backend: str = "auto"

    def validate(self) -> None:
        from ...storage.io_backends import check_choice

        try:
            check_choice(self.io_backend)
        except ValueError as e:
            raise OocError(f"--io-backend: {e}") from None
        for name in ("queue_depth", "io_threads"):
            if int(getattr(self, name)) < 1:
                raise OocError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.superbatch_size is not None and self.superbatch_size < 1:
            raise OocError(f"--superbatch-size must be >= 1, got {self.superbatch_size}")
        for name in ("feature_cache_size", "neighbor_cache_size"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise OocError(f"--{name.replace('_', '-')} must be >= 0, got {v}")
        if self.runtime_disk_budget < 1:
            raise OocError(f"--runtime-disk-budget must be positive, got {self.runtime_disk_budget}")


# -- baseline readers: memmaps with many I/O threads -----------------------------------------


def advise(arr: np.ndarray, advice: int) -> bool:
    """``madvise`` the whole mapping behind a numpy memmap; False when not a map."""
    mm = mapping_of(arr)
    if mm is None:
        return False
    try:
        mm.madvise(advice)
        return True
    except (OSError, ValueError):
        return False


#: Rows one baseline copy task reads before it drops their pages from the process.
MMAP_CHUNK_ROWS = 32
#: The kernel's fault-around window (``fault_around_bytes``, 64 KiB by default).
FAULT_AROUND_BYTES = 64 << 10


def _chunks(n: int, threads: int, min_chunk: int) -> list[tuple[int, int]]:
    k = max(1, min(threads * 4, -(-n // max(1, min_chunk))))
    step = -(-n // k)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


class ThreadedMmapFeatures(RowTable):
    """Rows of ``features.bin`` copied out of a memmap by a pool of threads.

    ``read(ids)`` → [len(ids), dim] in the file dtype. Readahead is off
    (``MADV_RANDOM``); each thread copies a chunk of rows with a nogil numba
    kernel, so up to ``threads`` page faults are in flight. Counters:
    ``stats()`` gives requests and rows; the bytes the kernel read show in
    the process's ``/proc/self/io``.
    """

    def __init__(self, path, layout, threads: int = 16):
        self.path = Path(path)
        self.layout = layout
        self.threads = int(threads)
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(layout.file_bytes,))
        advise(self.buf, mmap.MADV_RANDOM)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-mmap")
        self.requests = 0
        self.rows = 0

    def read(self, ids: np.ndarray) -> np.ndarray:
        lay = self.layout
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        out = np.empty((n, lay.dim), dtype=lay.dtype)
        if n == 0:
            return out
        if ids.min() < 0 or ids.max() >= lay.num_rows:
            raise IndexError(f"{self.path}: row id out of range [0, {lay.num_rows})")
        offs = lay.row_offsets(ids)
        order = np.argsort(offs, kind="stable")
        ob = out.view(np.uint8).reshape(n, lay.row_bytes)
        futs = [self.pool.submit(self._copy, offs, order, ob, a, min(n, a + MMAP_CHUNK_ROWS))
                for a in range(0, n, MMAP_CHUNK_ROWS)]
        for f in futs:
            f.result()
        self.requests += 1
        self.rows += n
        return out

    def _copy(self, offs, order, ob, a: int, b: int) -> None:
        """Copy rows ``order[a:b]`` (one region of the file), then drop the region's
        pages from this process (the page cache keeps them): a fault maps the
        page-cache pages around it too (fault-around, 64 KiB), so at most
        ``threads x MMAP_CHUNK_ROWS x (row + 64 KiB)`` of the file is mapped at once
        (the bound :mod:`ooc.executor.sizing.budget` counts)."""
        MK.copy_rows(self.buf, offs, order, self.layout.row_bytes, ob, a, b)
        w = FAULT_AROUND_BYTES
        lo = int(offs[order[a]]) // w * w
        hi = min(len(self.buf), -(-(int(offs[order[b - 1]]) + self.layout.row_bytes) // w) * w)
        self.buf._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def stats(self) -> dict:
        return {"requests": self.requests, "rows": self.rows}

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class ThreadedMmapNeighbors(NeighborSource):
    """Neighbour ids from the ``indices.bin`` memmap, copied by a thread pool
    (readahead off): the baseline's sampling I/O."""

    def __init__(self, indices: np.ndarray, threads: int = 16):
        self.indices = indices
        self.threads = int(threads)
        advise(indices, mmap.MADV_RANDOM)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-mmap-nbr")

    def gather(self, req: NeighborRequest) -> np.ndarray:
        out = np.empty(req.size, dtype=np.int64)
        if req.size == 0:
            return out
        futs = [self.pool.submit(MK.gather_ids, self.indices, req.edge_pos, out, a, b)
                for a, b in _chunks(req.size, self.threads, 1024)]
        for f in futs:
            f.result()
        advise(self.indices, mmap.MADV_DONTNEED)  # as ThreadedMmapFeatures.read
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class TimedSource:
    """A feature source that counts the seconds spent in ``read`` (``read_s``)."""

    def __init__(self, inner):
        self.inner = inner
        self.read_s = 0.0

    def read(self, ids: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return self.inner.read(ids)
        finally:
            self.read_s += time.perf_counter() - t0

    def stats(self) -> dict:
        s = self.inner.stats
        s = s() if callable(s) else s
        d = dict(s) if isinstance(s, dict) else s.as_dict()
        d["read_s"] = self.read_s
        return d

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


# -- building a mode --------------------------------------------------------------------------


@dataclass
class ModePipeline:
    """What a mode gives the trainer. Unpacks as ``(train, eval_factory, features)``."""

    mode: str
    train: BatchPipeline
    eval_factory: Callable[[np.ndarray], BatchPipeline]
    features: Any
    info: dict = field(default_factory=dict)
    _close: list = field(default_factory=list, repr=False)

    def __iter__(self):
        return iter((self.train, self.eval_factory, self.features))

    def close(self) -> None:
        for c in reversed(self._close):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._close.clear()


def drop_mapping(arr: np.ndarray) -> None:
    """Unmap the pages of a read-only memmap touched so far from this
    process (they leave its RSS; the page cache keeps them)."""
    advise(arr, mmap.MADV_DONTNEED)


def hot_nodes(dataset) -> np.ndarray:
    """Node ids by decreasing out-degree (ties by id): the static cache order."""
    from ...inspector.neighbor_cache import compute_out_degrees

    deg = compute_out_degrees(dataset.indices, dataset.num_nodes)
    drop_mapping(dataset.indices)
    return np.argsort(-deg, kind="stable")


def default_sizes(dataset) -> tuple[int, int]:
    """(feature cache bytes, neighbor cache bytes) without a budget."""
    from ...inspector.neighbor_cache import full_cache_bytes

    row = dataset.layout.row_bytes
    feat = (dataset.num_nodes // 10) * row
    nbr = full_cache_bytes(dataset.indptr, dataset.index_dtype.itemsize) // 4
    return feat, nbr


def _changeset_fn(num_nodes: int, capacity: int, device: str):
    """Changesets of successive superbatches, each starting from the cache the previous
    one leaves (``keep_unused`` + ``cached``: the switch reads only new entries instead
    of a whole initial set). Superbatches come in order from the inspector's one
    changeset thread, across epochs; if the executor stops early its cache differs from
    that state and the switch reads the difference: still exact."""
    from ...inspector import changesets as C

    if device in (None, "auto"):
        device = "cuda" if _cuda() else "cpu"
    state: dict[str, Any] = {"cached": None}

    def changesets(ids):
        cs = C.precompute_changesets(ids, num_nodes, capacity, device=device,
                                     cached=state["cached"], keep_unused=True)
        state["cached"] = C.final_state(cs)
        return cs

    return changesets


def _cuda() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def build_mode(dataset, config, options: ModeOptions | None = None, plan=None,
               seeds: np.ndarray | None = None, shuffle: bool = True) -> ModePipeline:
    """The pipeline of ``config.mode`` over ``dataset``.

    Args:
        dataset: an opened :class:`ooc.storage.Dataset`.
        config: a :class:`~ooc.executor.training.trainer.TrainConfig` (mode, fanouts,
            batch sizes, seed, threads, device).
        options: cache and I/O settings (defaults: :class:`ModeOptions`).
        plan: a :class:`~ooc.executor.sizing.budget.MemoryPlan` giving cache sizes and
            the superbatch size where ``options`` leaves them open.
        seeds: the training pipeline's seed nodes (int64 [n]; default the
            dataset's ``train_idx``), split into batches of ``config.batch_size``
            in a per-epoch seeded shuffle when ``shuffle``.
    """
    from ...storage.direct import DirectFeatures, DirectReader

    opts = options or ModeOptions()
    opts.validate()
    seeds = np.asarray(dataset.train_idx if seeds is None else seeds, dtype=np.int64)
    mode = config.mode
    if mode not in MODES:
        raise OocError(f"unknown mode {mode!r} (choose one of {', '.join(MODES)})")
    closers: list = []
    info: dict[str, Any] = {"mode": mode}
    eval_bs = config.eval_batch_size or config.batch_size
    row_bytes = dataset.layout.row_bytes

    if mode == "baseline":
        nsrc = ThreadedMmapNeighbors(dataset.indices, opts.io_threads)
        features = ThreadedMmapFeatures(dataset.file("features.bin"), dataset.layout,
                                        opts.io_threads)
        closers += [nsrc.close, features.close]
        cache = None
        info.update(io_threads=opts.io_threads, readahead="off (MADV_RANDOM)",
                    reader_backend="mmap", neighbor_reader_backend="mmap")
    else:
        feat_bytes, nbr_bytes = default_sizes(dataset)
        if plan is not None:
            feat_bytes, nbr_bytes = plan.feature_cache_bytes, plan.neighbor_cache_bytes
        if opts.feature_cache_size is not None:
            feat_bytes = opts.feature_cache_size
        if opts.neighbor_cache_size is not None:
            nbr_bytes = opts.neighbor_cache_size
        reader = DirectReader(dataset.file("indices.bin"), queue_depth=opts.queue_depth,
                              backend=opts.io_backend)
        nsrc = DirectNeighbors(dataset.file("indices.bin"), dataset.indptr, reader=reader,
                               dtype=dataset.index_dtype)
        nsrc._own = True
        closers.append(nsrc.close)
        if nbr_bytes >= 8 * dataset.num_nodes:
            from ...inspector.neighbor_cache import load_or_build_neighbor_cache

            ncache = load_or_build_neighbor_cache(dataset, int(nbr_bytes))
            drop_mapping(dataset.indices)
            nsrc = CachedNeighbors(ncache, nsrc)
            info["neighbor_cache_bytes"] = ncache.nbytes
            info["neighbor_cache_nodes"] = ncache.num_cached
        else:
            info["neighbor_cache_bytes"] = 0
            info["neighbor_cache_nodes"] = 0
        features = DirectFeatures(dataset.file("features.bin"), dataset.layout,
                                  queue_depth=opts.queue_depth, backend=opts.io_backend)
        closers.append(features.close)
        rows = int(min(dataset.num_nodes, max(0, feat_bytes) // row_bytes))
        cache = FeatureCache(dataset.num_nodes, rows, dataset.feature_dim, dataset.feature_dtype)
        info.update(feature_cache_rows=cache.capacity, feature_cache_bytes=cache.cache.nbytes,
                    queue_depth=opts.queue_depth, reader_backend=features.backend,
                    neighbor_reader_backend=reader.backend)
    features = TimedSource(features)
    sampler = NeighborSampler(dataset.indptr, nsrc, list(config.fanouts),
                              num_threads=config.num_threads)

    if mode == "static" and cache is not None and cache.capacity:
        cache.fill_static(hot_nodes(dataset)[:cache.capacity], features)

    if mode in ("baseline", "static"):
        train = OnDemandPipeline(sampler, seeds, config.batch_size, config.seed,
                                 features, shuffle=shuffle, cache=cache)
    else:
        from ...inspector.pipeline import (Inspector, measure_bytes_per_batch,
                                          superbatch_size_for_budget)

        nb = max(1, -(-len(seeds) // config.batch_size))
        s = opts.superbatch_size
        if s is None and plan is not None and plan.superbatch_size:
            s = plan.superbatch_size
        if s is None:
            sb = epoch_batches(seeds, config.batch_size, config.seed, 1, shuffle=shuffle)
            bseeds = [derive_seed(config.seed, 1, b) for b in range(len(sb))]
            bpb = measure_bytes_per_batch(sampler, sb, bseeds, with_changesets=True, probes=2)
            s = superbatch_size_for_budget(opts.runtime_disk_budget, bpb, ahead=1, max_size=nb)
            info["runtime_bytes_per_batch"] = int(bpb)
        s = max(1, min(int(s), nb))
        rt, remove_rt = runtime_folder(Path(opts.runtime_dir) if opts.runtime_dir
                                       else Path(dataset.path) / "runtime")
        closers.append(remove_rt)
        insp = Inspector(sampler, rt, s, changesets=_changeset_fn(dataset.num_nodes,
                                                                  cache.capacity, config.device))
        train = SuperbatchPipeline(insp, seeds, config.batch_size, config.seed,
                                   features, cache, shuffle=shuffle)
        info.update(superbatch_size=s, runtime_dir=str(rt))

    def eval_factory(ids: np.ndarray) -> BatchPipeline:
        # the feature cache only serves hits here (never updated), whatever its state
        return OnDemandPipeline(sampler, ids, eval_bs, config.seed + EVAL_SEED_OFFSET, features,
                                shuffle=False, cache=cache)

    return ModePipeline(mode, train, eval_factory, features, info, closers)


#: Runtime folders are named ``run<pid>-<random>`` inside the runtime parent.
_RUN_FOLDER = re.compile(r"^run(\d+)-")


def remove_stale_runs(parent: Path) -> list[Path]:
    """Delete ``parent/run<pid>-*`` folders whose process no longer exists
    (runs killed before they could clean up); returns what was removed."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _RUN_FOLDER.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not pid_alive(int(m.group(1))):
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
    except OSError as e:
        raise OocError(f"{parent}: cannot create the runtime folder ({e.strerror or e})") from None

    def remove() -> None:
        shutil.rmtree(rt, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty

    return rt, remove
