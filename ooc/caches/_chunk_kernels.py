"""Numba kernels of the inference chunk cache (:mod:`.chunk_cache`)."""
import numba
import numpy as np


@numba.njit(cache=True)
def next_use(seq, num_keys):
    """For every position i of ``seq``, the next position holding the same
    key, or ``len(seq)`` when there is none (Belady's look-ahead)."""
    n = seq.shape[0]
    nxt = np.empty(n, dtype=np.int64)
    last = np.full(num_keys, n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        k = seq[i]
        nxt[i] = last[k]
        last[k] = i
    return nxt
