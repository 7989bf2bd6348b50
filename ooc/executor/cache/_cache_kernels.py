"""numba kernels of the feature cache (direct addressing, row copies)."""
from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(parallel=True, nogil=True, cache=True)
def gather_hits(ids, address_table, cache, out, hit):
    """Copy cached rows of ``ids`` into ``out``; mark hits.

    ids int64 [n]; address_table int32 [N] (-1 = not cached); cache [C, D];
    out [n, D]; hit bool [n] (written). Returns the number of hits.
    """
    n = ids.shape[0]
    d = cache.shape[1]
    count = 0
    for i in nb.prange(n):
        slot = address_table[ids[i]]
        if slot >= 0:
            for j in range(d):
                out[i, j] = cache[slot, j]
            hit[i] = True
            count += 1
        else:
            hit[i] = False
    return count


@nb.njit(parallel=True, nogil=True, cache=True)
def scatter_rows(rows, positions, out):
    """out[positions[k]] = rows[k] for every k (rows [m, D], positions int64 [m])."""
    d = rows.shape[1]
    for k in nb.prange(positions.shape[0]):
        p = positions[k]
        for j in range(d):
            out[p, j] = rows[k, j]


@nb.njit(nogil=True, cache=True)
def assign_slots(address_table, in_ids, out_ids, free, num_free):
    """Evict ``out_ids`` and give each of ``in_ids`` a slot.

    Freed slots go on the ``free`` stack (int64 [C], ``num_free`` entries in
    use). Returns (slots int64 [len(in_ids)], new num_free).
    """
    for k in range(out_ids.shape[0]):
        s = address_table[out_ids[k]]
        if s >= 0:
            address_table[out_ids[k]] = -1
            free[num_free] = s
            num_free += 1
    slots = np.empty(in_ids.shape[0], np.int64)
    for k in range(in_ids.shape[0]):
        if num_free == 0:
            return slots[:k], -1
        num_free -= 1
        s = free[num_free]
        slots[k] = s
        address_table[in_ids[k]] = s
    return slots, num_free


@nb.njit(parallel=True, nogil=True, cache=True)
def copy_rows_to_slots(src, src_pos, cache, slots):
    """cache[slots[k]] = src[src_pos[k]]: direct row copies, no staging buffer."""
    d = cache.shape[1]
    for k in nb.prange(slots.shape[0]):
        s = slots[k]
        p = src_pos[k]
        for j in range(d):
            cache[s, j] = src[p, j]


