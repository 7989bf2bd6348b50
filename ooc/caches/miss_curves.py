"""Feature-cache policies over a batch trace: miss counts and miss-ratio curves.

All policies are batch-granular, like the executor: the cache holds ``C_i``
while batch ``i`` is gathered, batch ``i`` costs ``|ids_i − C_i|`` misses,
and the cache changes only between batches.

* **Belady** (Ginex): ``C_0`` = the ids used first; ``C_{i+1}`` = the
  ``capacity`` entries of ``C_i ∪ ids_i`` used again soonest (see
  :mod:`ooc.caches.changesets`). Optimal.
* **LRU**: the recency stamp of an id is the position of its last access in
  the concatenated trace (later in a batch = more recent); ``C_0 = ∅`` and
  ``C_{i+1}`` = the ``capacity`` entries of ``C_i ∪ ids_i`` with the latest
  stamps. Equivalently ``C_i`` = the ``capacity`` most recent distinct ids
  accessed before batch ``i``, so one pass of stack distances gives every
  capacity at once.
* **static** (PaGraph, AliGraph): a fixed set, the ``capacity`` first ids
  of an order (highest out-degree first: :func:`order_by_degree`).

``miss_curve_*`` return int64 miss counts for many capacities; LRU and static
cost one pass whatever the number of capacities, Belady one simulation per
capacity (run in parallel threads; the numba kernel releases the GIL).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from ooc.caches import _changeset_kernels as K
from ooc.caches.changesets import flatten_batches, local_ids
from ooc.core.errors import IdOutOfRange, InvalidValue

__all__ = ["belady_batch_misses", "count_misses_belady", "count_misses_lru", "count_misses_static",
           "hottest", "order_by_degree", "miss_curve_belady", "miss_curve_lru", "miss_curve_static"]


def _trace(batches: Sequence, num_nodes: int | None = None):
    flat, ptr = flatten_batches(batches)
    if flat.size and int(flat.min()) < 0:
        raise IdOutOfRange(f"cache policies: negative node id {int(flat.min())} in the trace")
    n = int(flat.max()) + 1 if flat.size else 1
    if num_nodes is not None:
        if n > num_nodes:
            raise IdOutOfRange(f"cache policies: node id {n - 1} outside [0, {num_nodes})")
        n = num_nodes
    lid, M, _ = local_ids(flat, n)
    return flat, ptr, lid, M


def _capacities(capacities) -> np.ndarray:
    caps = np.asarray(capacities, dtype=np.int64).reshape(-1)
    if caps.size and caps.min() < 0:
        raise InvalidValue(f"cache policies: capacities must be >= 0, got {caps.min()}")
    return caps


def order_by_degree(degrees: np.ndarray) -> np.ndarray:
    """Node ids by decreasing degree (ties: smaller id first); int64 [N]."""
    return np.argsort(-np.asarray(degrees, dtype=np.int64), kind="stable").astype(np.int64)


def hottest(degrees: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` of :func:`order_by_degree` as a set: int64 [min(k, N)], sorted by id.

    No sort over N: the k-th largest degree is found by a partition of a copy of
    ``degrees`` (its itemsize per node), then the nodes above it and the first of those
    equal to it (by id) are taken."""
    deg = np.asarray(degrees)
    n = deg.shape[0]
    k = int(min(max(k, 0), n))
    if k == 0:
        return np.zeros(0, np.int64)
    if k == n:
        return np.arange(n, dtype=np.int64)
    t = np.partition(deg, n - k)[n - k]           # the k-th largest degree
    above = np.flatnonzero(deg > t)
    ties = np.flatnonzero(deg == t)[:k - above.shape[0]]
    return np.sort(np.concatenate([above, ties])).astype(np.int64)


# -- Belady ------------------------------------------------------------------------


def _belady_trace(batches: Sequence):
    """The trace's local ids, batch offsets, distinct ids and next uses for Belady."""
    flat, ptr, lid, M = _trace(batches)
    if (2 * (len(ptr) - 1) + 2) * M > (1 << 63) - 1:
        raise InvalidValue("cache policies: trace too long for int64 Belady keys")
    nxt, dup, _ = K.next_use(lid, ptr, M)
    if dup >= 0:
        raise InvalidValue(f"cache policies: node id {int(flat[dup])} occurs twice in one batch")
    return lid, nxt, ptr, M


def belady_batch_misses(batches: Sequence, capacity: int) -> np.ndarray:
    """Belady misses of each batch at ``capacity``, every later batch known when the
    cache changes (the whole trace one superbatch): int64 [len(batches)]. Summed over
    the batches of an epoch, the fewest rows any cache of ``capacity`` rows that changes
    between batches reads in it, given what the batches before it left cached."""
    c = int(_capacities([capacity])[0])
    lid, nxt, ptr, M = _belady_trace(batches)
    return np.asarray(K.belady_simulate(lid, nxt, ptr, M, min(c, M), False)[6], np.int64)


def miss_curve_belady(batches: Sequence, capacities, threads: int = 2) -> np.ndarray:
    """Belady misses for each capacity; int64 [len(capacities)]."""
    caps = _capacities(capacities)
    lid, nxt, ptr, M = _belady_trace(batches)

    def one(c: int) -> int:
        return int(K.belady_simulate(lid, nxt, ptr, M, int(min(c, M)), False)[6].sum())

    if len(caps) <= 1 or threads <= 1:
        return np.array([one(c) for c in caps], np.int64)
    with ThreadPoolExecutor(min(threads, len(caps))) as ex:
        return np.array(list(ex.map(one, caps.tolist())), np.int64)


def count_misses_belady(batches: Sequence, capacity: int) -> int:
    """Belady (optimal) misses at ``capacity``."""
    return int(miss_curve_belady(batches, [capacity], threads=1)[0])


# -- LRU ------------------------------------------------------------------------------


def lru_stack_distances(batches: Sequence) -> np.ndarray:
    """Batch-granular LRU stack distance of every access (int64 [T]; cold = 2**62)."""
    _, ptr, lid, M = _trace(batches)
    return K.lru_stack_distances(lid, ptr, M)


def miss_curve_lru(batches: Sequence, capacities) -> np.ndarray:
    """LRU misses for each capacity (one pass); int64 [len(capacities)]."""
    caps = _capacities(capacities)
    d = np.sort(lru_stack_distances(batches))
    # misses(K) = accesses with distance >= K
    return (d.shape[0] - np.searchsorted(d, caps, side="left")).astype(np.int64)


def count_misses_lru(batches: Sequence, capacity: int) -> int:
    """LRU misses at ``capacity``."""
    return int(miss_curve_lru(batches, [capacity])[0])


# -- static ------------------------------------------------------------------------------


def miss_curve_static(batches: Sequence, order: np.ndarray, capacities) -> np.ndarray:
    """Static-cache misses when the cache holds ``order[:K]``, for each K; int64 [len]."""
    caps = _capacities(capacities)
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    flat, _ = flatten_batches(batches)
    n = max(int(order.max()) + 1 if order.size else 0, int(flat.max()) + 1 if flat.size else 0)
    if (order.size and order.min() < 0) or (flat.size and flat.min() < 0):
        raise IdOutOfRange("cache policies: negative node id")
    none = np.iinfo(np.int64).max
    if n <= max(2 * (flat.shape[0] + order.shape[0]), 1 << 22):
        rank = np.full(n, none, np.int64)
        # the first occurrence of an id in the order gives its rank
        rank[order[::-1]] = np.arange(order.shape[0] - 1, -1, -1, dtype=np.int64)
        ranks = rank[flat]
    else:  # huge id range: look ids up in the sorted order instead of a table
        uo, first = np.unique(order, return_index=True)
        j = np.minimum(np.searchsorted(uo, flat), max(len(uo) - 1, 0))
        ranks = np.full(flat.shape[0], none, np.int64)
        if len(uo):
            found = uo[j] == flat
            ranks[found] = first[j[found]]
    r = np.sort(ranks)
    return (r.shape[0] - np.searchsorted(r, caps, side="left")).astype(np.int64)


def count_misses_static(batches: Sequence, cached_ids) -> int:
    """Misses with a fixed cache holding ``cached_ids``."""
    flat, _ = flatten_batches(batches)
    cached = np.asarray(cached_ids, dtype=np.int64).reshape(-1)
    return int(flat.shape[0] - np.count_nonzero(np.isin(flat, cached)))
