"""The feature cache (Ginex §3.3, Fig. 11): rows in a 2-D array, found through an id map.

``slots`` (an :class:`~ooc.storage.id_map.IdMap`) maps a cached node to its
row in ``cache`` ([capacity, D], the file's dtype). Ginex addresses rows with a
table of N entries; the map costs 16 to 32 bytes per cached row instead, so
what the cache costs does not grow with the graph's node count. The cache is
filled from a superbatch's ``init_ids`` (the "switch"), serves the hits of each
gather, and
after batch i applies the changeset: each evicted id's row is overwritten by
an inserted id's row copied straight from the batch buffer at its
``in_position`` — no intermediate gather buffer.

A ``static`` cache (PaGraph) is the same structure filled once and never
updated.

Several loaders may share one cache (:func:`ooc.memory_budget`): a lock makes
each switch, update and hit copy whole, so a reader never sees a row half
replaced; the reads of misses run outside it. A gather with many hits reads its misses
on a thread of its own while it copies the hits, so the disk is busy through the copy.
"""
from __future__ import annotations

import threading
from typing import Protocol, cast

import numpy as np

from ooc.caches import _cache_kernels as K
from ooc.core.errors import InvalidValue
from ooc.core.worker import Worker
from ooc.storage.features import Feature
from ooc.storage.id_map import IdMap


class RowSource(Protocol):
    """What the cache reads missing rows from: the ``read`` of a
    :class:`~ooc.storage.features.Feature` (any Feature will do). A source that also
    has ``read_into(ids, out, rows)`` (:class:`~ooc.storage.direct.DirectFeatures`)
    gets a gather's misses read straight into the batch's rows; a gather with page-mates
    calls ``read_into(ids, out, rows, (ids2, out2, rows2))`` to read them in the same
    request."""

    def read(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...


def _bits(a: np.ndarray) -> np.ndarray:
    """The same memory viewed as unsigned ints of the item size (numba has no
    float16; the kernels only copy bits)."""
    return a.view(f"u{a.dtype.itemsize}")


def row_cost(row_bytes: int, num_nodes: int) -> int:
    """The most bytes one row of a :class:`FeatureCache` costs: the row, its place on
    the stack of free rows (int64) and the id map's places for it (at most 32 bytes,
    48 when ids pass int32)."""
    return int(row_bytes) + 8 + IdMap.max_bytes_per_entry(max(0, int(num_nodes) - 1), 2**31 - 1)


#: Bytes of hits from which a gather copies them while another thread reads its misses
#: (below, starting the thread costs about what the copy takes).
OVERLAP_MIN_BYTES = 1 << 20


def _read_misses(read_into, ids: np.ndarray, miss_pos: np.ndarray, out: np.ndarray,
                 mates: np.ndarray, mates_out: np.ndarray | None) -> None:
    """Read the rows of ``ids[miss_pos]`` into ``out[miss_pos]`` through the source's
    ``read_into``, with the page-mates ``mates`` into ``mates_out`` in the same request."""
    if len(mates):
        read_into(ids[miss_pos], out, miss_pos,
                  (mates, mates_out, np.arange(len(mates), dtype=np.int64)))
    else:
        read_into(ids[miss_pos], out, miss_pos)


class FeatureCache:
    """Feature cache of ``capacity`` rows.

    Args:
        num_nodes: N, the graph's node count (ids are in [0, N)).
        capacity: rows the cache holds (0 disables it).
        dim, dtype: feature row shape and dtype (the file's).
    """

    def __init__(self, num_nodes: int, capacity: int, dim: int, dtype: np.dtype | str):
        if capacity < 0:
            raise InvalidValue(f"feature cache capacity must be >= 0, got {capacity}")
        self.num_nodes = int(num_nodes)
        self.capacity = int(min(capacity, num_nodes))
        self.slots = IdMap(self.capacity, max(0, self.num_nodes - 1))
        self.cache = np.empty((self.capacity, dim), dtype=np.dtype(dtype))
        self._free = np.arange(self.capacity, dtype=np.int64)[::-1].copy()
        self._num_free = self.capacity
        self.hits = 0
        self.lookups = 0
        #: page-mates read with the batches' misses (see :meth:`gather`)
        self.mates_read = 0
        #: rows read per source request during a switch (bounds its buffers)
        self.switch_chunk = 8192
        self._lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes + self.slots.nbytes + self._free.nbytes

    def __len__(self) -> int:
        return self.capacity - self._num_free

    def cached_ids(self) -> np.ndarray:
        """int64 ids currently cached (sorted)."""
        return self.slots.ids()

    def switch(self, init_ids: np.ndarray, source: RowSource) -> int:
        """Make the cache hold exactly ``init_ids`` (≤ capacity).

        Rows already cached stay where they are; others are evicted and the
        missing ones read from ``source``. Returns the number of rows read.
        """
        with self._lock:
            init_ids = np.asarray(init_ids, dtype=np.int64)
            if len(init_ids) > self.capacity:
                raise InvalidValue(f"init set of {len(init_ids)} ids exceeds cache capacity {self.capacity}")
            # rows that stay: those of init ids already cached; the rest of the cached go
            # (no sort: one pass over the map, one over the init set)
            at = self.slots.get(init_ids)
            stay = np.zeros(self.capacity, dtype=bool)
            stay[at[at >= 0]] = True
            held, rows = self.slots.items()
            evict = held[~stay[rows]]
            new = init_ids[at < 0]
            slots = self._assign(new, evict)
            storage_order = getattr(source, "storage_order", None)
            if storage_order is not None and len(new) > self.switch_chunk:
                by = storage_order(new)   # each chunk a stretch of the file (rows reordered)
                new, slots = new[by], slots[by]
            # in chunks, so a read's buffers stay the size of a batch, not of the cache;
            # straight into the slots when the source can
            read_into = getattr(source, "read_into", None)
            for a in range(0, len(new), self.switch_chunk):
                b = min(len(new), a + self.switch_chunk)
                if read_into is not None:
                    read_into(new[a:b], self.cache, slots[a:b])
                    continue
                rows = source.read(new[a:b])
                K.copy_rows_to_slots(_bits(np.ascontiguousarray(rows, dtype=self.cache.dtype)),
                                     np.arange(b - a, dtype=np.int64), _bits(self.cache), slots[a:b])
            return len(new)

    def gather(self, ids: np.ndarray, source: RowSource, out: np.ndarray | None = None,
               mates: np.ndarray | None = None, mates_out: np.ndarray | None = None
               ) -> tuple[np.ndarray, int]:
        """Rows of ``ids`` (int64 [n]) into ``out`` ([n, D]): hits from the
        cache, misses in one batched read from ``source`` (into ``out``'s rows when
        the source can; ``python -m bench gather`` compares the two).

        ``mates`` (int64 [k], not cached): rows the changeset inserts after this batch
        that share pages with its misses; read into ``mates_out`` ([k, D]) in the same
        request, so their pages are read once. They are neither lookups nor misses.

        Returns (out, number of misses among ``ids``).
        """
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        if out is None:
            out = np.empty((n, self.cache.shape[1]), dtype=self.cache.dtype)
        mates = np.zeros(0, np.int64) if mates is None else np.asarray(mates, dtype=np.int64)
        k = len(mates)
        if k:
            assert mates_out is not None and len(mates_out) == k
        read_into = getattr(source, "read_into", None)
        # no row buffer, no scatter: the misses go straight into their rows of ``out``
        direct = read_into is not None and out.flags.c_contiguous
        reading: Worker | None = None
        with self._lock:
            slots = self.slots.get(ids)
            miss_pos = np.flatnonzero(slots < 0)
            nhit = n - len(miss_pos)
            if direct and (len(miss_pos) or k) and \
                    nhit * self.cache.itemsize * self.cache.shape[1] >= OVERLAP_MIN_BYTES:
                # the misses are read on another thread while this one copies the hits
                # (other rows of the same array): the disk works through the copy
                reading = Worker(lambda put, stopped: _read_misses(
                    read_into, ids, miss_pos, out, mates, mates_out), 1, "ooc-miss-read").start()
            if nhit:
                K.copy_slot_rows(slots, _bits(self.cache), _bits(out))
        if reading is not None:
            for _ in reading:  # waits for the read; raises what it raised
                pass
        elif direct and (len(miss_pos) or k):
            _read_misses(read_into, ids, miss_pos, out, mates, mates_out)
        elif len(miss_pos) or k:
            rows = source.read(np.concatenate((ids[miss_pos], mates)) if k else ids[miss_pos])
            rows = np.ascontiguousarray(rows, dtype=out.dtype)
            K.scatter_rows(_bits(rows[:len(miss_pos)]), miss_pos, _bits(out))
            if k:
                assert mates_out is not None
                mates_out[:] = rows[len(miss_pos):]
        with self._lock:
            self.hits += int(nhit)
            self.lookups += n
            self.mates_read += k
        return out, len(miss_pos)

    def update(self, in_ids: np.ndarray, out_ids: np.ndarray, in_positions: np.ndarray,
               batch_rows: np.ndarray, mate_rows: np.ndarray | None = None) -> None:
        """Apply one changeset: evict ``out_ids``, insert ``in_ids`` with rows
        ``batch_rows[in_positions]`` ([n, D] batch buffer of the gather); positions
        ``n + j`` are row ``j`` of ``mate_rows`` (the page-mates :meth:`gather` read)."""
        in_ids = np.asarray(in_ids, dtype=np.int64)
        pos = np.asarray(in_positions, dtype=np.int64)
        with self._lock:
            slots = self._assign(in_ids, np.asarray(out_ids, dtype=np.int64))
            if not len(in_ids):
                return
            n = len(batch_rows)
            if mate_rows is None or not len(mate_rows):
                K.copy_rows_to_slots(_bits(batch_rows), pos, _bits(self.cache), slots)
                return
            own = pos < n
            K.copy_rows_to_slots(_bits(batch_rows), pos[own], _bits(self.cache), slots[own])
            K.copy_rows_to_slots(_bits(mate_rows), pos[~own] - n, _bits(self.cache),
                                 slots[~own])

    def _assign(self, in_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Evict ``out_ids`` (int64, cached or not), then give each of ``in_ids`` (int64,
        not cached) a free row; returns their rows (int64 [len(in_ids)]). Freed rows go
        on a stack of free rows and are the first taken."""
        old = self.slots.remove(out_ids)
        freed = old[old >= 0]
        f = self._num_free
        self._free[f:f + len(freed)] = freed
        f += len(freed)
        k = len(in_ids)
        if k > f:
            self._num_free = f
            raise InvalidValue(f"changeset inserts {k} ids but the cache has room for {f}")
        slots = self._free[f - k:f][::-1].copy()
        self._num_free = f - k
        self.slots.put(in_ids, slots)
        return slots

    def fill_static(self, ids: np.ndarray, source: RowSource) -> None:
        """Fill once with ``ids`` (the static PaGraph policy)."""
        self.switch(np.asarray(ids, dtype=np.int64)[: self.capacity], source)


class CachedFeature:
    """A :class:`~ooc.storage.features.Feature` served through a :class:`FeatureCache`:
    hits from the cache, misses from ``fallback`` (GraphBolt's cached feature over a
    disk feature). The cache's content is its policy's business; this only reads.
    """

    def __init__(self, cache: FeatureCache, fallback: Feature):
        self.cache = cache
        self.fallback = fallback
        #: rows read from ``fallback`` by this object (several may share one cache)
        self.misses = 0
        self._lock = threading.Lock()

    @property
    def shape(self) -> tuple[int, int]:
        return cast("tuple[int, int]", tuple(self.fallback.shape))  # a Feature's shape: [rows, dim]

    @property
    def dtype(self) -> np.dtype:
        return self.fallback.dtype

    def read(self, ids: np.ndarray, out: np.ndarray | None = None,
             mates: np.ndarray | None = None, mates_out: np.ndarray | None = None
             ) -> np.ndarray:
        """Rows of ``ids`` (int64 [n]) as [n, dim]; with ``mates`` (int64 [k]), the
        page-mates' rows into ``mates_out`` [k, dim] (:meth:`FeatureCache.gather`)."""
        rows, miss = self.cache.gather(ids, self.fallback, out, mates, mates_out)
        with self._lock:
            self.misses += miss
        return rows

    def stats(self) -> dict:
        c = self.cache
        return {"lookups": c.lookups, "hits": c.hits, "misses": self.misses,
                "hit_ratio": c.hits / c.lookups if c.lookups else 0.0,
                "page_mates_read": c.mates_read}

    def close(self) -> None:
        self.fallback.close()
