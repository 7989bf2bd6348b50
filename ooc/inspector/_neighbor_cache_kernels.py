"""numba kernels of the neighbor cache and the neighbour sources."""
from __future__ import annotations

import numba as nb
from numba import prange


@nb.njit(parallel=True, cache=True)
def expand_ranges(starts, offs, out):
    """out[offs[i]:offs[i+1]] = starts[i] + arange(offs[i+1]-offs[i])."""
    for i in prange(starts.shape[0]):
        s = starts[i]
        for j in range(offs[i + 1] - offs[i]):
            out[offs[i] + j] = s + j


@nb.njit(parallel=True, cache=True)
def cache_gather(nodes, offsets, rel_pos, address_table, cache_array, out, miss):
    """Fill ``out`` for cached nodes (Ginex Fig. 10b); flag the others in ``miss``.

    Returns (hits, misses) over nodes with at least one wanted position.
    """
    hits = 0
    misses = 0
    for i in prange(nodes.shape[0]):
        o = offsets[i]
        k = offsets[i + 1] - o
        if k == 0:
            continue
        a = address_table[nodes[i]]
        if a < 0:
            miss[i] = True
            misses += 1
            continue
        hits += 1
        base = a + 1
        for e in range(o, o + k):
            out[e] = cache_array[base + rel_pos[e]]
    return hits, misses


@nb.njit(parallel=True, cache=True)
def extract_from_pages(edge_pos, pages, per_page, vals, out):
    """out[e] = value at edge_pos[e] for every e whose page is in ``pages`` (sorted);
    ``vals`` is the page buffer viewed as the index dtype."""
    n = pages.shape[0]
    if n == 0:
        return
    lo_page = pages[0]
    hi_page = pages[n - 1]
    for e in prange(edge_pos.shape[0]):
        p = edge_pos[e] // per_page
        if p < lo_page or p > hi_page:
            continue
        lo = 0
        hi = n
        while lo < hi:
            mid = (lo + hi) >> 1
            if pages[mid] < p:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and pages[lo] == p:
            out[e] = vals[lo * per_page + (edge_pos[e] - p * per_page)]


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


@nb.njit(parallel=True, cache=True)
def check_cache(address_table, cache_array, indptr, num_nodes, status):
    """Validate a neighbor cache against ``indptr`` (int64 [N+1]).

    ``status[v]`` (int8 [N], zeroed) becomes 1 when v's entry is outside
    ``cache_array`` or its count is not v's in-degree, 2 when one of its
    neighbour ids is outside ``[0, num_nodes)``.
    """
    m = cache_array.shape[0]
    for v in prange(address_table.shape[0]):
        a = address_table[v]
        if a == -1:
            continue
        d = indptr[v + 1] - indptr[v]
        if a < 0 or a + 1 + d > m or cache_array[a] != d:
            status[v] = 1
            continue
        for j in range(d):
            u = cache_array[a + 1 + j]
            if u < 0 or u >= num_nodes:
                status[v] = 2
                break


@nb.njit(parallel=True, cache=True)
def mark_pages(edge_pos, per_page, mark):
    """mark[p] = 1 for every page p holding a wanted position (benign races)."""
    for e in prange(edge_pos.shape[0]):
        mark[edge_pos[e] // per_page] = 1
