"""numba kernels of SPRING (SDT-GNN Algorithm 1). See :mod:`ooc.partition.spring`."""
from __future__ import annotations

import heapq

import numba as nb
import numpy as np

_NB = dict(nogil=True, cache=True)


#: Columns of the per-node state array ``st`` ([N, 4], int32 below 2^31 nodes and
#: degrees, else int64). Packing the four per-node fields into one 16- or 32-byte
#: record makes an edge cost one cache miss per endpoint instead of four.
DEG, CLUSTER, RICH, RICH_DEG = 0, 1, 2, 3


def state_dtype(n: int, max_degree: int) -> np.dtype:
    """int32 when node ids, cluster ids (up to ``n + 1``) and degrees all fit it, else
    int64: the dtype of ``st`` and of the merge's per-node and per-cluster arrays."""
    return np.dtype(np.int32 if max(n + 1, max_degree) < 2**31 else np.int64)


def new_state(deg: np.ndarray) -> np.ndarray:
    """``st`` [N, 4] for degrees ``deg`` (int [N]): cluster 0 (unseen), no richest
    neighbour; 16 bytes a node (int32) where :func:`state_dtype` allows."""
    n = deg.shape[0]
    st = np.zeros((n, 4), dtype=state_dtype(n, int(deg.max()) if n else 0))
    _fill_state(st, deg)
    return st


@nb.njit(**_NB)
def _fill_state(st, deg):
    for v in range(deg.shape[0]):
        st[v, DEG] = deg[v]
        st[v, RICH] = -1


@nb.njit(**_NB)
def cluster_edges(src, dst, st, vol, k, tau):
    """Algorithm 1 lines 2-17 over the edges ``(src[i], dst[i])`` in order.

    ``st`` [N, 4] (int32 or int64): degree, cluster (0 = not seen yet), richest
    neighbour (-1 = none) and its degree; ``vol`` int64 [N+1] cluster
    volumes; ``k`` int64 [1] next cluster id (starts at 1).
    """
    for i in range(src.shape[0]):
        u = src[i]
        v = dst[i]
        if st[u, CLUSTER] == 0:
            st[u, CLUSTER] = k[0]
            vol[k[0]] += st[u, DEG]
            k[0] += 1
        if st[v, CLUSTER] == 0:
            st[v, CLUSTER] = k[0]
            vol[k[0]] += st[v, DEG]
            k[0] += 1
        if u == v:
            continue
        cu = st[u, CLUSTER]
        cv = st[v, CLUSTER]
        if cu != cv:
            vu = vol[cu]
            vv = vol[cv]
            if vu <= tau and vv <= tau:
                if vu <= vv:  # move u into v's cluster
                    vol[cu] = vu - st[u, DEG]
                    vol[cv] = vv + st[u, DEG]
                    st[u, CLUSTER] = cv
                else:
                    vol[cv] = vv - st[v, DEG]
                    vol[cu] = vu + st[v, DEG]
                    st[v, CLUSTER] = cu
        # richest neighbours (strict '<': the first one seen wins a tie)
        du = st[u, DEG]
        dv = st[v, DEG]
        if st[u, RICH] < 0 or st[u, RICH_DEG] < dv:
            st[u, RICH] = v
            st[u, RICH_DEG] = dv
        if st[v, RICH] < 0 or st[v, RICH_DEG] < du:
            st[v, RICH] = u
            st[v, RICH_DEG] = du


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
def _rep_key(st, v):
    return st[v, RICH_DEG] if st[v, RICH] >= 0 else -1


#: Merge rules of :func:`merge_and_assign`.
RICHEST, VOTE = 0, 1


@nb.njit(**_NB)
def _richest_target(st, parent, c, rep, i):
    """Algorithm 1 line 24: the cluster of the representative's richest neighbour."""
    t = st[rep[i], RICH]
    if t < 0:
        return -1
    return _find(parent, c[t])


@nb.njit(**_NB)
def _vote_target(st, parent, c, size, head, nxt, cnt, touched, i, cap):
    """The cluster holding the richest neighbours of most members of ``i``.

    Walks the members of ``i``; each member ``v`` with a richest neighbour
    votes for the cluster of ``n_v`` (votes for ``i`` itself are ignored).
    Returns the most voted cluster ``j`` with ``|C_i| + |C_j| <= cap``
    (ties: the one reached first in member order), or -1.
    """
    nt = 0
    v = head[i]
    while v >= 0:
        t = st[v, RICH]
        if t >= 0:
            j = _find(parent, c[t])
            if j != i:
                if cnt[j] == 0:
                    touched[nt] = j
                    nt += 1
                cnt[j] += 1
        v = nxt[v]
    best = -1
    votes = 0
    for a in range(nt):
        j = touched[a]
        if cnt[j] > votes and size[i] + size[j] <= cap:
            votes = cnt[j]
            best = j
        cnt[j] = 0
    return best


@nb.njit(**_NB)
def merge_and_assign(st, k_next, prio, cap, p, rule):
    """Algorithm 1 lines 18-30: cluster merging, then largest-first assignment.

    Args:
        st: the state after clustering (column CLUSTER 0 = never seen:
            an isolated node; each gets a singleton cluster; modified in place).
        k_next: first unused cluster id.
        prio: int [N] tie-break priority of nodes (higher wins) when two
            candidate representatives have equally rich neighbours (RICHEST).
        cap: the size cap ``beta * |V| / p`` of a merged cluster and of a
            partition.
        p: number of partitions.
        rule: RICHEST (Algorithm 1: the representative's richest neighbour
            picks the target) or VOTE (the members' richest neighbours vote).

    Returns:
        (owner int32 [N], clusters before merging, after merging,
        clusters split by the assignment).
    """
    n = st.shape[0]
    c = st[:, CLUSTER]
    k = k_next
    for v in range(n):
        if c[v] == 0:
            c[v] = k
            k += 1
    k = _renumber_clusters(c, k)
    size, rep, head, tail, nxt = _cluster_lists(st, c, k, prio)
    parent, n_before = _merge_small_clusters(st, c, prio, cap, rule, size, rep, head, tail, nxt)
    owner, nr, n_split = _assign_largest_first(parent, size, head, nxt, cap, p)
    return owner, n_before, nr, n_split


@nb.njit(**_NB)
def _renumber_clusters(c, k):
    """Renumber the clusters of ``c`` that hold a node ``1 .. m`` in id order, in place;
    returns ``m + 1``. Every node opens a cluster when the stream first meets it and most
    are left empty by later moves, so the merge's
    per-cluster arrays shrink from one entry per node to one per live cluster; the order
    of the live ones, which breaks ties, is kept."""
    new_id = np.zeros(k, dtype=c.dtype)
    for v in range(c.shape[0]):
        new_id[c[v]] = 1
    m = 0
    for cl in range(1, k):
        if new_id[cl]:
            m += 1
            new_id[cl] = m
    for v in range(c.shape[0]):
        c[v] = new_id[c[v]]
    return m + 1


@nb.njit(**_NB)
def _cluster_lists(st, c, nc, prio):
    """Each cluster's size, representative (the richest member; ties: ``prio``) and
    members as a singly linked list in node order (``head``/``tail`` per cluster,
    ``nxt`` per node), for cluster ids ``1..nc-1`` in ``c`` ([N]); all of ``st``'s dtype."""
    n = c.shape[0]
    size = np.zeros(nc, dtype=st.dtype)
    rep = np.full(nc, -1, dtype=st.dtype)
    head = np.full(nc, -1, dtype=st.dtype)
    tail = np.full(nc, -1, dtype=st.dtype)
    nxt = np.full(n, -1, dtype=st.dtype)
    for v in range(n):
        cl = c[v]
        size[cl] += 1
        if head[cl] < 0:
            head[cl] = v
        else:
            nxt[tail[cl]] = v
        tail[cl] = v
        r = rep[cl]
        if r < 0:
            rep[cl] = v
        else:
            kv = _rep_key(st, v)
            kr = _rep_key(st, r)
            if kv > kr or (kv == kr and prio[v] > prio[r]):
                rep[cl] = v
    return size, rep, head, tail, nxt


@nb.njit(**_NB)
def _merge_small_clusters(st, c, prio, cap, rule, size, rep, head, tail, nxt):
    """Merge clusters smallest first (equal sizes: lower id first) into the target the
    rule picks, within ``cap``; updates sizes, representatives and member lists.
    Returns ``(parent, clusters before merging)``: ``parent[i] == i`` for a root."""
    nc = size.shape[0]
    parent = np.empty(nc, dtype=size.dtype)
    for cl in range(nc):
        parent[cl] = cl
    heap = [(np.int64(0), np.int64(0))]
    heap.pop()
    n_before = 0
    for cl in range(1, nc):
        if size[cl] > 0:
            heap.append((np.int64(size[cl]), np.int64(cl)))
            n_before += 1
    heapq.heapify(heap)
    cnt = np.zeros(nc if rule == VOTE else 1, dtype=size.dtype)
    touched = np.empty(nc if rule == VOTE else 1, dtype=size.dtype)
    while len(heap) > 0:
        s, i = heapq.heappop(heap)
        if size[i] != s or parent[i] != i:
            continue  # stale entry: the cluster grew or was merged away
        if rule == VOTE:
            j = _vote_target(st, parent, c, size, head, nxt, cnt, touched, i, cap)
        else:
            j = _richest_target(st, parent, c, rep, i)
            if j >= 0 and (j == i or size[i] + size[j] > cap):
                j = -1
        if j < 0:
            continue
        parent[i] = j
        size[j] += size[i]
        size[i] = 0
        nxt[tail[j]] = head[i]  # members of i follow those of j
        tail[j] = tail[i]
        r = rep[i]
        rj = rep[j]
        ki = _rep_key(st, r)
        kj = _rep_key(st, rj)
        if ki > kj or (ki == kj and prio[r] > prio[rj]):
            rep[j] = r
        heapq.heappush(heap, (np.int64(size[j]), np.int64(j)))  # re-rank the grown cluster
    return parent, n_before


@nb.njit(**_NB)
def _assign_largest_first(parent, size, head, nxt, cap, p):
    """Final clusters, largest first (stable: equal sizes by cluster id), each to the least
    loaded partition; one that would overfill it is split along its member order (merged
    sub-clusters stay together) at the cap. Returns ``(owner int32 [N], clusters, clusters
    split)``."""
    nc = size.shape[0]
    n = nxt.shape[0]
    roots = np.empty(nc, dtype=np.int64)
    nr = 0
    for cl in range(1, nc):
        if parent[cl] == cl and size[cl] > 0:
            roots[nr] = cl
            nr += 1
    roots = roots[:nr]
    order = np.argsort(-size[roots], kind="mergesort")
    limit = max(np.int64(np.floor(cap)), np.int64(-(-n // p)))
    load = np.zeros(p, dtype=np.int64)
    owner = np.empty(n, dtype=np.int32)
    n_split = 0
    for idx in order:
        v = head[roots[idx]]
        pieces = 0
        while v >= 0:
            q = 0
            for r in range(1, p):  # least loaded; ties: lowest index
                if load[r] < load[q]:
                    q = r
            room = limit - load[q]
            taken = 0
            while v >= 0 and taken < room:
                owner[v] = q
                taken += 1
                v = nxt[v]
            load[q] += taken
            pieces += 1
        if pieces > 1:
            n_split += 1
    return owner, nr, n_split
