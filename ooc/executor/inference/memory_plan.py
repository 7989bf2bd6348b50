"""Memory of layer-wise inference: the budget split per layer and the RSS it is checked by."""
from __future__ import annotations

import threading

from ...storage.errors import BudgetError, setting

MiB = 1 << 20
#: Memory kept free for allocator slack, Zarr codecs and torch temporaries.
SAFETY_BYTES = 48 * MiB


def rss() -> int:
    """This process's resident set size in bytes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


class PeakRss:
    """Samples this process's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak = rss()
        self.window = self.peak
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def reset(self) -> None:
        """Start a new window; ``sample()`` returns its peak (``peak`` keeps the overall one)."""
        self.window = rss()

    def sample(self) -> int:
        return max(self.window, rss())

    def _run(self) -> None:
        import psutil

        p = psutil.Process()
        while not self._stop.is_set():
            r = int(p.memory_info().rss)
            self.peak = max(self.peak, r)
            self.window = max(self.window, r)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRss":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())


def plan_memory(budget: int, rss: int, chunk_rows: int, d_in: int, d_out: int, cached: bool,
                cache_chunks: int | None = None, num_chunks: int | None = None,
                in_itemsize: int = 4) -> tuple[int, int, int, int]:
    """Split what ``budget`` leaves above ``rss`` for one layer (``in_itemsize``: bytes of
    an input value as the chunk cache holds it, 2 for a float16 layer).

    Returns ``(cache_chunks, work_bytes, node_bytes, edge_bytes)``: half of the
    free memory (after two output chunk buffers and :data:`SAFETY_BYTES`) goes
    to the previous-layer chunk cache, the rest to one block's working set,
    whose size is estimated per local node and per edge (x rows, torch copies,
    messages, the int64 edge index).
    """
    from ...memory import tune_malloc

    tune_malloc()  # a budget holds only with freed chunk arrays returned to the OS
    out_chunk_bytes = chunk_rows * d_out * 4
    in_chunk_bytes = chunk_rows * d_in * int(in_itemsize)
    avail = budget - rss - 2 * out_chunk_bytes - SAFETY_BYTES
    if avail <= 0:
        raise BudgetError(f"memory budget {budget / MiB:.0f} MiB is too small: the process already "
                       f"holds {rss / MiB:.0f} MiB and an output chunk needs "
                       f"{out_chunk_bytes / MiB:.1f} MiB (raise {setting('--memory-budget')} or lower "
                       f"{setting('--chunk-rows')})")
    if not cached:
        cap = 0
    elif cache_chunks is not None:
        cap = int(cache_chunks)
    else:
        cap = int(avail * 0.5) // max(in_chunk_bytes, 1)
    if num_chunks is not None:
        cap = min(cap, num_chunks)
    work = max(avail - cap * in_chunk_bytes, avail // 4)
    if cached:  # a chunk read on a miss that is not kept
        work -= in_chunk_bytes
    work = max(work, 1 * MiB)
    # measured peaks are ~1.2x these (torch temporaries, allocator slack): x1.5
    node_bytes = 6 * (3 * d_in + 4 * d_out) + 96
    edge_bytes = 144 + 6 * 3 * (d_in + d_out)
    return cap, work, node_bytes, edge_bytes
