"""numba kernels for Belady changesets and cache-policy miss counting.

Keys: a cache candidate's priority is the int64
``key = (next_iteration * 2 + flag) * M + local_id`` (smaller = kept first),
where ``flag`` is 0 for an entry that was cached before the current step and
1 for a miss of the current step, and ``M`` the size of the local id range.
All keys are distinct, so every selection is deterministic. Entries that are
never accessed again have ``next_iteration == S`` and are never kept.
"""
from __future__ import annotations

import numba
import numpy as np

# -- trace preprocessing -----------------------------------------------------


@numba.njit(cache=True, nogil=True)
def next_use(lid: np.ndarray, ptr: np.ndarray, M: int):
    """Next access iteration of every occurrence (backward scan).

    Args:
        lid: int64 [T] local ids in ``[0, M)``, batches concatenated.
        ptr: int64 [S+1] batch offsets into ``lid``.
    Returns:
        (nxt int64 [T] with ``S`` for "never again", index of the first
        duplicate id inside a batch or -1).
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    last = np.full(M, S, np.int32)  # S < 2**31 - 1 (checked by the caller)
    nxt = np.empty(T, np.int64)
    for i in range(S - 1, -1, -1):
        for p in range(ptr[i], ptr[i + 1]):
            x = lid[p]
            if last[x] == i:
                return nxt, p
            nxt[p] = last[x]
            last[x] = i
    return nxt, -1


# -- indexed binary max-heap ---------------------------------------------------


@numba.njit(cache=True, inline="always")
def _swap(hkey, hid, hpos, a, b):
    ka = hkey[a]
    hkey[a] = hkey[b]
    hkey[b] = ka
    ia = hid[a]
    hid[a] = hid[b]
    hid[b] = ia
    hpos[hid[a]] = a
    hpos[hid[b]] = b


@numba.njit(cache=True)
def _sift_up(hkey, hid, hpos, j):
    while j > 0:
        parent = (j - 1) >> 1
        if hkey[parent] >= hkey[j]:
            break
        _swap(hkey, hid, hpos, parent, j)
        j = parent


@numba.njit(cache=True)
def _sift_down(hkey, hid, hpos, j, size):
    while True:
        left = 2 * j + 1
        if left >= size:
            break
        big = left
        if left + 1 < size and hkey[left + 1] > hkey[left]:
            big = left + 1
        if hkey[j] >= hkey[big]:
            break
        _swap(hkey, hid, hpos, j, big)
        j = big


@numba.njit(cache=True)
def _remove(hkey, hid, hpos, j, size):
    """Remove heap slot j; returns the new size."""
    x = hid[j]
    size -= 1
    if j != size:
        hkey[j] = hkey[size]
        hid[j] = hid[size]
        hpos[hid[j]] = j
        _sift_up(hkey, hid, hpos, j)
        _sift_down(hkey, hid, hpos, hpos[hid[j]], size)
    hpos[x] = -1
    return size


# -- the Belady simulation -----------------------------------------------------


@numba.njit(cache=True, nogil=True)
def belady_simulate(lid: np.ndarray, nxt: np.ndarray, ptr: np.ndarray, M: int, K: int,
                    record: bool):
    """Per-step Belady over a batch trace (see module docstring for the keys).

    C_0 = the K ids with the smallest (first use, id); after batch i the cache
    becomes the K candidates of C_i ∪ ids_i with the smallest keys (finite
    next use only).

    Args:
        lid, nxt, ptr: as from :func:`next_use`.
        M: local id range; K: capacity; record: produce the changesets.
    Returns:
        (init int64 [<=K] sorted local ids, in_ids local [n_in] (per step in
        batch order), in_pos int64 [n_in], in_ptr [S+1], out_ids local
        [n_out] (per step sorted), out_ptr [S+1], misses int64 [S]).
        Without ``record`` only ``misses`` is filled (the rest empty).
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    hpos = np.full(M, -1, np.int32)
    cap = max(K, 1)
    hkey = np.empty(cap, np.int64)
    hid = np.empty(cap, np.int64)
    size = 0
    maxb = 0
    for i in range(S):
        maxb = max(maxb, ptr[i + 1] - ptr[i])
    scratch = np.empty(maxb, np.int64)
    # C_0: ids in order of first use, ties by id
    i = 0
    while i < S and size < K:
        nnew = 0
        for p in range(ptr[i], ptr[i + 1]):
            x = lid[p]
            if hpos[x] < 0:
                scratch[nnew] = x
                nnew += 1
        if nnew > K - size:
            scratch[:nnew].sort()
            nnew = K - size
        for q in range(nnew):
            x = scratch[q]
            hkey[size] = (i * 2) * M + x
            hid[size] = x
            hpos[x] = size
            size += 1
            _sift_up(hkey, hid, hpos, size - 1)
        i += 1
    init = np.sort(hid[:size].copy())
    n_rec = T if record else 0
    ins = np.empty(n_rec, np.int64)
    inpos = np.empty(n_rec, np.int64)
    outs = np.empty(n_rec + (K if record else 0), np.int64)
    in_ptr = np.zeros(S + 1, np.int64)
    out_ptr = np.zeros(S + 1, np.int64)
    misses = np.empty(S, np.int64)
    hit = np.empty(maxb, np.bool_)
    nin = 0
    nout = 0
    for i in range(S):
        a = ptr[i]
        b = ptr[i + 1]
        o0 = nout
        nh = 0
        # hits: new next use (dead ones leave the cache)
        for p in range(a, b):
            x = lid[p]
            j = hpos[x]
            h = j >= 0
            hit[p - a] = h
            if h:
                nh += 1
                n = nxt[p]
                if n >= S:
                    size = _remove(hkey, hid, hpos, j, size)
                    if record:
                        outs[nout] = x
                        nout += 1
                else:
                    hkey[j] = (n * 2) * M + x
                    _sift_up(hkey, hid, hpos, j)
        misses[i] = (b - a) - nh
        # misses: streaming top-K (replace the largest key when smaller)
        if K > 0:
            for p in range(a, b):
                if hit[p - a]:
                    continue
                n = nxt[p]
                if n >= S:
                    continue
                x = lid[p]
                key = (n * 2 + 1) * M + x
                if size < K:
                    hkey[size] = key
                    hid[size] = x
                    hpos[x] = size
                    size += 1
                    _sift_up(hkey, hid, hpos, size - 1)
                elif key < hkey[0]:
                    y = hid[0]
                    yk = hkey[0]
                    hpos[y] = -1
                    hkey[0] = key
                    hid[0] = x
                    hpos[x] = 0
                    _sift_down(hkey, hid, hpos, 0, size)
                    if record and ((yk // M) & 1) == 0:
                        outs[nout] = y
                        nout += 1
            # inserted misses become cached entries (flag 1 -> 0)
            for p in range(a, b):
                if hit[p - a]:
                    continue
                x = lid[p]
                j = hpos[x]
                if j >= 0:
                    if record:
                        ins[nin] = x
                        inpos[nin] = p - a
                        nin += 1
                    hkey[j] -= M
                    _sift_down(hkey, hid, hpos, j, size)
        if record:
            outs[o0:nout].sort()
        in_ptr[i + 1] = nin
        out_ptr[i + 1] = nout
    return init, ins[:nin], inpos[:nin], in_ptr, outs[:nout], out_ptr, misses


# -- LRU stack distances -------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def lru_stack_distances(lid: np.ndarray, ptr: np.ndarray, M: int) -> np.ndarray:
    """Batch-granular LRU stack distance of every access.

    The recency stamp of an id is the flat trace position of its last access;
    the cache of capacity K during batch i holds the K ids with the largest
    stamps among accesses before batch i. An access is a hit iff its distance
    (number of distinct ids with a larger stamp, counting only batches < i)
    is < K. Cold accesses get ``2**62``.

    Returns: int64 [T].
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    last = np.full(M, -1, np.int64)
    tree = np.zeros(T + 1, np.int64)  # Fenwick over flat positions
    dist = np.empty(T, np.int64)
    big = np.int64(1) << 62
    for i in range(S):
        a = ptr[i]
        b = ptr[i + 1]
        # prefix(a) = number of "latest" markers at positions < a
        tot = 0
        q = a
        while q > 0:
            tot += tree[q]
            q -= q & (-q)
        for p in range(a, b):
            lp = last[lid[p]]
            if lp < 0:
                dist[p] = big
            else:
                s = 0
                q = lp + 1
                while q > 0:
                    s += tree[q]
                    q -= q & (-q)
                dist[p] = tot - s
        for p in range(a, b):
            x = lid[p]
            lp = last[x]
            if lp >= 0:
                q = lp + 1
                while q <= T:
                    tree[q] -= 1
                    q += q & (-q)
            q = p + 1
            while q <= T:
                tree[q] += 1
                q += q & (-q)
            last[x] = p
    return dist
