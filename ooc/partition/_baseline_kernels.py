"""numba kernels of the streaming edge partitioners (vertex-cut baselines).

One kernel walks a chunk of the edge stream and assigns each edge to a
partition with the chosen rule; it keeps the per-partition edge loads, the
replica set ``A(v)`` of every node as a bitmap (uint64 [N, ceil(p/64)]) and
the Boyer-Moore majority votes that later decide node ownership.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ooc.partition._kernels import hash_node, mix64, vote

_NB = dict(nogil=True, cache=True)

HASH, DBH, GREEDY, HDRF = 0, 1, 2, 3


@nb.njit(**_NB)
def _has(bits, v, q):
    return (bits[v, q >> 6] >> np.uint64(q & 63)) & np.uint64(1)


@nb.njit(**_NB)
def _least_loaded_in(bits, w, load, p):
    best = -1
    for q in range(p):
        if _has(bits, w, q) and (best < 0 or load[q] < load[best]):
            best = q
    return best


@nb.njit(**_NB)
def _least_loaded_both(bits, u, v, load, p):
    best = -1
    for q in range(p):
        if _has(bits, u, q) and _has(bits, v, q) and (best < 0 or load[q] < load[best]):
            best = q
    return best


@nb.njit(**_NB)
def _least_loaded(load, p):
    best = 0
    for q in range(1, p):
        if load[q] < load[best]:
            best = q
    return best


@nb.njit(inline="always")
def _greedy_choice(bits, u, v, load, rem, p):
    """PowerGraph's greedy rule for edge (u, v): the least loaded partition holding both,
    else one holding the endpoint with more unassigned edges (``rem``), else the least
    loaded of all. Counts the edge off ``rem``."""
    q = _least_loaded_both(bits, u, v, load, p)
    if q < 0:
        hu = _least_loaded_in(bits, u, load, p)
        hv = _least_loaded_in(bits, v, load, p)
        if hu >= 0 and hv >= 0:
            q = hu if rem[u] > rem[v] else hv
        elif hu >= 0:
            q = hu
        elif hv >= 0:
            q = hv
        else:
            q = _least_loaded(load, p)
    rem[u] -= 1
    rem[v] -= 1
    return q


@nb.njit(inline="always")
def _hdrf_choice(bits, u, v, deg, load, p, lam, eps):
    """HDRF for edge (u, v): the partition of the best replication score (the endpoint of
    lower partial degree ``deg`` counts more) plus ``lam`` times the balance score.
    Counts the edge into ``deg``."""
    deg[u] += 1
    deg[v] += 1
    du = deg[u]
    dv = deg[v]
    tu = du / (du + dv)
    tv = 1.0 - tu
    mx = load[0]
    mn = load[0]
    for r in range(1, p):
        if load[r] > mx:
            mx = load[r]
        if load[r] < mn:
            mn = load[r]
    best = -1.0
    q = 0
    for r in range(p):
        score = lam * (mx - load[r]) / (eps + mx - mn)
        if _has(bits, u, r):
            score += 2.0 - tu
        if _has(bits, v, r):
            score += 2.0 - tv
        if score > best:
            best = score
            q = r
    return q


@nb.njit(**_NB)
def edge_chunk(algo, indptr, a, first_dst, src, p, seed, deg, rem, bits, load,
               cand_in, cnt_in, cand_out, cnt_out, lam, eps, last):
    """Assign the edges of one chunk (see the module docstring).

    ``deg``: total degrees (DBH, greedy) or partial degrees counted here
    (HDRF); ``rem``: unassigned incident edges per node (greedy); ``last``:
    int32 [N] set to the partition of each node's latest in-edge, or an
    empty array when not wanted.
    """
    track_last = last.shape[0] > 0
    dst = first_dst
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        u = np.int64(src[i])
        v = np.int64(dst)
        if algo == HASH:
            q = np.int64(mix64(np.uint64(u) * np.uint64(0x9E3779B97F4A7C15)
                               + np.uint64(v) + np.uint64(seed)) % np.uint64(p))
        elif algo == DBH:
            w = u if deg[u] < deg[v] else v
            q = hash_node(w, seed, p)
        elif algo == GREEDY:
            q = _greedy_choice(bits, u, v, load, rem, p)
        else:  # HDRF
            q = _hdrf_choice(bits, u, v, deg, load, p, lam, eps)
        load[q] += 1
        bits[u, q >> 6] |= np.uint64(1) << np.uint64(q & 63)
        bits[v, q >> 6] |= np.uint64(1) << np.uint64(q & 63)
        vote(cand_in, cnt_in, v, q)
        vote(cand_out, cnt_out, u, q)
        if track_last:
            last[v] = q
