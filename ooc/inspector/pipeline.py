"""The inspector pipeline: superbatch sampling and changeset precomputation.

Ginex §3.1, Fig. 9: superbatch k+1 is sampled while the changesets of
superbatch k are computed, and the executor consumes superbatch k-1 meanwhile.
At most ``ahead`` superbatches exist on disk beyond the one being consumed,
so runtime files take at most ``(ahead + 1) × bytes per superbatch``.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .runtime import (FlatChangesets, SuperbatchSamples, read_changesets, read_samples,
                      remove_superbatch, superbatch_dir, write_changesets, write_samples)
from .sampler import NeighborSampler
from ..storage.errors import BudgetError, InvalidValue


@dataclass
class Superbatch:
    """A superbatch whose runtime files are complete on disk.

    ``batch_indices`` are the epoch-level indices of its batches. Load the
    files with :meth:`load` (the executor does so on its loader thread) and
    call :meth:`release` when consumed; that removes the files and lets the
    inspector run further ahead.
    """

    index: int
    folder: Path
    batch_indices: list[int]
    has_changesets: bool
    timings: dict[str, float] = field(default_factory=dict)
    bytes_written: int = 0
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def load(self) -> tuple[SuperbatchSamples, FlatChangesets | None]:
        samples = read_samples(self.folder)
        cs = read_changesets(self.folder) if self.has_changesets else None
        return samples, cs

    def release(self) -> None:
        remove_superbatch(self.folder)
        if self._release is not None:
            self._release()
            self._release = None


@dataclass
class InspectorStats:
    """Seconds spent per inspector stage in one epoch (wall time inside each
    stage's own thread; the stages overlap)."""

    sample_s: float = 0.0
    write_s: float = 0.0
    changeset_s: float = 0.0
    bytes_written: int = 0
    superbatches: int = 0
    batches: int = 0
    cache_ids: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


ChangesetFn = Callable[[list[np.ndarray]], object]


class Inspector:
    """Runs ahead of the executor.

    Args:
        sampler: the neighbour sampler (any neighbour source).
        runtime_dir: folder for runtime files (created; emptied of our files).
        superbatch_size: batches per superbatch (S).
        changesets: ``fn(list of id arrays) -> precompute_changesets result``,
            or None when the executor needs no changesets (baseline, static).
        ahead: superbatches allowed on disk beyond the one being consumed.
    """

    def __init__(self, sampler: NeighborSampler, runtime_dir: str | Path, superbatch_size: int,
                 changesets: ChangesetFn | None = None, ahead: int = 1):
        if superbatch_size < 1:
            raise InvalidValue(f"superbatch size must be >= 1, got {superbatch_size}")
        self.sampler = sampler
        self.runtime_dir = Path(runtime_dir)
        self.superbatch_size = int(superbatch_size)
        self.changesets = changesets
        self.ahead = max(1, int(ahead))
        self.stats = InspectorStats()

    def epoch(self, seed_batches: Sequence[np.ndarray], batch_seeds: Sequence[int],
              tag: str = "") -> Iterator[Superbatch]:
        """Yield the epoch's superbatches in order as their files complete.

        The sampling and changeset threads run while the caller works on the
        yielded superbatch. Closing the generator early stops them and removes
        the runtime files.
        """
        self.stats = InspectorStats()
        yield from _EpochRun(self, seed_batches, batch_seeds, tag).superbatches()

    def _folder(self, tag: str, k: int) -> Path:
        return superbatch_dir(self.runtime_dir / tag if tag else self.runtime_dir, k)


class _EpochRun:
    """One epoch of the inspector: a sampling thread and a changeset thread joined by
    queues, at most ``ahead + 1`` superbatches on disk (a semaphore slot each)."""

    def __init__(self, insp: Inspector, seed_batches: Sequence[np.ndarray],
                 batch_seeds: Sequence[int], tag: str):
        self.insp, self.seed_batches, self.batch_seeds, self.tag = insp, seed_batches, \
            batch_seeds, tag
        s, n = insp.superbatch_size, len(seed_batches)
        self.groups = [list(range(a, min(a + s, n))) for a in range(0, n, s)]
        self.stats = insp.stats
        self.slots = threading.Semaphore(insp.ahead + 1)
        self.stop = threading.Event()
        self.to_cs: queue.Queue = queue.Queue(maxsize=1)
        self.ready: queue.Queue = queue.Queue()

    # -- the sampling thread --------------------------------------------------------------
    def _sample_loop(self) -> None:
        try:
            for k, group in enumerate(self.groups):
                if not self._take_slot():
                    return
                self.to_cs.put(self._sample_group(k, group))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self.to_cs.put(e)
            return
        self.to_cs.put(None)

    def _take_slot(self) -> bool:
        """Wait for room on disk; False once the run is stopped."""
        while not self.slots.acquire(timeout=0.1):
            if self.stop.is_set():
                return False
        return not self.stop.is_set()

    def _sample_group(self, k: int, group: list[int]) -> tuple[Superbatch, SuperbatchSamples]:
        """Sample superbatch ``k`` and write its samples file."""
        insp, stats = self.insp, self.stats
        t0 = time.perf_counter()
        batches = insp.sampler.sample_many([self.seed_batches[i] for i in group],
                                           [self.batch_seeds[i] for i in group])
        samples = SuperbatchSamples.from_batches(batches, len(insp.sampler.fanouts))
        del batches
        t1 = time.perf_counter()
        folder = insp._folder(self.tag, k)
        remove_superbatch(folder)
        nbytes = write_samples(folder, samples)
        t2 = time.perf_counter()
        stats.sample_s += t1 - t0
        stats.write_s += t2 - t1
        stats.bytes_written += nbytes
        sb = Superbatch(k, folder, group, insp.changesets is not None,
                        {"sample_s": t1 - t0, "write_s": t2 - t1}, nbytes, self.slots.release)
        return sb, samples

    # -- the changeset thread -------------------------------------------------------------
    def _changeset_loop(self) -> None:
        while True:
            try:
                item = self.to_cs.get(timeout=0.1)
            except queue.Empty:
                # a consumer that closed early drains to_cs to free the sampler, and
                # may take the end marker with it: the stop flag ends this loop then
                if self.stop.is_set():
                    return
                continue
            if item is None or isinstance(item, BaseException) or self.stop.is_set():
                self.ready.put(item)
                return
            sb, samples = item
            try:
                self._write_changesets(sb, samples)
            except BaseException as e:  # noqa: BLE001
                self.ready.put(e)
                return
            self.stats.superbatches += 1
            self.stats.batches += len(sb.batch_indices)
            self.ready.put(sb)

    def _write_changesets(self, sb: Superbatch, samples: SuperbatchSamples) -> None:
        fn = self.insp.changesets
        if fn is None:
            return
        t0 = time.perf_counter()
        cs = FlatChangesets.from_changesets(fn([samples.ids(i) for i in range(len(samples))]))
        sb.bytes_written += write_changesets(sb.folder, cs)
        dt = time.perf_counter() - t0
        sb.timings["changeset_s"] = dt
        self.stats.changeset_s += dt
        self.stats.bytes_written += cs.nbytes
        self.stats.cache_ids += len(cs.init_ids) + len(cs.in_ids)

    # -- the consumer ---------------------------------------------------------------------
    def superbatches(self) -> Iterator[Superbatch]:
        self.insp.runtime_dir.mkdir(parents=True, exist_ok=True)
        threads = [threading.Thread(target=self._sample_loop, name="ooc-sample", daemon=True),
                   threading.Thread(target=self._changeset_loop, name="ooc-changesets",
                                    daemon=True)]
        for t in threads:
            t.start()
        try:
            while True:
                item = self.ready.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._shutdown(threads)

    def _shutdown(self, threads: list[threading.Thread]) -> None:
        """Stop both threads (unblocking the sampler on a slot or the queue) and
        remove every runtime file of the epoch."""
        self.stop.set()
        for _ in range(self.insp.ahead + 2):
            self.slots.release()
        while any(t.is_alive() for t in threads):
            try:
                self.to_cs.get_nowait()
            except queue.Empty:
                pass
            for t in threads:
                t.join(timeout=0.05)
        for k in range(len(self.groups)):
            remove_superbatch(self.insp._folder(self.tag, k))


def superbatch_size_for_budget(runtime_disk_budget: int, bytes_per_batch: float, ahead: int = 1,
                               max_size: int | None = None) -> int:
    """Largest S whose runtime files fit the budget with ``ahead`` superbatches
    in flight beside the one being consumed: ``(ahead+1) · S · bytes_per_batch
    ≤ budget``."""
    if bytes_per_batch <= 0:
        raise InvalidValue("bytes per batch must be positive")
    s = int(runtime_disk_budget // ((ahead + 1) * bytes_per_batch))
    if s < 1:
        raise BudgetError(f"runtime disk budget {runtime_disk_budget} bytes is too small: one batch "
                       f"needs about {int(bytes_per_batch * (ahead + 1))} bytes with pipelining")
    return min(s, max_size) if max_size else s


def bytes_per_batch(batches: Sequence, num_layers: int, with_changesets: bool = True) -> float:
    """Runtime-file bytes per batch of already sampled ``batches``.

    Changesets add at most three int64 values per sampled id (in_ids,
    in_positions, out_ids), counted as that upper bound.
    """
    if not batches:
        return 1.0
    samples = SuperbatchSamples.from_batches(batches, num_layers)
    extra = 3 * 8 * len(samples.node_ids) if with_changesets else 0
    return (samples.nbytes + extra) / len(batches)


def measure_bytes_per_batch(sampler: NeighborSampler, seed_batches: Sequence[np.ndarray],
                            batch_seeds: Sequence[int], with_changesets: bool = True,
                            probes: int = 4) -> float:
    """Runtime-file bytes per batch, measured by sampling a few batches."""
    n = min(probes, len(seed_batches))
    batches = sampler.sample_many(list(seed_batches[:n]), list(batch_seeds[:n])) if n else []
    return bytes_per_batch(batches, len(sampler.fanouts), with_changesets)
