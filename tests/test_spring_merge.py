"""SPRING cluster merging and assignment (Algorithm 1 lines 18-30) against a
plain-Python transcription of the documented rules, for both merge rules;
the vote rule's point on a hub-bridged example; the β cap on partitions."""
from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from ooc.partition import partition
from ooc.partition._spring_kernels import CLUSTER, DEG, RICH, RICH_DEG, RICHEST, VOTE, merge_and_assign
from ooc.partition.metrics import compute_metrics
from ooc.storage import open_dataset


def _state(cluster, rich, deg) -> np.ndarray:
    """``st`` int64 [N, 4] as the clustering leaves it (RICH_DEG = d(n_v))."""
    n = len(cluster)
    st = np.zeros((n, 4), dtype=np.int64)
    st[:, DEG] = deg
    st[:, CLUSTER] = cluster
    st[:, RICH] = rich
    for v in range(n):
        st[v, RICH_DEG] = deg[rich[v]] if rich[v] >= 0 else 0
    return st


def reference(cluster, rich, deg, prio, cap, p, rule):
    """Merging and assignment as the module docstring states them, with lists."""
    n = len(cluster)
    c = list(cluster)
    k = max([x for x in c] + [0]) + 1
    for v in range(n):  # isolated nodes: singleton clusters in node order
        if c[v] == 0:
            c[v] = k
            k += 1
    members = {}
    for v in range(n):
        members.setdefault(c[v], []).append(v)
    root = {cl: cl for cl in members}

    def find(cl):
        while root[cl] != cl:
            cl = root[cl]
        return cl

    def key(v):
        return deg[rich[v]] if rich[v] >= 0 else -1

    def better(a, b):  # representative a beats b
        return key(a) > key(b) or (key(a) == key(b) and prio[a] > prio[b])

    rep = {}
    for cl, ms in members.items():
        r = ms[0]
        for v in ms[1:]:
            if better(v, r):
                r = v
        rep[cl] = r
    size = {cl: len(ms) for cl, ms in members.items()}
    heap = [(size[cl], cl) for cl in members]
    heapq.heapify(heap)
    while heap:
        s, i = heapq.heappop(heap)
        if root[i] != i or size[i] != s:
            continue
        target = None
        if rule == RICHEST:
            t = rich[rep[i]]
            if t >= 0:
                j = find(c[t])
                if j != i and size[i] + size[j] <= cap:
                    target = j
        else:
            votes, first = {}, []
            for v in members[i]:
                if rich[v] >= 0:
                    j = find(c[rich[v]])
                    if j != i:
                        if j not in votes:
                            first.append(j)
                        votes[j] = votes.get(j, 0) + 1
            best = 0
            for j in first:
                if votes[j] > best and size[i] + size[j] <= cap:
                    best, target = votes[j], j
        if target is None:
            continue
        j = target
        root[i] = j
        members[j] = members[j] + members[i]
        size[j] += size[i]
        size[i] = 0
        if better(rep[i], rep[j]):
            rep[j] = rep[i]
        heapq.heappush(heap, (size[j], j))
    roots = sorted((cl for cl in members if root[cl] == cl and size[cl] > 0),
                   key=lambda cl: (-size[cl], cl))
    limit = max(int(np.floor(cap)), -(-n // p))
    load = [0] * p
    owner = [-1] * n
    for cl in roots:
        ms = members[cl]
        at = 0
        while at < len(ms):
            q = min(range(p), key=lambda r: (load[r], r))
            take = min(limit - load[q], len(ms) - at)
            for v in ms[at:at + take]:
                owner[v] = q
            load[q] += take
            at += take
    return np.array(owner, dtype=np.int32), len(roots)


@st_.composite
def _clustered(draw):
    n = draw(st_.integers(1, 40))
    ncl = draw(st_.integers(1, n))
    cluster = draw(st_.lists(st_.integers(0, ncl), min_size=n, max_size=n))
    deg = draw(st_.lists(st_.integers(1, 9), min_size=n, max_size=n))
    rich = [draw(st_.integers(-1, n - 1)) if cluster[v] else -1 for v in range(n)]
    rich = [-1 if r == v else r for v, r in enumerate(rich)]
    p = draw(st_.integers(1, min(n, 6)))
    beta = draw(st_.sampled_from([1.0, 1.05, 1.5, 3.0]))
    rule = draw(st_.sampled_from([RICHEST, VOTE]))
    return cluster, rich, deg, p, beta, rule


@settings(max_examples=300, deadline=None)
@given(_clustered())
def test_merge_and_assign_matches_reference(case):
    cluster, rich, deg, p, beta, rule = case
    n = len(cluster)
    # cluster ids must be 1..k-1 with k the next free id; relabel densely
    ids = sorted({x for x in cluster if x})
    remap = {x: i + 1 for i, x in enumerate(ids)}
    cluster = [remap.get(x, 0) for x in cluster]
    prio = -np.arange(n, dtype=np.int64)
    cap = beta * n / p
    st = _state(cluster, rich, deg)
    owner, _, n_after, _ = merge_and_assign(st, len(ids) + 1, prio, cap, p, rule)
    want, want_after = reference(cluster, rich, deg, prio, cap, p, rule)
    np.testing.assert_array_equal(owner, want)
    assert n_after == want_after
    loads = np.bincount(owner, minlength=p)
    assert loads.max() <= max(int(np.floor(cap)), -(-n // p))


def test_vote_follows_the_majority_not_the_hub():
    """Cluster A = {0,1,2,3}: node 0's richest neighbour is the hub 10 (cluster
    H), nodes 1-3 point into cluster B = {4..7}. Algorithm 1's representative
    is node 0 (its neighbour is richest), so A joins H; the vote joins B."""
    n = 14
    deg = [3] * n
    deg[10] = 50
    cluster = [1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3]  # A=1 (4 nodes), B=2, H=3 (5 each)
    rich = [10, 4, 5, 6, 5, 4, 4, 5, 5, 10, 11, 10, 10, 10]
    rich[10] = 11
    prio = -np.arange(n, dtype=np.int64)
    for rule, joined in ((RICHEST, 10), (VOTE, 4)):
        st = _state(cluster, rich, deg)
        owner, before, after, _ = merge_and_assign(st, 4, prio, 9.0, 2, rule)
        assert before == 3 and after == 2
        assert np.all(owner[:4] == owner[joined])


def test_assignment_splits_a_cluster_at_the_cap():
    """Three clusters of 6 nodes, P = 2, beta = 1: the third is split 3 + 3 in
    member order; without the split one partition would hold 12 nodes."""
    n = 18
    cluster = [1] * 6 + [2] * 6 + [3] * 6
    st = _state(cluster, [-1] * n, [1] * n)
    owner, _, after, n_split = merge_and_assign(st, 4, -np.arange(n, dtype=np.int64),
                                                9.0, 2, VOTE)
    assert after == 3 and n_split == 1
    np.testing.assert_array_equal(np.bincount(owner), [9, 9])
    np.testing.assert_array_equal(owner[12:], [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("merge", ["vote", "richest"])
def test_node_balance_within_beta(small_dataset, merge):
    path, _ = small_dataset
    for parts in (2, 3, 5, 8):
        a = partition(path, parts, "spring", merge=merge, refine_passes=0)
        m = compute_metrics(open_dataset(path), a.owner, parts)
        n = a.owner.size
        assert np.bincount(a.owner, minlength=parts).max() <= max(int(1.05 * n / parts),
                                                                 -(-n // parts))
        assert m["node_balance"] <= 1.05 + parts / n


# -- baselines: ownership rules and the vertex-cut replica sets ------------------------
def _hash_edge(u: int, v: int, seed: int, p: int) -> int:
    """The ``hash`` partitioner's rule for one edge, in Python integers."""
    from ooc.partition._kernels import mix64

    x = (u * 0x9E3779B97F4A7C15 + v + seed) % (1 << 64)
    return int(mix64(np.uint64(x))) % p


@pytest.mark.parametrize("ownership", ["majority", "last"])
def test_hash_ownership_and_vertex_cut_match_reference(small_dataset, ownership):
    """With the stream in CSC order, node v's in-edges arrive as
    ``indices[indptr[v]:indptr[v+1]]``: its owner is the majority (strict
    majority when one exists) or the last of their partitions, and the
    vertex-cut sets are exactly the partitions of every node's edges."""
    path, arr = small_dataset
    p, seed = 5, 3
    a = partition(path, p, "hash", seed=seed, shuffle=False, ownership=ownership,
                  refine_passes=0)
    indptr, indices = arr["indptr"], arr["indices"]
    n = indptr.size - 1
    sets = [set() for _ in range(n)]
    checked = 0
    for v in range(n):
        qs = [_hash_edge(int(u), v, seed, p) for u in indices[indptr[v]:indptr[v + 1]]]
        for u, q in zip(indices[indptr[v]:indptr[v + 1]], qs, strict=True):
            sets[v].add(q)
            sets[int(u)].add(q)
        if not qs:
            continue
        if ownership == "last":
            assert a.owner[v] == qs[-1]
            checked += 1
        else:
            top = np.bincount(qs, minlength=p)
            if top.max() * 2 > len(qs):
                assert a.owner[v] == int(top.argmax())
                checked += 1
    assert checked > 40
    got = [{q for q in range(p) if (int(a.vertex_cut[v, 0]) >> q) & 1} for v in range(n)]
    assert got == sets
    assert a.info["vertex_cut_rf"] == pytest.approx(
        sum(len(s) for s in sets) / sum(1 for s in sets if s))
