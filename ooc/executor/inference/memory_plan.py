"""Memory of layer-wise inference: the budget split per layer and the RSS it is checked by."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ooc.core.memory import current_rss_bytes, peak_rss_bytes, reset_peak_rss, trim_malloc, tune_malloc
from ooc.executor.inference.local_graph import LocalGraph

if TYPE_CHECKING:
    from torch import Tensor

from ooc.core.errors import BudgetError, setting

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


def output_buffers(chunk_rows: int, d_out: int) -> int:
    """Bytes of a layer's two float32 output chunk buffers (one filled, one written)."""
    return 2 * chunk_rows * d_out * 4


def headroom(budget: int, rss: int, chunk_rows: int, d_out: int) -> int:
    """What ``budget`` leaves a layer above ``rss``: :func:`output_buffers` and
    :data:`SAFETY_BYTES` taken off."""
    return budget - rss - output_buffers(chunk_rows, d_out) - SAFETY_BYTES


def plan_memory(budget: int, rss: int, chunk_rows: int, d_in: int, d_out: int, cached: bool,
                cache_chunks: int | None = None, num_chunks: int | None = None,
                in_itemsize: int = 4) -> tuple[int, int]:
    """Split what ``budget`` leaves above ``rss`` for one layer (``in_itemsize``: bytes of
    an input value as the chunk cache holds it, 2 for a float16 layer).

    Returns ``(cache_chunks, work_bytes)``: half of the free memory (after two output
    chunk buffers and :data:`SAFETY_BYTES`) goes to the previous-layer chunk cache, the
    rest to one block's working set (see :class:`BlockCosts`).
    """

    tune_malloc()  # a budget holds only with freed chunk arrays returned to the OS
    out_chunk_bytes = chunk_rows * d_out * 4
    in_chunk_bytes = chunk_rows * d_in * int(in_itemsize)
    avail = headroom(budget, rss, chunk_rows, d_out)
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
    if cap:  # a chunk read on a miss that is not kept
        work -= in_chunk_bytes
    return cap, max(work, 1 * MiB)


@dataclass(frozen=True)
class BlockCosts:
    """Bytes of a working set per target, per local node and per in-edge, and where
    they come from (``measured``: the layer run on graphs of known sizes)."""
    target: int
    node: int
    edge: int
    measured: bool = False

    def of(self, targets: int, nodes: int, edges: int) -> int:
        return targets * self.target + nodes * self.node + edges * self.edge

    @classmethod
    def estimate(cls, d_in: int, d_out: int) -> "BlockCosts":
        """A layer that builds a message per edge (x rows, torch copies, the messages, the
        int64 edge index), x1.5 over what such layers were measured to hold: where the
        kernel's peak memory cannot be read."""
        return cls(4 * d_out * 6, 6 * (3 * d_in + 4 * d_out) + 96, 144 + 6 * 3 * (d_in + d_out))


@dataclass(frozen=True)
class BlockPhases:
    """What a block holds around its sub-blocks, phase by phase (the runner's own arrays;
    its output rows go to the output chunk as each sub-block ends). The phases do not
    overlap, so a block's peak is the largest of them:

    - ``build``: :func:`~._kernels.build_local` making the local graph: per target its
      edge pointer and its share of ``nodes`` as first allocated, per local node the
      copy of ``nodes`` returned, per edge ``src`` and its share of the first ``nodes``
      (GCN: ``src`` copied once self loops are dropped, the degrees gathered per edge
      and the weights);
    - ``held``: the local graph and the block's input rows, from the gather to the last
      sub-block: per target its edge pointer (GCN: its self loop's weight), per local
      node its float32 input row and global id, per edge its local source (GCN: its
      weight);
    - ``gather``: ``held`` plus the gathers' per-node sort keys and stamps (40 B a
      local node) while the rows are read;
    - the sub-blocks: ``held`` plus their share of the work (``sub_work``).
    """
    build: BlockCosts
    held: BlockCosts
    gather_node: int = 40

    @classmethod
    def of_layer(cls, d_in: int, gcn: bool) -> "BlockPhases":
        if gcn:
            return cls(BlockCosts(40, 16, 40), BlockCosts(12, 4 * d_in + 8, 12))
        return cls(BlockCosts(16, 8, 16), BlockCosts(8, 4 * d_in + 8, 8))

    def limits(self, work: int, sub_work: int) -> tuple[np.ndarray, np.ndarray]:
        """``(costs, limits)`` for :func:`~._kernels.plan_blocks`: every phase of a block
        within ``work`` bytes, its sub-blocks' ``sub_work`` included."""
        g = self.held
        costs = np.array([[self.build.target, self.build.node, self.build.edge],
                          [g.target, g.node + self.gather_node, g.edge],
                          [g.target, g.node, g.edge]], dtype=np.int64)
        limits = np.array([work, work, max(work - sub_work, 1)], dtype=np.int64)
        return costs, limits

    def peak(self, targets: int, nodes: int, edges: int, sub_work: int) -> int:
        """The largest phase of a block of this size whose sub-blocks take ``sub_work``."""
        held = self.held.of(targets, nodes, edges)
        return max(self.build.of(targets, nodes, edges), held + self.gather_node * nodes,
                   held + sub_work)

    def work_for(self, targets: int, nodes: int, edges: int, sub_share: float) -> int:
        """The least work that runs such a block whole, when its sub-blocks take
        ``sub_share`` of the work."""
        return max(self.peak(targets, nodes, edges, 0),
                   int(self.held.of(targets, nodes, edges) / (1 - sub_share)) + 1)


#: Targets of the probe graphs a layer's memory is measured on (see :func:`measure_costs`):
#: the first measurement, and the most a second one takes where memory allows.
PROBE_MIN, PROBE_MAX = 256, 2048
#: Margin on measured costs (allocator rounding, sizes between the probes).
PROBE_MARGIN = 1.25


def measure_costs(layer: Callable[["Tensor", "Tensor", "Tensor | None", int], "Tensor"],
                  d_in: int, d_out: int, gcn: bool, free: int) -> BlockCosts | None:
    """Bytes per target, local node and edge of one sub-block: the sub-block's local graph
    built (:meth:`.local_graph.LocalGraph.sub`), its rows copied and ``layer(x,
    edge_index, weight, num_targets)`` run on four random graphs that differ in one size
    each, the peak RSS (the kernel's high-water mark, reset before each) read after
    each. Measured at :data:`PROBE_MIN` targets, then again on the largest graphs up to
    :data:`PROBE_MAX` targets that the first measurement says fit half of ``free`` bytes
    (larger graphs: less noise from allocator rounding). No cost is taken below what the
    sub-block certainly holds (its float32 output row, its copy of each input row, its
    int64 edge index and node ids). None where the high-water mark cannot be reset."""

    if not reset_peak_rss():
        return None
    _probe(layer, d_in, gcn, 16, 32, 128)  # first calls: compiled kernels, torch's state
    floor = BlockCosts(4 * d_out, 4 * d_in + 8, 24)
    costs = _measure(layer, d_in, gcn, PROBE_MIN, floor)
    t = PROBE_MAX
    while t > PROBE_MIN and _probe_bytes(costs, d_in, t) > free // 2:
        t //= 2
    return costs if t == PROBE_MIN else _measure(layer, d_in, gcn, t, floor)


def _shapes(t: int) -> list[tuple[int, int, int]]:
    """The probe graphs (targets, local nodes, edges): a base, then twice the nodes, three
    times the edges, and three times the targets of the second."""
    return [(t, 2 * t, 8 * t), (t, 4 * t, 8 * t), (t, 2 * t, 24 * t), (3 * t, 4 * t, 8 * t)]


def _probe_bytes(costs: BlockCosts, d_in: int, t: int) -> int:
    """What the largest probe graph of :func:`_shapes` holds: its rows, its edges' source
    ids and pointers, and the sub-block on top."""
    return max(costs.of(*s) + 4 * d_in * s[1] + 16 * s[2] for s in _shapes(t))


def _measure(layer, d_in: int, gcn: bool, t: int, floor: BlockCosts) -> BlockCosts:
    """The costs fitted to the four probe graphs of ``t`` targets, none below ``floor``."""
    a, b, c, d = (_probe(layer, d_in, gcn, *s) for s in _shapes(t))
    node = max(floor.node, (b - a) / (2 * t))
    edge = max(floor.edge, (c - a) / (16 * t))
    target = max(floor.target, (d - b) / (2 * t))
    # what the base graph held beyond its per-item costs, spread over its targets
    rest = max(0.0, a - t * target - 2 * t * node - 8 * t * edge) / t
    return BlockCosts(int(PROBE_MARGIN * (target + rest)) + 1, int(PROBE_MARGIN * node) + 1,
                      int(PROBE_MARGIN * edge) + 1, True)


def _probe(layer, d_in: int, gcn: bool, t: int, n: int, m: int) -> int:
    """Peak bytes above the RSS before it of one sub-block of ``t`` targets, ``n`` local
    nodes and ``m`` edges (a deterministic random graph) through ``layer``."""
    import torch


    rng = np.random.default_rng(t + n + m)
    g = LocalGraph(np.arange(n, dtype=np.int64), rng.integers(0, n, m, dtype=np.int64),
                   np.linspace(0, m, t + 1).astype(np.int64),
                   np.full(m, 0.1, dtype=np.float32) if gcn else None,
                   np.full(t, 0.1, dtype=np.float32) if gcn else None, t)
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    trim_malloc()
    base = current_rss_bytes()
    reset_peak_rss()
    nodes, ei, w = g.sub(0, t)
    xs = torch.from_numpy(x[nodes])
    h = layer(xs, torch.from_numpy(ei), None if w is None else torch.from_numpy(w), t)
    peak = peak_rss_bytes() - base
    del nodes, ei, w, xs, h
    return peak
