"""A map from node ids to slots sized by how many it holds, not by the node count.

The caches address their rows through an :class:`IdMap`: an open-addressing
hash table (linear probing, kept at most half full) of ``capacity`` entries.
Its memory is ``2..4 * capacity`` places of a key and a value: with int32
keys and values 16 to 32 bytes per cached entry, whatever the graph's node
count, where a direct table costs 4 or 8 bytes for every node of the graph
(444 MiB or 888 MiB at 111M nodes) before anything is cached. Where the
direct table is the smaller (a cache of most of a small graph's nodes), the
map is one (one lookup, no probing); the kernels do not tell them apart.

The kernels that look ids up inside their own loops import
:func:`~ooc.storage._id_map_kernels.find` and take ``(keys, vals, shift)``.
"""
from __future__ import annotations

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.storage import _id_map_kernels as K

_INT32_MAX = np.iinfo(np.int32).max


def _int_type(largest: int) -> np.dtype:
    """int32 when ``largest`` fits, else int64: the type of the map's keys or values."""
    return np.dtype(np.int32 if largest <= _INT32_MAX else np.int64)


class IdMap:
    """Node id -> slot for up to ``capacity`` ids.

    Args:
        capacity: the most ids held at once (inserting more raises).
        max_key: the largest id ever stored (decides int32 or int64 keys).
        max_value: the largest value ever stored (decides int32 or int64 values).

    Attributes:
        keys: int32/int64 [H] (``-1`` free), ``vals``: int32/int64 [H];
        ``shift``: ``64 - log2(H)``, the kernels' third argument. A direct table
        has ``shift`` 0, no keys and ``vals`` [max_key + 1] (-1 where absent).
    """

    def __init__(self, capacity: int, max_key: int, max_value: int | None = None):
        if capacity < 0:
            raise InvalidValue(f"IdMap capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        size = 1 << max(3, (2 * self.capacity - 1).bit_length())  # at most half full
        self.shift = 64 - (size.bit_length() - 1)
        kt = _int_type(max_key)
        vt = _int_type(self.capacity if max_value is None else max_value)
        self.count = 0
        if (int(max_key) + 1) * vt.itemsize <= size * (kt.itemsize + vt.itemsize):
            self.shift = 0  # direct: vals[k] for every key k
            self.keys = np.zeros(0, dtype=kt)
            self.vals = np.full(int(max_key) + 1, K.EMPTY, dtype=vt)
            return
        self.keys = np.full(size, K.EMPTY, dtype=kt)
        self.vals = np.zeros(size, dtype=vt)

    @staticmethod
    def max_bytes_per_entry(max_key: int, max_value: int) -> int:
        """The most bytes the hash table takes per entry it holds (4 places of key and
        value)."""
        return 4 * (_int_type(max_key).itemsize + _int_type(max_value).itemsize)

    @staticmethod
    def max_bytes(capacity: int, max_key: int, max_value: int) -> int:
        """The most a map of ``capacity`` entries takes: the hash table's bound, or the
        direct table where that is smaller (the map takes whichever is smaller)."""
        direct = (int(max_key) + 1) * _int_type(max_value).itemsize
        return min(direct, int(capacity) * IdMap.max_bytes_per_entry(max_key, max_value))

    @property
    def direct(self) -> bool:
        """Whether the map is a direct table (see the module docstring)."""
        return self.shift == 0

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.vals.nbytes)

    def __len__(self) -> int:
        return self.count

    @property
    def table(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(keys, vals, shift)`` for kernels that call ``find`` themselves."""
        return self.keys, self.vals, self.shift

    def get(self, ids: np.ndarray) -> np.ndarray:
        """int64 [n]: the value of each of ``ids`` (int64 [n]), -1 where absent."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(ids.shape[0], np.int64)
        if ids.shape[0]:
            K.find_many(self.keys, self.vals, self.shift, ids, out)
        return out

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Map each of ``ids`` (int64 [n], not already present) to ``values`` (int [n])."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if self.count + ids.shape[0] > self.capacity:
            raise InvalidValue(f"IdMap: {self.count} + {ids.shape[0]} ids exceed its capacity "
                               f"{self.capacity}")
        if ids.shape[0]:
            K.put_many(self.keys, self.vals, self.shift, ids,
                       np.ascontiguousarray(values, dtype=np.int64).reshape(-1))
        self.count += ids.shape[0]

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Remove ``ids`` (int64 [n]); int64 [n] of their values, -1 where absent."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(ids.shape[0], np.int64)
        if ids.shape[0]:
            K.remove_many(self.keys, self.vals, self.shift, ids, out)
        self.count -= int((out >= 0).sum())
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, values)``: int64 [len(self)] each, in table order (not sorted)."""
        if self.direct:
            ids = np.flatnonzero(self.vals != K.EMPTY).astype(np.int64)
            return ids, self.vals[ids].astype(np.int64)
        held = self.keys != K.EMPTY
        return self.keys[held].astype(np.int64), self.vals[held].astype(np.int64)

    def ids(self) -> np.ndarray:
        """int64 [len(self)]: the ids held, sorted."""
        if self.direct:
            return np.flatnonzero(self.vals != K.EMPTY).astype(np.int64)
        return np.sort(self.keys[self.keys != K.EMPTY].astype(np.int64))
