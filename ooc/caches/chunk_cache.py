"""A memory cache over the chunks of a chunked store (previous-layer Zarr array).

Layer-wise inference knows its whole access sequence before it starts (the
chunks every block needs, block after block), so the cache can evict
optimally: Belady's MIN evicts the resident chunk whose next use is furthest
away, and a missed chunk that is needed later than everything resident is
used once and not kept (bypass). LRU and FIFO are here for comparison.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ooc.caches._chunk_kernels import next_use
from ooc.core.errors import InvalidValue

POLICIES = ("belady", "lru", "fifo")


class ChunkCache:
    """Chunks ``key -> value`` loaded through ``loader(key)``, at most ``capacity`` kept.

    Args:
        capacity: chunks kept in memory (>= 0).
        policy: ``belady``, ``lru`` or ``fifo``.
        sequence: int64 [n] the keys in the order :meth:`get` will be called
            (required for ``belady``; keys are ints in ``[0, num_keys)``).
        loader: returns the value of a key; ``None`` simulates (values are
            not loaded, only hits and misses counted).
    """

    def __init__(self, capacity: int, policy: str = "belady", sequence: np.ndarray | None = None,
                 loader: Callable[[int], Any] | None = None, num_keys: int | None = None):
        if policy not in POLICIES:
            raise InvalidValue(f"unknown cache policy {policy!r} (choose one of {POLICIES})")
        self.capacity = max(0, int(capacity))
        self.policy = policy
        self.loader = loader
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.bypasses = 0
        self._pos = 0
        self._data: dict[int, Any] = {}
        self._order: OrderedDict[int, None] = OrderedDict()
        if policy == "belady":
            if sequence is None:
                raise InvalidValue("the belady policy needs the access sequence")
            seq = np.ascontiguousarray(sequence, dtype=np.int64)
            nk = int(num_keys if num_keys is not None else (seq.max() + 1 if seq.size else 1))
            self._seq: np.ndarray | None = seq
            self._next = next_use(seq, nk) if seq.size else np.zeros(0, dtype=np.int64)
            self._resident_next: dict[int, int] = {}
            self._heap: list[tuple[int, int]] = []
        else:
            self._seq = None if sequence is None else np.asarray(sequence, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._data) if self.policy == "belady" else len(self._order)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def stats(self) -> dict:
        return {"policy": self.policy, "capacity_chunks": self.capacity, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions, "bypasses": self.bypasses,
                "hit_ratio": self.hit_ratio}

    def _load(self, key: int) -> Any:
        return None if self.loader is None else self.loader(key)

    def get(self, key: int) -> Any:
        """The value of ``key`` (the next key of the sequence under ``belady``)."""
        key = int(key)
        if self.policy == "belady":
            return self._get_belady(key)
        if key in self._order:
            self.hits += 1
            if self.policy == "lru":
                self._order.move_to_end(key)
            return self._data.get(key)
        self.misses += 1
        value = self._load(key)
        if self.capacity == 0:
            self.bypasses += 1
            return value
        if len(self._order) >= self.capacity:
            old, _ = self._order.popitem(last=False)
            self._data.pop(old, None)
            self.evictions += 1
        self._order[key] = None
        if self.loader is not None:
            self._data[key] = value
        return value

    def _get_belady(self, key: int) -> Any:
        i = self._pos
        seq = self._seq
        assert seq is not None  # the belady policy always has its sequence (see __init__)
        if i >= seq.size or seq[i] != key:
            raise RuntimeError(f"cache access {i} is chunk {key}, the plan says "
                               f"{seq[i] if i < seq.size else 'end'}")
        self._pos += 1
        nxt = int(self._next[i])
        if key in self._resident_next:
            self.hits += 1
            self._resident_next[key] = nxt
            heapq.heappush(self._heap, (-nxt, key))
            return self._data.get(key)
        self.misses += 1
        value = self._load(key)
        never = nxt >= seq.size
        if self.capacity == 0 or never:
            self.bypasses += 1
            return value
        if len(self._resident_next) >= self.capacity:
            far, victim = self._furthest()
            if nxt >= far:
                self.bypasses += 1
                return value
            heapq.heappop(self._heap)
            del self._resident_next[victim]
            self._data.pop(victim, None)
            self.evictions += 1
        self._resident_next[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))
        self._data[key] = value
        return value

    def _furthest(self) -> tuple[int, int]:
        # lazy deletion: drop heap entries that no longer describe a resident
        while True:
            negn, k = self._heap[0]
            if self._resident_next.get(k) == -negn:
                return -negn, k
            heapq.heappop(self._heap)


def simulate(sequence: np.ndarray, capacity: int, policy: str, num_keys: int | None = None) -> dict:
    """Hits and misses of ``policy`` with ``capacity`` chunks over ``sequence`` (no I/O)."""
    c = ChunkCache(capacity, policy, sequence=sequence, num_keys=num_keys)
    for k in np.asarray(sequence, dtype=np.int64).tolist():
        c.get(k)
    return c.stats()
