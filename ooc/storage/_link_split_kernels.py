"""Kernels of :mod:`ooc.storage.link_split`: holding edges out of a CSC adjacency."""
from __future__ import annotations

import numpy as np
from numba import njit

from ooc.core._random_kernels import GOLDEN as _GOLDEN
from ooc.core._random_kernels import mix64 as _mix

_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0


@njit(inline="always")
def pair_uniform(seed, a, b, n):
    """A uniform draw in [0, 1) of the unordered pair {a, b} (the same both ways)."""
    lo = min(a, b)
    hi = max(a, b)
    key = np.uint64(lo) * np.uint64(n) + np.uint64(hi)
    return np.float64(_mix(_mix(np.uint64(seed) * _GOLDEN) ^ (key * _GOLDEN)) >> _S11) * _INV53


@njit(cache=True)
def hold_out_chunk(indptr, indices, v0, v1, w, newptr, n, seed, val, test, keys, kinds,
                   directed, out_src, out_dst, out_kind):
    """Compact the in-neighbour lists of nodes ``v0 .. v1-1`` of ``indices`` in place
    (writing from position ``w``), leaving out held-out edges.

    An edge ``u -> v`` is held out when its unordered pair is: with ``keys`` empty, by a
    seeded draw of the pair (:func:`pair_uniform` below ``val``: validation, below
    ``val + test``: test; self-loops never); else when ``min * n + max`` is in ``keys``
    (sorted int64, ``kinds`` int8: 1 validation, 2 test). Both directions of a pair go together.
    ``newptr[v + 1 - v0]`` gets the new end of ``v``'s list. Held-out edges with ``u < v``
    (every one when ``directed``) go to ``out_src``, ``out_dst``, ``out_kind`` (int64,
    int64, int8, at least the chunk's edge count long). Returns ``(w, held)``: the next
    write position and the number recorded."""
    held = 0
    given = keys.shape[0] > 0
    cut = val + test
    for v in range(v0, v1):
        for j in range(indptr[v], indptr[v + 1]):
            u = np.int64(indices[j])
            kind = 0
            if given:
                lo = min(u, np.int64(v))
                key = lo * np.int64(n) + max(u, np.int64(v))
                p = np.searchsorted(keys, key)
                if p < keys.shape[0] and keys[p] == key:
                    kind = kinds[p]
            elif u != v:
                r = pair_uniform(seed, u, v, n)
                if r < val:
                    kind = 1
                elif r < cut:
                    kind = 2
            if kind == 0:
                indices[w] = indices[j]
                w += 1
            elif directed or u < v:
                out_src[held] = u
                out_dst[held] = v
                out_kind[held] = kind
                held += 1
        newptr[v + 1 - v0] = w
    return w, held
