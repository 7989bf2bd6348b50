"""The block and sub-block kernels of layer-wise inference against brute force."""
from __future__ import annotations

import numpy as np
import pytest

from ooc.executor.inference._kernels import plan_blocks
from ooc.executor.inference.local_graph import LocalGraph
from ooc.storage import csc_from_edges


def _graph(seed: int, n: int = 300, e: int = 2400):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n, e)
    src[:20] = dst[:20]                       # self loops
    indptr, indices = csc_from_edges(src, dst, n)
    return indptr, np.asarray(indices, dtype=np.int64), rng.permutation(n).astype(np.int64)


def _cost(indptr, indices, rows, costs):
    """Targets, distinct local nodes and in-edges of the targets ``rows``, costed."""
    nodes = set(rows.tolist())
    edges = 0
    for v in rows:
        nb = indices[indptr[v]:indptr[v + 1]]
        nodes.update(nb.tolist())
        edges += nb.shape[0]
    t, nd, ed = costs
    return len(rows) * t + len(nodes) * nd + edges * ed


@pytest.mark.parametrize("seed,phases,max_t", [
    (0, [((10, 100, 7), 6000)], 1 << 30), (1, [((0, 64, 1), 2000)], 1 << 30),
    (2, [((5, 50, 3), 1 << 40)], 1 << 30), (3, [((5, 50, 3), 1 << 40)], 37),
    (4, [((10, 100, 7), 1)], 50),
    # phases that bind by turns: edges in one, nodes in another, a flat allowance off a third
    (5, [((16, 8, 16), 9000), ((8, 90, 8), 9000), ((8, 50, 8), 5000)], 1 << 30),
    (6, [((0, 0, 40), 3000), ((0, 120, 0), 6000)], 1 << 30)])
def test_plan_blocks_is_greedy_on_exact_local_nodes(seed, phases, max_t):
    """Every block costs at most every phase's limit (or is a single target), and adding
    its next row would not have fit one of them; the stamp array is left as it was found."""
    indptr, indices, perm = _graph(seed)
    n = perm.shape[0]
    stamp = np.full(n, -1, dtype=np.int64)
    costs = np.array([c for c, _ in phases], dtype=np.int64)
    limits = np.array([w for _, w in phases], dtype=np.int64)
    starts = plan_blocks(indptr, indices, perm, max_t, costs, limits, stamp)
    assert starts[0] == 0 and starts[-1] == n and (np.diff(starts) > 0).all()
    assert (stamp == -1).all()
    for s, e in zip(starts[:-1], starts[1:], strict=True):
        assert e - s <= max_t
        assert all(_cost(indptr, indices, perm[s:e], c) <= w for c, w in phases) or e - s == 1
        if e < n and e - s < max_t:
            # a self loop or a repeated in-neighbour may be counted as a new node: the
            # kernel's cost is at least the exact one, so the next row did not fit a phase
            # exactly or by that over-count
            deg = indptr[perm[e] + 1] - indptr[perm[e]]
            assert any(_cost(indptr, indices, perm[s:e + 1], c) > w - c[1] * deg
                       for c, w in phases)


def test_plan_blocks_of_everything_is_one_block():
    indptr, indices, perm = _graph(5)
    stamp = np.full(perm.shape[0], -1, dtype=np.int64)
    starts = plan_blocks(indptr, indices, perm, 1 << 30, np.ones((1, 3), np.int64),
                         np.array([1 << 40], np.int64), stamp)
    assert starts.tolist() == [0, perm.shape[0]]


def _block(seed: int, nt: int = 40, n_local: int = 120, m: int = 300):
    rng = np.random.default_rng(seed)
    eptr = np.concatenate([[0], np.sort(rng.integers(0, m + 1, nt - 1)), [m]]).astype(np.int64)
    src = rng.integers(0, n_local, m).astype(np.int64)
    w = rng.random(m).astype(np.float32)
    lw = rng.random(nt).astype(np.float32)
    return eptr, src, w, lw


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("a,z", [(0, 40), (5, 17), (39, 40), (10, 10)])
def test_sub_graph_renumbers_like_a_local_graph(loops, a, z):
    """Targets first, then in-neighbours in order of first appearance; every edge kept with
    its weight, one self loop after each target's edges for GCN weights."""
    eptr, src, w, lw = _block(3)
    g = LocalGraph(np.arange(120, dtype=np.int64), src, eptr, w if loops else None,
                   lw if loops else None, 40)
    nodes, ei, sw = g.sub(a, z)
    order = list(range(a, z))
    for j in range(eptr[a], eptr[z]):
        if int(src[j]) not in order:
            order.append(int(src[j]))
    assert nodes.tolist() == order
    want_src, want_dst, want_w = [], [], []
    for i, t in enumerate(range(a, z)):
        for j in range(eptr[t], eptr[t + 1]):
            want_src.append(order.index(int(src[j])))
            want_dst.append(i)
            want_w.append(w[j])
        if loops:
            want_src.append(i)
            want_dst.append(i)
            want_w.append(lw[t])
    assert ei[0].tolist() == want_src and ei[1].tolist() == want_dst
    if loops:
        np.testing.assert_array_equal(sw, np.array(want_w, dtype=np.float32))
    else:
        assert sw is None


def test_plan_sub_blocks_bounds_each_sub_block():
    eptr, src, _, _ = _block(4)
    costs = (10, 40, 4)
    g = LocalGraph(np.arange(120, dtype=np.int64), src, eptr, None, None, 40)
    starts = g.sub_blocks(*costs, 900)
    assert starts[0] == 0 and starts[-1] == 40 and (np.diff(starts) > 0).all()
    for a, z in zip(starts[:-1], starts[1:], strict=True):
        nodes, ei, _ = g.sub(a, z)
        cost = (z - a) * costs[0] + nodes.shape[0] * costs[1] + ei.shape[1] * costs[2]
        assert cost <= 900 or z - a == 1
