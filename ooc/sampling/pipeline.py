"""The inspector pipeline: superbatch sampling and changeset precomputation.

Ginex §3.1, Fig. 9: superbatch k+1 is sampled while the changesets of
superbatch k are computed, and the executor consumes superbatch k-1 meanwhile.
At most ``ahead`` superbatches exist on disk beyond the one being consumed,
so runtime files take at most ``(ahead + 1) × bytes per superbatch``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generator, Iterator, Sequence

import numpy as np

from ooc.caches.policies import ChangesetFn
from ooc.core.errors import BudgetError, InvalidValue
from ooc.core.worker import Worker
from ooc.sampling.runtime import (
    FlatChangesets,
    SuperbatchSamples,
    read_changesets,
    read_sample_ids,
    read_samples,
    remove_superbatch,
    superbatch_dir,
    write_changesets,
    write_samples,
)
from ooc.sampling.sampler import NeighborSampler


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

    def load_ids(self) -> tuple[np.ndarray, np.ndarray, FlatChangesets]:
        """``(node_ids, node_ptr, changesets)``: what the packer reads (no edges)."""
        ids, ptr = read_sample_ids(self.folder)
        return ids, ptr, read_changesets(self.folder)

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
              tag: str = "") -> Generator[Superbatch, None, None]:
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
    """One epoch of the inspector: a sampling :class:`~ooc.core.worker.Worker` feeding a
    changeset worker, at most ``ahead + 1`` superbatches on disk (a semaphore slot each,
    given back by :meth:`Superbatch.release`)."""

    def __init__(self, insp: Inspector, seed_batches: Sequence[np.ndarray],
                 batch_seeds: Sequence[int], tag: str):
        self.insp, self.seed_batches, self.batch_seeds, self.tag = insp, seed_batches, \
            batch_seeds, tag
        s, n = insp.superbatch_size, len(seed_batches)
        self.groups = [list(range(a, min(a + s, n))) for a in range(0, n, s)]
        self.stats = insp.stats
        self.slots = threading.Semaphore(insp.ahead + 1)

    # -- the sampling stage ---------------------------------------------------------------
    def _sample(self, put, stopped) -> None:
        for k, group in enumerate(self.groups):
            while not self.slots.acquire(timeout=0.1):  # room on disk
                if stopped():
                    return
            if stopped() or not put(self._sample_group(k, group)):
                return

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

    # -- the changeset stage --------------------------------------------------------------
    def _changesets(self, sampled: Worker):
        def produce(put, stopped) -> None:
            for sb, samples in sampled:
                if stopped():
                    return
                self._write_changesets(sb, samples)
                # the executor loads the files: a reference kept here until the next
                # superbatch arrives would be a second copy of these samples beside it
                del samples
                self.stats.superbatches += 1
                self.stats.batches += len(sb.batch_indices)
                if not put(sb):
                    return
        return produce

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
        """The superbatches in order; closing early halts both stages and, in every case,
        every runtime file of the epoch is removed at the end."""
        self.insp.runtime_dir.mkdir(parents=True, exist_ok=True)
        sampled = Worker(self._sample, 1, "ooc-sample")
        ready = Worker(self._changesets(sampled), self.insp.ahead + 1, "ooc-changesets",
                       upstream=sampled)
        try:
            yield from ready
        finally:
            ready.halt()
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
