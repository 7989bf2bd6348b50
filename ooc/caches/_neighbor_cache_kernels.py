"""numba kernels of the neighbor cache and the neighbour sources."""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import prange

from ooc.core.threading_layer import parallel_kernel
from ooc.storage._id_map_kernels import find


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def cache_gather(nodes, offsets, rel_pos, keys, vals, shift, cache_array, out, miss):
    """Fill ``out`` for cached nodes (Ginex Fig. 10b); flag the others in ``miss``.
    ``(keys, vals, shift)``: the cache's map of nodes to addresses
    (:attr:`ooc.storage.id_map.IdMap.table`).

    Returns (hits, misses) over nodes with at least one wanted position.
    """
    hits = 0
    misses = 0
    for i in prange(nodes.shape[0]):
        o = offsets[i]
        k = offsets[i + 1] - o
        if k == 0:
            continue
        a = find(keys, vals, shift, nodes[i])
        if a < 0:
            miss[i] = True
            misses += 1
            continue
        hits += 1
        base = a + 1
        for e in range(o, o + k):
            out[e] = cache_array[base + rel_pos[e]]
    return hits, misses


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def fill_cache(nodes, addr, indptr, indices, cache_array):
    """Write count then neighbour ids of nodes[i] at cache_array[addr[i]:]."""
    for i in prange(nodes.shape[0]):
        v = nodes[i]
        s = indptr[v]
        d = indptr[v + 1] - s
        a = addr[i]
        cache_array[a] = d
        for j in range(d):
            cache_array[a + 1 + j] = indices[s + j]


@nb.njit(cache=True)
def out_degrees(indices, num_nodes, start, stop, deg):
    """deg[indices[e]] += 1 for e in [start, stop); returns the first e whose
    id is outside ``[0, num_nodes)`` (counting stops there), else -1."""
    for e in range(start, stop):
        v = indices[e]
        if v < 0 or v >= num_nodes:
            return e
        deg[v] += 1
    return -1


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def check_cache(nodes, addresses, cache_array, indptr, num_nodes, status):
    """Validate a neighbor cache (cached ``nodes`` int64 [k] in [0, N), their
    ``addresses`` int64 [k]) against ``indptr`` (int64 [N+1]).

    ``status[i]`` (int8 [k], zeroed) becomes 1 when node i's entry is outside
    ``cache_array`` or its count is not its in-degree, 2 when one of its
    neighbour ids is outside ``[0, num_nodes)``.
    """
    m = cache_array.shape[0]
    for i in prange(nodes.shape[0]):
        v = nodes[i]
        a = addresses[i]
        d = indptr[v + 1] - indptr[v]
        if a < 0 or a + 1 + d > m or cache_array[a] != d:
            status[i] = 1
            continue
        for j in range(d):
            u = cache_array[a + 1 + j]
            if u < 0 or u >= num_nodes:
                status[i] = 2
                break


@nb.njit(inline="always", cache=True)
def _ratio_key(buf, bits, out_deg, in_deg):
    """The bits of the float64 ``out_deg / in_deg`` (in_deg > 0) as an int64 (for ratios
    >= 0 the integer order is the float order); ``buf`` float64 [1] and ``bits`` its
    int64 view."""
    buf[0] = np.float64(out_deg) / np.float64(in_deg)
    return bits[0]


@nb.njit(cache=True)
def key_cost_histogram(in_deg, out_deg, itemsize, extra, prefix, shift, hist):
    """``hist[d]`` += the cost of every listed node (in_deg > 0) whose ratio key has
    ``key >> (shift + 16) == prefix`` (every key when ``shift`` is 48) and 16-bit digit
    ``d = (key >> shift) & 0xFFFF``. A node's cost: ``(in_deg + 1) * itemsize + extra``.
    hist int64 [65536] (added to)."""
    buf = np.empty(1, np.float64)
    bits = buf.view(np.int64)
    for v in range(in_deg.shape[0]):
        d = np.int64(in_deg[v])
        if d == 0:
            continue
        key = _ratio_key(buf, bits, out_deg[v], d)
        if shift < 48 and (key >> (shift + 16)) != prefix:
            continue
        hist[(key >> shift) & 0xFFFF] += (d + 1) * itemsize + extra


@nb.njit(cache=True)
def tie_prefix(in_deg, out_deg, itemsize, extra, key, room):
    """Among listed nodes whose ratio key is ``key``, in id order, the last id of the
    longest run whose costs sum to at most ``room`` (-1 when the first does not fit)."""
    buf = np.empty(1, np.float64)
    bits = buf.view(np.int64)
    last = -1
    for v in range(in_deg.shape[0]):
        d = np.int64(in_deg[v])
        if d == 0:
            continue
        if _ratio_key(buf, bits, out_deg[v], d) != key:
            continue
        c = (d + 1) * itemsize + extra
        if c > room:
            return last
        room -= c
        last = v
    return last


@nb.njit(cache=True)
def select_nodes(in_deg, out_deg, key, last, start, stop, out):
    """Listed nodes in ``[start, stop)`` whose ratio key is above ``key``, or equal to it
    with id <= ``last``, in id order into ``out`` (int64, room for them); returns how
    many, and the entries they take (a count and the list each)."""
    buf = np.empty(1, np.float64)
    bits = buf.view(np.int64)
    k = 0
    entries = 0
    for v in range(start, stop):
        d = np.int64(in_deg[v])
        if d == 0:
            continue
        x = _ratio_key(buf, bits, out_deg[v], d)
        if x > key or (x == key and v <= last):
            if out.shape[0]:
                out[k] = v
            k += 1
            entries += d + 1
    return k, entries
