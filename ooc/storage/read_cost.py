"""What a read costs the device a file is on: the fixed cost of an operation against the
transfer of a page, measured with the O_DIRECT reader itself, and the gap worth reading
through that follows (:attr:`~ooc.storage.direct.DirectReader.max_gap_pages`).

A request's reads go ``queue_depth`` at a time; at that depth a read of ``k`` pages takes
the device about ``a + b k`` seconds of its time (``a``: the operation, ``b``: a page's
transfer). Reading through a gap of ``g`` pages between two wanted pages saves one ``a``
and costs ``g b``, so it pays while ``g < a / b``. :func:`measure_read_cost` times batches
of reads of 1, 2, 4 and 8 pages at random places of the file and fits the line.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from ooc.storage.direct import DirectReader
from ooc.storage.layout import PAGE

__all__ = ["ReadCost", "fit_read_cost", "measure_read_cost", "MAX_GAP_PAGES"]

#: The largest gap a measurement recommends reading through, in pages.
MAX_GAP_PAGES = 8
#: Read sizes timed, in pages.
RUN_PAGES = (1, 2, 4, 8)
#: Reads per timed batch.
READS_PER_BATCH = 1024


@dataclass
class ReadCost:
    """A fitted read cost. ``op_s``: seconds of device time an operation costs beyond its
    bytes; ``page_s``: seconds a page's transfer costs; ``gap_pages``: the gap worth
    reading through (``floor(op_s / page_s)``, within ``[0, MAX_GAP_PAGES]``);
    ``reads_per_s``: reads a second measured per size in pages; ``backend``: the reader's."""

    op_s: float
    page_s: float
    gap_pages: int
    reads_per_s: dict[int, float]
    backend: str = ""

    @property
    def gap_bytes(self) -> int:
        return self.gap_pages * PAGE

    def as_dict(self) -> dict:
        d = asdict(self)
        d["gap_bytes"] = self.gap_bytes
        return d


def fit_read_cost(reads_per_s: dict[int, float], backend: str = "") -> ReadCost:
    """The line ``a + b k`` through the seconds a read of ``k`` pages takes
    (``1 / reads_per_s[k]``), least squares, and the gap it recommends. A slope that is
    not positive (the transfer lost in the noise) recommends the largest gap; an
    intercept that is not, none."""
    ks = np.array(sorted(reads_per_s), dtype=np.float64)
    t = np.array([1.0 / reads_per_s[int(k)] for k in ks])
    b, a = np.polyfit(ks, t, 1) if ks.size > 1 else (0.0, float(t[0]))
    if a <= 0:
        gap = 0
    elif b <= 0:
        gap = MAX_GAP_PAGES
    else:
        gap = int(min(MAX_GAP_PAGES, max(0, np.floor(a / b))))
    return ReadCost(float(a), float(b), gap, {int(k): float(v) for k, v in reads_per_s.items()},
                    backend)


def measure_read_cost(path, seconds: float = 2.0, queue_depth: int = 64, seed: int = 0,
                      backend: str = "auto") -> ReadCost | None:
    """Time reads of :data:`RUN_PAGES` pages at random, page-aligned, non-adjacent places of
    ``path`` through a :class:`~ooc.storage.direct.DirectReader` (``seconds`` in all, the
    sizes interleaved), and fit :func:`fit_read_cost`. None when the reader does not
    bypass the page cache (the times would be the cache's) or the file holds too few pages
    for reads that do not touch."""
    rng = np.random.default_rng(seed)
    with DirectReader(path, queue_depth=queue_depth, backend=backend) as r:
        kmax = max(RUN_PAGES)
        slots = r.num_pages // (kmax + 1)
        if not r.o_direct or slots < 2:
            return None
        n = min(READS_PER_BATCH, slots)
        buf = r.scratch(n * kmax * PAGE)
        spent = {k: 0.0 for k in RUN_PAGES}
        done = {k: 0 for k in RUN_PAGES}

        def batch(k: int) -> float:
            """Seconds of one batch of ``n`` reads of ``k`` pages."""
            starts = np.sort(rng.choice(slots, n, replace=False)) * (kmax + 1)
            offs = starts.astype(np.int64) * PAGE
            lens = np.full(n, k * PAGE, np.int64)
            bufs = np.arange(n, dtype=np.int64) * (k * PAGE)
            t0 = time.perf_counter()
            r.read_runs(offs, lens, bufs, buf, n * k, reuse=True)
            return time.perf_counter() - t0

        for k in RUN_PAGES:  # untimed: the ring, the buffer's first touch
            batch(k)
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or not all(done.values()):
            for k in RUN_PAGES:
                spent[k] += batch(k)
                done[k] += n
        return fit_read_cost({k: done[k] / spent[k] for k in RUN_PAGES}, r.backend)
