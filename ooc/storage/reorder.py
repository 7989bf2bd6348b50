"""A locality order of a graph's nodes: neighbours close together, so that the rows a
mini-batch gathers share pages (rows smaller than a page are read a page at a time).

:func:`locality_order` runs size-capped label propagation over the CSC in-neighbour lists,
streamed window by window from ``indices.bin`` (so the adjacency never has to fit in
memory), then groups nodes by label: each group of at most ``cap`` nodes is contiguous in
the new order. Memory: 4 B/node for the labels and 4 B/node for the label sizes while
propagating, then 4 B/node of counts and the order itself (int32 when N < 2^31, else
int64), plus one window of ``indices``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _reorder_kernels as K

#: Bytes of ``indices`` a propagation sweep holds at once.
DEFAULT_WINDOW = 64 << 20


@dataclass
class OrderStats:
    """What :func:`locality_order` did."""

    sweeps: int
    moved: list[int]
    groups: int
    largest_group: int


def _id_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < (1 << 31) else np.dtype(np.int64)


def _windows(indptr: np.ndarray, window_bytes: int, itemsize: int):
    """Node ranges ``[v0, v1)`` whose in-neighbour lists together take at most
    ``window_bytes`` (at least one node per range)."""
    n = indptr.shape[0] - 1
    per = max(1, window_bytes // itemsize)
    v0 = 0
    while v0 < n:
        v1 = int(np.searchsorted(indptr, int(indptr[v0]) + per, side="right")) - 1
        v1 = min(n, max(v0 + 1, v1))
        yield v0, v1
        v0 = v1


def locality_order(indptr: np.ndarray, indices: np.ndarray, cap: int = 1024,
                   sweeps: int = 5, window_bytes: int = DEFAULT_WINDOW,
                   stats: OrderStats | None = None) -> np.ndarray:
    """Node ids in a locality order (``order[new] = old``; int32 when N < 2^31).

    Args:
        indptr: int64 [N+1] CSC offsets (a memmap is fine: read window by window).
        indices: [E] in-neighbour ids (a memmap of ``indices.bin`` is fine).
        cap: the most nodes one label (one contiguous group of the order) may hold; a
            few thousand rows' worth of pages keeps a community within a few pages.
        sweeps: label-propagation sweeps at most (fewer when under 1% of the nodes move).
        window_bytes: bytes of ``indices`` read at once.
        stats: filled with what happened, when given.
    """
    n = int(indptr.shape[0]) - 1
    dt = _id_dtype(n)
    label = np.arange(n, dtype=dt)
    size = np.ones(n, dtype=dt)
    wins = list(_windows(indptr, window_bytes, indices.dtype.itemsize))
    max_deg = max((int(np.diff(indptr[v0:v1 + 1]).max(initial=0)) for v0, v1 in wins), default=0)
    scratch = np.empty(max(1, max_deg), dtype=dt)
    moved: list[int] = []
    for _ in range(max(0, int(sweeps))):
        m = 0
        for v0, v1 in wins:
            ptr = np.ascontiguousarray(indptr[v0:v1 + 1], dtype=np.int64)
            window = np.ascontiguousarray(indices[int(ptr[0]):int(ptr[-1])])
            m += K.propagate_window(ptr, window, v0, label, size, int(cap), scratch)
        moved.append(int(m))
        if m < max(1, n // 100):
            break
    if stats is not None:
        groups = size[size > 0]
        stats.sweeps, stats.moved = len(moved), moved
        stats.groups, stats.largest_group = int(groups.shape[0]), int(groups.max(initial=0))
    del size
    count = np.zeros(n + 1, dtype=np.int64 if n + 1 >= (1 << 31) else np.int32)
    order = np.empty(n, dtype=dt)
    K.order_by_label(label, count, order)
    return order
