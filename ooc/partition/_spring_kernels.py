"""numba kernels of SPRING (SDT-GNN Algorithm 1). See :mod:`ooc.partition.spring`."""
from __future__ import annotations

import heapq

import numba as nb
import numpy as np

_NB = dict(nogil=True, cache=True)


@nb.njit(**_NB)
def _touch(v, c, vol, deg, k):
    if c[v] == 0:
        c[v] = k[0]
        vol[k[0]] += deg[v]
        k[0] += 1


@nb.njit(**_NB)
def cluster_chunk(indptr, a, first_dst, src, deg, c, vol, rich, k, tau):
    """Algorithm 1 lines 2-17 over one chunk of the edge stream.

    ``c`` int32 [N] cluster of each node (0 = not seen yet), ``vol`` int64
    [N+1] cluster volumes, ``rich`` int32 [N] richest neighbour (-1 = none),
    ``k`` int64 [1] next cluster id (starts at 1).
    """
    dst = first_dst
    for i in range(src.shape[0]):
        pos = a + i
        while indptr[dst + 1] <= pos:
            dst += 1
        u = src[i]
        v = dst
        _touch(u, c, vol, deg, k)
        _touch(v, c, vol, deg, k)
        if u == v:
            continue
        cu = c[u]
        cv = c[v]
        if cu != cv and vol[cu] <= tau and vol[cv] <= tau:
            if vol[cu] <= vol[cv]:
                vol[cu] -= deg[u]
                vol[cv] += deg[u]
                c[u] = cv
            else:
                vol[cv] -= deg[v]
                vol[cu] += deg[v]
                c[v] = cu
        # richest neighbours (strict '<': the first one seen wins a tie)
        if rich[u] < 0 or deg[rich[u]] < deg[v]:
            rich[u] = v
        if rich[v] < 0 or deg[rich[v]] < deg[u]:
            rich[v] = u


@nb.njit(**_NB)
def _find(parent, x):
    r = x
    while parent[r] != r:
        r = parent[r]
    while parent[x] != r:
        nxt = parent[x]
        parent[x] = r
        x = nxt
    return r


@nb.njit(**_NB)
def _rep_key(v, deg, rich):
    r = rich[v]
    return deg[r] if r >= 0 else -1


@nb.njit(**_NB)
def merge_and_assign(c, k_next, deg, rich, prio, cap, p):
    """Algorithm 1 lines 18-30: cluster merging, then largest-first assignment.

    Args:
        c: int32 [N] cluster of each node (0 = never seen: isolated node;
            such nodes get a singleton cluster each). Modified in place.
        k_next: first unused cluster id.
        deg, rich: degrees and richest neighbours.
        prio: int64 [N] tie-break priority of nodes (higher wins) when two
            candidate representatives have equally rich neighbours.
        cap: the size cap ``beta * |V| / p`` of a merged cluster.
        p: number of partitions.

    Returns:
        (owner int32 [N], number of clusters before merging, after merging).
    """
    n = c.shape[0]
    k = k_next
    for v in range(n):
        if c[v] == 0:
            c[v] = k
            k += 1
    nc = k  # cluster ids 1..k-1
    size = np.zeros(nc, dtype=np.int64)
    rep = np.full(nc, -1, dtype=np.int64)
    for v in range(n):
        cl = c[v]
        size[cl] += 1
        r = rep[cl]
        if r < 0:
            rep[cl] = v
        else:
            kv = _rep_key(v, deg, rich)
            kr = _rep_key(r, deg, rich)
            if kv > kr or (kv == kr and prio[v] > prio[r]):
                rep[cl] = v
    parent = np.arange(nc)
    heap = [(np.int64(0), np.int64(0))]
    heap.pop()
    n_before = 0
    for cl in range(1, nc):
        if size[cl] > 0:
            heap.append((size[cl], np.int64(cl)))
            n_before += 1
    heapq.heapify(heap)
    # smallest first; equal sizes: lower cluster id (earlier created) first
    while len(heap) > 0:
        s, i = heapq.heappop(heap)
        if size[i] != s or parent[i] != i:
            continue  # stale entry: the cluster grew or was merged away
        r = rep[i]
        t = rich[r]
        if t < 0:
            continue
        j = _find(parent, c[t])
        if j == i or size[i] + size[j] > cap:
            continue
        parent[i] = j
        size[j] += size[i]
        size[i] = 0
        ki = _rep_key(r, deg, rich)
        rj = rep[j]
        kj = _rep_key(rj, deg, rich)
        if ki > kj or (ki == kj and prio[r] > prio[rj]):
            rep[j] = r
        heapq.heappush(heap, (size[j], j))  # re-rank the grown cluster
    # final clusters, largest first (stable: equal sizes by cluster id)
    roots = np.empty(nc, dtype=np.int64)
    nr = 0
    for cl in range(1, nc):
        if parent[cl] == cl and size[cl] > 0:
            roots[nr] = cl
            nr += 1
    roots = roots[:nr]
    order = np.argsort(-size[roots], kind="mergesort")
    part_of = np.full(nc, -1, dtype=np.int32)
    loads = [(np.int64(0), np.int64(q)) for q in range(p)]
    heapq.heapify(loads)
    for idx in order:
        cl = roots[idx]
        load, q = heapq.heappop(loads)  # least loaded; ties: lowest index
        part_of[cl] = q
        heapq.heappush(loads, (load + size[cl], q))
    owner = np.empty(n, dtype=np.int32)
    for v in range(n):
        owner[v] = part_of[_find(parent, c[v])]
    return owner, n_before, nr
