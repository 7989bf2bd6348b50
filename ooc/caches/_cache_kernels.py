"""numba kernels of the feature cache (row copies; lookups go through the id map's)."""
from __future__ import annotations

import numba as nb

from ooc.core.threading_layer import parallel_kernel


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def copy_slot_rows(slots, cache, out):
    """``out[i] = cache[slots[i]]`` where ``slots[i] >= 0``: the hits of a batch whose ids
    were looked up first (``IdMap.get``); other rows of ``out`` are left as they are.

    slots int64 [n]; cache [C, D]; out [n, D] (the same unsigned-int view of the dtype).
    """
    d = cache.shape[1]
    for i in nb.prange(slots.shape[0]):
        s = slots[i]
        if s >= 0:
            for j in range(d):
                out[i, j] = cache[s, j]


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def scatter_rows(rows, positions, out):
    """out[positions[k]] = rows[k] for every k (rows [m, D], positions int64 [m])."""
    d = rows.shape[1]
    for k in nb.prange(positions.shape[0]):
        p = positions[k]
        for j in range(d):
            out[p, j] = rows[k, j]


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def copy_rows_to_slots(src, src_pos, cache, slots):
    """cache[slots[k]] = src[src_pos[k]]: direct row copies, no staging buffer."""
    d = cache.shape[1]
    for k in nb.prange(slots.shape[0]):
        s = slots[k]
        p = src_pos[k]
        for j in range(d):
            cache[s, j] = src[p, j]


