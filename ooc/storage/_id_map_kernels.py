"""numba kernels of :class:`ooc.storage.id_map.IdMap`: open addressing, linear probing.

A table is ``keys`` (int32 or int64 [H], ``EMPTY`` where free) and ``vals``
(int32 or int64 [H]), H a power of two; key k starts probing at the top
``bits`` bits of ``k * GOLDEN`` (Fibonacci hashing), ``shift = 64 - bits``.
Removal shifts the later entries of the probe run back (no tombstones), so a
lookup stops at the first free place.

``shift == 0`` marks a direct table instead: ``vals`` has a place for every
key (``vals[k]``, -1 where absent) and ``keys`` is unused. :class:`IdMap`
takes it where it is the smaller of the two.

Callers inline these functions into their own kernels, and numba keys a
cached kernel by its own file only: after editing this file, clear the
cached kernels (:func:`ooc.core.jit.clear_kernel_cache`) or the callers keep the
old code.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ooc.core._random_kernels import GOLDEN as _GOLDEN
from ooc.core.threading_layer import parallel_kernel

EMPTY = -1


@nb.njit(inline="always", cache=True)
def _home(k, shift):
    return np.int64((np.uint64(k) * _GOLDEN) >> np.uint64(shift))


@nb.njit(inline="always", cache=True)
def find(keys, vals, shift, k):
    """The value of key ``k``, or -1 when absent."""
    if shift == 0:
        return np.int64(vals[k])
    mask = keys.shape[0] - 1
    i = _home(k, shift)
    while True:
        x = keys[i]
        if x == k:
            return np.int64(vals[i])
        if x == EMPTY:
            return np.int64(-1)
        i = (i + 1) & mask


@nb.njit(inline="always", cache=True)
def put(keys, vals, shift, k, v):
    """Set key ``k`` to ``v`` (the caller keeps the table under half full)."""
    if shift == 0:
        vals[k] = v
        return
    mask = keys.shape[0] - 1
    i = _home(k, shift)
    while True:
        x = keys[i]
        if x == EMPTY or x == k:
            keys[i] = k
            vals[i] = v
            return
        i = (i + 1) & mask


@nb.njit(inline="always", cache=True)
def remove(keys, vals, shift, k):
    """Remove key ``k``; its value, or -1 when it was absent."""
    if shift == 0:
        old = np.int64(vals[k])
        vals[k] = EMPTY
        return old
    mask = keys.shape[0] - 1
    i = _home(k, shift)
    while True:
        x = keys[i]
        if x == EMPTY:
            return np.int64(-1)
        if x == k:
            break
        i = (i + 1) & mask
    old = np.int64(vals[i])
    # backward shift: move each later entry of the run into the hole when its home
    # does not lie cyclically in (hole, its place]
    j = i
    while True:
        j = (j + 1) & mask
        x = keys[j]
        if x == EMPTY:
            break
        h = _home(x, shift)
        if (j > i and (h <= i or h > j)) or (j < i and (h <= i and h > j)):
            keys[i] = x
            vals[i] = vals[j]
            i = j
    keys[i] = EMPTY
    return old


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def find_many(keys, vals, shift, ids, out):
    """out[i] = value of ids[i], -1 when absent (ids int64 [n], out int64 [n])."""
    for i in nb.prange(ids.shape[0]):
        out[i] = find(keys, vals, shift, ids[i])


@nb.njit(nogil=True, cache=True)
def put_many(keys, vals, shift, ids, values):
    """Set ids[i] to values[i] for every i (in order: a later repeat wins)."""
    for i in range(ids.shape[0]):
        put(keys, vals, shift, ids[i], values[i])


@nb.njit(nogil=True, cache=True)
def remove_many(keys, vals, shift, ids, out):
    """Remove every ids[i]; out[i] = its value, -1 when it was absent."""
    for i in range(ids.shape[0]):
        out[i] = remove(keys, vals, shift, ids[i])
