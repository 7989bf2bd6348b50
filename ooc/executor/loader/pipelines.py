"""Batch pipelines: sampled batches with their feature rows, prepared ahead.

Every mode trains through the same loop; what differs is the pipeline that
hands it ``(batch, rows)`` pairs. A pipeline runs its stages in background
threads and keeps a few prepared batches queued, so the gather of batch i+1
overlaps the compute of batch i (numba kernels and I/O waits release the
GIL). The cache update of batch i happens on the gather thread right after
gather i, so it always precedes gather i+1.

- :class:`OnDemandPipeline` samples each batch when its turn comes, then
  gathers it, through an optional static cache: ``baseline`` (memmap
  features, no caches: PyG+) and ``static`` (neighbor cache, a static
  degree-ordered feature cache and O_DIRECT reads: Ali+PG).
- :class:`SuperbatchPipeline` takes superbatches from the
  :class:`~ooc.sampling.pipeline.Inspector` (sampled ahead, with Belady
  changesets), loads their runtime files on a loader thread, switches the
  feature cache to each superbatch's ``init`` set and applies each batch's
  changeset after its gather: ``ooc`` (Ginex).
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any, Generator, Iterator

import numpy as np

from ooc.caches.feature_cache import CachedFeature, FeatureCache
from ooc.core.timers import Timers
from ooc.core.worker import Worker
from ooc.executor.loader.packing import PackedFeature, Packer
from ooc.sampling.link_plan import EdgeSeeds, as_seeds, epoch_plan
from ooc.sampling.pipeline import Inspector
from ooc.sampling.sampler import NeighborSampler, SampledBatch
from ooc.storage.features import Feature

#: Gathered batches queued ahead of the training step. One is enough to overlap gather
#: with compute; each more costs a batch of rows of the memory budget (the planner counts
#: ``PREFETCH + 2``: the queue, the one being gathered, the one training).
PREFETCH = 1

#: The most gather threads a schedule can use: the superbatch schedule applies each
#: batch's changeset before the next batch's gather, so its gathers run in order on one.
MAX_WORKERS = {"superbatch": 1}


def pinned_rows(n: int, dim: int, dtype: np.dtype) -> np.ndarray:
    """An [n, dim] array of ``dtype`` in page-locked memory (CUDA's pinned host memory),
    for a batch's rows to reach the device in one copy."""
    import torch

    t = torch.empty((n, dim), dtype=torch.from_numpy(np.empty(0, dtype)).dtype,
                    pin_memory=True)
    return t.numpy()


def gather_threads(schedule: str, workers: int) -> int:
    """Gather threads an epoch of ``schedule`` runs for ``workers`` asked for."""
    return min(int(workers), MAX_WORKERS.get(schedule, int(workers)))


def batches_in_flight(workers: int) -> int:
    """Gathered batches held at once with ``workers`` gather threads (0: batches are made
    in the consumer's thread): each thread's queue and the batch it is making, and the
    one training; at least the one training and the one being made."""
    return max(2, int(workers) * (PREFETCH + 1) + 1)


class BatchPipeline:
    """Base: seeds split into batches per epoch, stage timers and I/O counters.

    Subclasses implement ``_items(epoch, stopped)``, a generator of ``(batch, rows)``.
    ``workers`` says where batches are made: 0 in the consumer's thread when it asks
    for the next (no overlap with training), n >= 1 on n gather threads that run
    ahead (at most the schedule's :data:`MAX_WORKERS`).
    """

    sampler: NeighborSampler  # set by each subclass
    schedule = ""
    #: the stages (of :meth:`stage_times`) run on the thread that makes the batches
    producer_stages: tuple[str, ...] = ("gather",)

    def __init__(self, seeds: np.ndarray | EdgeSeeds, batch_size: int, seed: int,
                 shuffle: bool, source: Feature, cache: FeatureCache | None = None, prefetch: int = PREFETCH,
                 workers: int = 1):
        self.seeds = as_seeds(seeds)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.source = source
        self.cache = cache
        #: what batches are gathered from: the cache over the source, or the source
        self.reader: Feature = CachedFeature(cache, source) if cache is not None else source
        self.prefetch = prefetch
        self.workers = int(workers)
        self.times = Timers()
        self.lookups = 0
        #: gather each batch's rows into page-locked memory (set where the model runs on
        #: CUDA: the rows then go to the device in one copy, ``non_blocking``)
        self.pin_rows = False
        self._count_lock = threading.Lock()
        self._live: set[Worker] = set()  # the threads of epochs being iterated

    @property
    def gather_threads(self) -> int:
        """Gather threads an epoch runs: ``workers``, capped by the schedule's maximum."""
        return gather_threads(self.schedule, self.workers)

    def _run(self, produce, depth: int, name: str) -> Generator[Any, None, None]:
        """Iterate a :class:`Worker` over ``produce``; :meth:`close` halts it."""
        return self._iterate(self._worker(produce, depth, name))

    def _worker(self, produce, depth: int, name: str) -> Worker:
        w = Worker(produce, depth, name)
        self._live.add(w)
        return w

    def _iterate(self, w: Worker) -> Generator[Any, None, None]:
        try:
            yield from w
        finally:
            self._live.discard(w)

    def close(self) -> None:
        """Stop the threads of every epoch still being iterated and wait for them, so
        that nothing reads from the sources after this returns (their readers can
        then be closed). An iterator kept past this ends."""
        live = list(self._live)
        for w in live:
            w.stop.set()
        for w in live:
            w.halt()

    def __len__(self) -> int:
        return -(-len(self.seeds) // self.batch_size) if len(self.seeds) else 0

    def plan(self, epoch: int) -> tuple[list[np.ndarray], list[int]]:
        """Seed batches of ``epoch`` and their sampling seeds (of node ids, or of the
        :class:`~ooc.sampling.link_plan.EdgeSeeds` of a link loader)."""
        return epoch_plan(self.seeds, self.batch_size, self.seed, epoch, self.shuffle).first()

    def batches(self, epoch: int) -> Generator[tuple[SampledBatch, np.ndarray], None, None]:
        """``(batch, rows)`` of every batch of ``epoch`` in order; ``rows`` is
        [n, dim] in the file dtype, row k for ``batch.node_ids[k]``."""
        self.times = Timers()
        if self.gather_threads < 1:
            yield from self._items(epoch, lambda: False)
        else:
            yield from self._threaded(epoch)

    def _threaded(self, epoch: int) -> Iterator[tuple[SampledBatch, np.ndarray]]:
        """The epoch's batches made on one gather thread."""
        return self._run(lambda put, stopped: _feed(self._items(epoch, stopped), put),
                         self.prefetch, "ooc-gather")

    @property
    def misses(self) -> int:
        """Rows read from the source (every row when nothing caches)."""
        return int(getattr(self.reader, "misses", self.lookups))

    def _gather(self, batch: SampledBatch, mates: np.ndarray | None = None,
                mates_out: np.ndarray | None = None) -> np.ndarray:
        """The batch's rows [n, dim]; with ``mates`` (page-mates the cache inserts after
        it) their rows into ``mates_out``
        (:meth:`~ooc.caches.feature_cache.CachedFeature.read`)."""
        t0 = time.perf_counter()
        out = pinned_rows(len(batch.node_ids), self.reader.shape[1], self.reader.dtype) \
            if self.pin_rows else None
        if mates is not None and len(mates):
            assert isinstance(self.reader, CachedFeature)  # changesets come with a cache
            rows = self.reader.read(batch.node_ids, out, mates=mates, mates_out=mates_out)
        else:
            rows = self.reader.read(batch.node_ids, out)
        self.times.add("gather", time.perf_counter() - t0)
        with self._count_lock:
            self.lookups += len(batch.node_ids)
        return rows

    def _items(self, epoch: int, stopped) -> Generator[tuple[SampledBatch, np.ndarray], None, None]:
        raise NotImplementedError  # pragma: no cover - abstract

    def stage_times(self) -> dict[str, float]:
        return self.times.snapshot()

    def io_stats(self) -> dict[str, Any]:
        """Reads, bytes and hit ratio of the feature path so far."""
        st: dict[str, Any] = {"feature_lookups": self.lookups, "feature_misses": self.misses,
                              "feature_hit_ratio": 1 - self.misses / self.lookups
                              if self.lookups else 0.0}
        st.update({f"feature_{k}": v for k, v in self.source.stats().items()})
        if self.cache is not None:
            st["feature_page_mates_read"] = self.cache.mates_read
        nsrc = getattr(getattr(self, "sampler", None), "source", None)
        if nsrc is not None:
            st.update(nsrc.stats())
        return st


def _feed(items: Generator[Any, None, None], put) -> None:
    """Put every item of ``items`` until ``put`` refuses one (the consumer is gone)."""
    for item in items:
        if not put(item):
            items.close()
            return


class OnDemandPipeline(BatchPipeline):
    """Sample batch i when its turn comes, then gather it (optionally through a
    static feature cache that is never updated). With ``workers`` n > 1, thread k
    makes batches k, k + n, ... and they are handed out in order."""

    schedule = "on_demand"
    producer_stages = ("sample", "gather")

    def __init__(self, sampler: NeighborSampler, seeds: np.ndarray | EdgeSeeds, batch_size: int,
                 seed: int, source: Feature, shuffle: bool = True,
                 cache: FeatureCache | None = None,
                 prefetch: int = PREFETCH, workers: int = 1):
        super().__init__(seeds, batch_size, seed, shuffle, source, cache, prefetch, workers)
        self.sampler = sampler

    def _make(self, ids: np.ndarray, batch_seed: int) -> tuple[SampledBatch, np.ndarray]:
        t0 = time.perf_counter()
        batch = self.sampler.sample(ids, batch_seed)
        self.times.add("sample", time.perf_counter() - t0)
        return batch, self._gather(batch)

    def _items(self, epoch: int, stopped) -> Generator[tuple[SampledBatch, np.ndarray], None, None]:
        seed_batches, bseeds = self.plan(epoch)
        for ids, bs in zip(seed_batches, bseeds, strict=True):
            if stopped():
                return
            yield self._make(ids, bs)

    def _threaded(self, epoch: int) -> Iterator[tuple[SampledBatch, np.ndarray]]:
        n = self.gather_threads
        if n <= 1:
            return super()._threaded(epoch)
        return self._round_robin(epoch, n)

    def _round_robin(self, epoch: int, n: int) -> Iterator[tuple[SampledBatch, np.ndarray]]:
        seed_batches, bseeds = self.plan(epoch)
        n = max(1, min(n, len(seed_batches)))

        def share(k: int):
            def produce(put, stopped) -> None:
                for i in range(k, len(seed_batches), n):
                    if stopped() or not put(self._make(seed_batches[i], bseeds[i])):
                        return
            return produce

        workers = [self._worker(share(k), self.prefetch, f"ooc-gather-{k}").start()
                   for k in range(n)]
        its = [self._iterate(w) for w in workers]
        try:
            for i in range(len(seed_batches)):
                item = next(its[i % n], None)
                if item is None:  # halted
                    return
                yield item
        finally:
            for it in its:
                it.close()
            for w in workers:  # a thread whose iterator never started
                w.halt()
                self._live.discard(w)


class SuperbatchPipeline(BatchPipeline):
    """Ginex's main loop fed by the inspector (superbatches + Belady changesets).

    Stage times: ``inspect`` (the inspector's sampling and changeset threads,
    overlapped with training), ``load`` (reading runtime files, on the loader
    thread), ``switch`` (cache initialisation per superbatch), ``gather``,
    ``update`` (changeset row copies).
    """

    schedule = "superbatch"
    producer_stages: tuple[str, ...] = ("switch", "gather", "update")

    def __init__(self, inspector: Inspector, seeds: np.ndarray | EdgeSeeds, batch_size: int,
                 seed: int, source: Feature, cache: FeatureCache, shuffle: bool = True,
                 prefetch: int = PREFETCH, workers: int = 1):
        super().__init__(seeds, batch_size, seed, shuffle, source, cache, prefetch, workers)
        self.inspector = inspector
        self.sampler = inspector.sampler

    def _loaded(self, epoch: int, stopped) -> Generator[tuple[Any, Any, Any], None, None]:
        """The epoch's superbatches with their files loaded, on the loader thread; one
        that ``stopped`` finds unused is released."""
        seed_batches, bseeds = self.plan(epoch)
        for sb in self.inspector.epoch(seed_batches, bseeds, tag=f"e{epoch}"):
            if stopped():
                sb.release()
                return
            t0 = time.perf_counter()
            samples, cs = sb.load()
            self.times.add("load", time.perf_counter() - t0)
            yield sb, samples, cs

    def _superbatches(self, epoch: int) -> Generator[tuple[Any, Any, Any], None, None]:
        """Loader thread: loads the next superbatch's files while the current one trains."""
        def load(put, stopped) -> None:
            for sb, samples, cs in self._loaded(epoch, stopped):
                if not put((sb, samples, cs)):
                    sb.release()
                    return

        return self._run(load, 1, "ooc-loader")

    def _switch(self, cs) -> None:
        """The cache holds exactly the superbatch's ``init_ids`` (timed as ``switch``)."""
        assert self.cache is not None
        t0 = time.perf_counter()
        self.cache.switch(cs.init_ids, self.source)
        self.times.add("switch", time.perf_counter() - t0)

    def _add_inspector_times(self) -> None:
        st = self.inspector.stats
        self.times.add("inspect_sample", st.sample_s)
        self.times.add("inspect_changesets", st.changeset_s)
        self.times.add("inspect_write", st.write_s)

    def _items(self, epoch: int, stopped) -> Generator[tuple[SampledBatch, np.ndarray], None, None]:
        cache = self.cache
        assert cache is not None
        superbatches = self._superbatches(epoch)
        try:
            for sb, samples, cs in superbatches:
                try:
                    self._switch(cs)
                    for j in range(len(samples)):
                        if stopped():
                            return
                        batch = samples.batch(j)
                        step = cs.step(j)
                        # page-mates: read with the misses into a buffer of their own that
                        # lives until the update
                        mates = step.mates(len(batch.node_ids))
                        mate_rows = np.empty((len(mates), cache.cache.shape[1]),
                                             cache.cache.dtype) if len(mates) else None
                        rows = self._gather(batch, mates, mate_rows)
                        t0 = time.perf_counter()
                        cache.update(step.in_ids, step.out_ids, step.in_positions, rows,
                                     mate_rows)
                        del mate_rows
                        self.times.add("update", time.perf_counter() - t0)
                        yield batch, rows
                finally:
                    sb.release()
        finally:
            superbatches.close()
        self._add_inspector_times()


#: The first window of an epoch holds ``2**-RAMP`` of a window's rows, each next one twice
#: the last's: training starts once a few batches are sampled and packed, not a whole window.
RAMP = 3


class PackedPipeline(SuperbatchPipeline):
    """The superbatch schedule whose misses come packed (:mod:`ooc.executor.loader.packing`).

    Its loader thread loads each superbatch's runtime files and packs its windows, at most
    two on disk (the one training reads and the next); training reads each batch's misses
    from its segment through :class:`~ooc.executor.loader.packing.PackedFeature`. The same
    batches, cache switches and changesets as :class:`SuperbatchPipeline`, so the same rows.
    Stage ``wait``: seconds training waited for a window (packing that did not hide).
    """

    producer_stages = ("switch", "gather", "update", "wait")

    def __init__(self, inspector: Inspector, seeds: np.ndarray | EdgeSeeds, batch_size: int,
                 seed: int, source: Feature, cache: FeatureCache, packer: Packer, folder: Path,
                 shuffle: bool = True, prefetch: int = PREFETCH, workers: int = 1):
        super().__init__(inspector, seeds, batch_size, seed, source, cache, shuffle, prefetch,
                         workers)
        self.packer = packer
        self.folder = Path(folder)
        #: superbatches a window holds at most: half the inspector's slots, less one for a
        #: superbatch two windows share
        self.window_superbatches = max(1, (inspector.ahead + 1) // 2 - 1)
        self.pack_stats = packer.stats
        self.packed = PackedFeature(source, packer.rows, packer.stats)
        self.reader = CachedFeature(cache, self.packed)

    def _windows(self, epoch: int, superbatches: Generator[Any, None, None], count: int
                 ) -> Generator[Any, None, None]:
        """Packer thread: the epoch's windows in order, at most two on disk (the one
        training reads and the next). A window ends when it holds its most rows or
        :attr:`window_superbatches` superbatches, so the inspector's slots (``ahead``)
        hold the superbatches of both windows. ``superbatches``: the inspector's epoch
        (``count`` superbatches), which the consumer closes."""
        slots = threading.Semaphore(2)
        folder = self.folder / f"e{epoch}"
        folder.mkdir(parents=True, exist_ok=True)
        packer = self.packer

        def load(put, stopped) -> None:
            parts: list[tuple[Any, int, int]] = []
            made = [0]
            packer.begin(packer.window_rows >> RAMP)

            def emit() -> bool:
                while not slots.acquire(timeout=0.1):
                    if stopped():
                        return False
                first = parts[0]
                win = packer.flush(folder / f"sb{first[0].index:06d}-{first[1]:06d}.bin",
                                   list(parts), slots.release)
                parts.clear()
                made[0] += 1
                packer.limit(packer.window_rows >> max(0, RAMP - made[0]))
                if put(win):
                    return True
                win.remove()
                return False

            for _ in range(count):
                # not past the last: the generator's end removes the epoch's runtime files,
                # which training still reads (the consumer closes it)
                sb = next(superbatches, None)
                if sb is None or stopped():
                    return
                t0 = time.perf_counter()
                ids, ptr, cs = sb.load_ids()
                self.times.add("load", time.perf_counter() - t0)
                packer.start(cs.init_ids)
                n = len(ptr) - 1
                j = 0
                while j < n:
                    j1 = packer.add(ids, ptr, cs, j)
                    parts.append((sb, j, j1))
                    j = j1
                    spanned = len({id(q[0]) for q in parts})
                    if (packer.full or (j == n and spanned >= self.window_superbatches)) \
                            and not emit():
                        return
                del ids, ptr, cs
            if parts:
                emit()

        return self._run(load, 1, "ooc-packer")

    def _items(self, epoch: int, stopped) -> Generator[tuple[SampledBatch, np.ndarray], None, None]:
        cache = self.cache
        assert cache is not None
        seed_batches, bseeds = self.plan(epoch)
        superbatches = self.inspector.epoch(seed_batches, bseeds, tag=f"e{epoch}")
        count = -(-len(seed_batches) // self.inspector.superbatch_size)
        windows = self._windows(epoch, superbatches, count)
        held: tuple[Any, Any, Any] | None = None     # the superbatch being trained
        try:
            while True:
                t0 = time.perf_counter()
                win = next(windows, None)
                dt = time.perf_counter() - t0
                self.times.add("wait", dt)
                self.pack_stats.add(wait_s=dt)
                if win is None:
                    break
                try:
                    t = 0
                    for sb, first, stop in win.parts:
                        if held is None or held[0] is not sb:
                            t0 = time.perf_counter()
                            samples, cs = sb.load()
                            self.times.add("load", time.perf_counter() - t0)
                            held = (sb, samples, cs)
                            self._switch(cs)
                        _, samples, cs = held
                        for j in range(first, stop):
                            if stopped():
                                return
                            batch = samples.batch(j)
                            step = cs.step(j)
                            self.packed.expect(win, t)
                            t += 1
                            rows = self._gather(batch)
                            t0 = time.perf_counter()
                            cache.update(step.in_ids, step.out_ids, step.in_positions, rows)
                            self.times.add("update", time.perf_counter() - t0)
                            yield batch, rows
                        if stop == len(samples):
                            sb.release()
                            held = None
                finally:
                    win.remove()
        finally:
            if held is not None:
                held[0].release()
            windows.close()          # the packer thread ends first
            superbatches.close()     # then the inspector's threads and files
            shutil.rmtree(self.folder / f"e{epoch}", ignore_errors=True)
        self._add_inspector_times()

    def io_stats(self) -> dict[str, Any]:
        """The direct path's counters and the packed path's (``packed_*``; ``packed_sweep_*``:
        the sweep reader's)."""
        st = super().io_stats()
        st.update({f"packed_{k}": v for k, v in self.pack_stats.as_dict().items()})
        st.update({f"packed_sweep_{k}": v for k, v in self.packer.sweep.stats().items()})
        return st
