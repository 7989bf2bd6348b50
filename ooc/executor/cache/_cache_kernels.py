"""numba kernels of the feature cache (lookups through the id map, row copies)."""
from __future__ import annotations

import numba as nb

from ...storage._id_map_kernels import find
from ...threading_layer import parallel_kernel


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def gather_hits(ids, keys, vals, shift, cache, out, hit):
    """Copy cached rows of ``ids`` into ``out``; mark hits.

    ids int64 [n]; ``(keys, vals, shift)`` the id map of the cached rows
    (:attr:`ooc.storage.id_map.IdMap.table`); cache [C, D]; out [n, D]; hit bool
    [n] (written). Returns the number of hits.
    """
    n = ids.shape[0]
    d = cache.shape[1]
    count = 0
    for i in nb.prange(n):
        slot = find(keys, vals, shift, ids[i])
        if slot >= 0:
            for j in range(d):
                out[i, j] = cache[slot, j]
            hit[i] = True
            count += 1
        else:
            hit[i] = False
    return count


@parallel_kernel
@nb.njit(parallel=True, nogil=True, cache=True)
def copy_slot_rows(slots, cache, out):
    """``out[i] = cache[slots[i]]`` where ``slots[i] >= 0`` (the hits of a batch whose ids
    were looked up first); other rows of ``out`` are left as they are.

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


