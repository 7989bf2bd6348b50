"""numba kernels of the packed data path: the Belady cache replayed on a bitset."""
from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def set_bits(bits, ids, value):
    """Set (``value`` True) or clear the bits of ``ids`` (int64 [n]) in ``bits`` (uint8 [N/8+1])."""
    for i in range(ids.shape[0]):
        v = ids[i]
        if value:
            bits[v >> 3] |= np.uint8(1 << (v & 7))
        else:
            bits[v >> 3] &= np.uint8(~(1 << (v & 7)) & 0xFF)


@nb.njit(nogil=True, cache=True)
def window_misses(bits, node_ids, node_ptr, in_ids, in_ptr, out_ids, out_ptr, j0, max_rows,
                  max_batches):
    """The misses of batches ``j0, j0+1, ...`` of a superbatch, replaying its changesets on
    the residency bitset ``bits`` (uint8 [N/8+1], the cache before batch ``j0``; updated to
    the cache after the last batch taken).

    Batch j's ids are ``node_ids[node_ptr[j]:node_ptr[j+1]]`` (int64); its step inserts
    ``in_ids[in_ptr[j]:in_ptr[j+1]]`` and evicts ``out_ids[out_ptr[j]:out_ptr[j+1]]``. Batches
    are taken while their misses total at most ``max_rows`` (the first always), at most
    ``max_batches`` of them.

    Returns ``(j1, misses int64 [m], miss_ptr int64 [j1 - j0 + 1])``: batch ``j0 + t``
    misses ``misses[miss_ptr[t]:miss_ptr[t+1]]``, in the batch's order.
    """
    s = node_ptr.shape[0] - 1
    cap = max(max_rows, node_ptr[j0 + 1] - node_ptr[j0]) if j0 < s else 0
    misses = np.empty(cap, np.int64)
    ptr = np.zeros(s - j0 + 1, np.int64)
    k = 0
    j = j0
    while j < s and j - j0 < max_batches:
        a, b = node_ptr[j], node_ptr[j + 1]
        cnt = 0
        for i in range(a, b):
            v = node_ids[i]
            if not (bits[v >> 3] >> (v & 7)) & 1:
                cnt += 1
        if j > j0 and k + cnt > max_rows:
            break
        for i in range(a, b):
            v = node_ids[i]
            if not (bits[v >> 3] >> (v & 7)) & 1:
                misses[k] = v
                k += 1
        for i in range(out_ptr[j], out_ptr[j + 1]):
            v = out_ids[i]
            bits[v >> 3] &= np.uint8(~(1 << (v & 7)) & 0xFF)
        for i in range(in_ptr[j], in_ptr[j + 1]):
            v = in_ids[i]
            bits[v >> 3] |= np.uint8(1 << (v & 7))
        j += 1
        ptr[j - j0] = k
    return j, misses[:k], ptr[: j - j0 + 1]
