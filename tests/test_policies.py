"""Cache-policy miss counts against plain-Python simulators."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import brute_belady_steps, draw_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from ooc.caches.changesets import precompute_changesets
from ooc.caches.miss_curves import (
    count_misses_belady,
    count_misses_lru,
    count_misses_static,
    lru_stack_distances,
    miss_curve_belady,
    miss_curve_lru,
    miss_curve_static,
    order_by_degree,
)
from ooc.core.errors import OocError


def _brute_lru(batches, capacity):
    """Per step: C_{i+1} = the capacity ids of C_i ∪ ids_i with the latest stamps
    (stamp = flat position of the last access)."""
    stamp, cache, misses, pos = {}, set(), 0, 0
    for b in batches:
        b = [int(v) for v in b]
        misses += sum(1 for x in b if x not in cache)
        for x in b:
            stamp[x] = pos
            pos += 1
        cands = cache | set(b)
        cache = set(sorted(cands, key=lambda x: -stamp[x])[:capacity])
    return misses


def _brute_static(batches, cached):
    cached = set(int(v) for v in cached)
    return sum(1 for b in batches for x in b if int(x) not in cached)


def _brute_belady(batches, capacity):
    return sum(brute_belady_steps(batches, capacity))


def _trace(rng, S, N, max_b):
    return [rng.choice(N, size=int(rng.integers(0, min(N, max_b) + 1)), replace=False).astype(np.int64)
            for _ in range(S)]


def _zipf_trace(rng, S, N, b, a=1.2):
    w = 1.0 / np.arange(1, N + 1) ** a
    p = w / w.sum()
    out = []
    for _ in range(S):
        ids = np.unique(rng.choice(N, size=b, p=p))
        out.append(rng.permutation(ids).astype(np.int64))
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_lru_matches_brute_force(data):
    S = data.draw(st.integers(0, 12))
    N = data.draw(st.integers(1, 20))
    batches = draw_batches(data, S, N, 8)
    caps = list(range(0, N + 3))
    expected = [_brute_lru(batches, c) for c in caps]
    assert miss_curve_lru(batches, caps).tolist() == expected
    c = data.draw(st.integers(0, N + 2))
    assert count_misses_lru(batches, c) == expected[c]


def test_lru_definition_examples():
    # capacity 1: the batch's last id is the most recent
    assert count_misses_lru([np.array([1, 2]), np.array([2]), np.array([1])], 1) == 3
    assert count_misses_lru([np.array([2, 1]), np.array([2]), np.array([1])], 1) == 4
    d = lru_stack_distances([np.array([5, 6]), np.array([6, 5]), np.array([5])])
    assert d[:2].tolist() == [2**62, 2**62] and d[2:].tolist() == [0, 1, 0]


def test_static_matches_brute_force():
    rng = np.random.default_rng(1)
    batches = _zipf_trace(rng, 30, 200, 25)
    deg = rng.integers(0, 50, size=200)
    order = order_by_degree(deg)
    assert order[0] == int(np.argmax(deg))
    caps = [0, 1, 10, 50, 199, 200, 500]
    curve = miss_curve_static(batches, order, caps)
    assert curve.tolist() == [_brute_static(batches, order[:c]) for c in caps]
    assert [count_misses_static(batches, order[:c]) for c in caps] == curve.tolist()


def test_order_by_degree_ties():
    assert order_by_degree(np.array([3, 5, 5, 0, 3])).tolist() == [1, 2, 0, 4, 3]


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_hottest_is_the_head_of_the_order_by_degree(dtype):
    """The static cache's nodes without the sort: the k first of the order, ties by id."""
    from ooc.caches.miss_curves import hottest

    rng = np.random.default_rng(4)
    deg = rng.integers(0, 6, size=500).astype(dtype)   # many ties at every degree
    order = order_by_degree(deg)
    for k in [0, 1, 7, 99, 100, 101, 250, 499, 500, 600]:
        got = hottest(deg, k)
        assert got.dtype == np.int64 and (np.diff(got) > 0).all()
        np.testing.assert_array_equal(got, np.sort(order[:k]))


def test_belady_batch_misses_are_the_brute_force_steps():
    """Each batch's misses when the whole trace is known in advance, against the simulator
    step by step; they sum to the trace's count."""
    from ooc.caches.miss_curves import belady_batch_misses

    rng = np.random.default_rng(5)
    for _ in range(30):
        N = int(rng.integers(1, 25))
        batches = _trace(rng, int(rng.integers(1, 10)), N, 8)
        for c in range(0, N + 2):
            got = belady_batch_misses(batches, c)
            assert got.dtype == np.int64 and got.shape == (len(batches),)
            assert got.tolist() == brute_belady_steps(batches, c)
            assert int(got.sum()) == count_misses_belady(batches, c)
    with pytest.raises(OocError, match="capacities"):
        belady_batch_misses([np.array([1])], -1)


def test_belady_matches_brute_force_and_changesets():
    rng = np.random.default_rng(2)
    for _ in range(30):
        N = int(rng.integers(1, 25))
        batches = _trace(rng, int(rng.integers(1, 10)), N, 8)
        caps = list(range(0, N + 2))
        curve = miss_curve_belady(batches, caps)
        assert curve.tolist() == [_brute_belady(batches, c) for c in caps]
        c = int(rng.integers(0, N + 2))
        assert count_misses_belady(batches, c) == curve[c]
        assert precompute_changesets(batches, N, c).num_misses == curve[c]


@pytest.mark.parametrize("seed", [0, 1])
def test_belady_never_worse(seed):
    rng = np.random.default_rng(seed)
    N = 400
    batches = _zipf_trace(rng, 60, N, 40)
    order = order_by_degree(rng.integers(0, 100, N))
    # the frequency order is the best static choice in hindsight
    freq_order = order_by_degree(np.bincount(np.concatenate(batches), minlength=N))
    caps = [0, 5, 20, 40, 80, 160, 400]
    b = miss_curve_belady(batches, caps)
    lru = miss_curve_lru(batches, caps)
    for other in (lru, miss_curve_static(batches, order, caps), miss_curve_static(batches, freq_order, caps)):
        assert np.all(b <= other)
    # monotone in capacity (LRU and Belady are stack-like here)
    assert np.all(np.diff(b) <= 0) and np.all(np.diff(lru) <= 0)
    total = sum(len(x) for x in batches)
    assert b[0] == lru[0] == total
    assert b[-1] == 0  # everything prefetched
    assert lru[-1] == len(np.unique(np.concatenate(batches)))  # cold misses only


def test_large_ids_and_errors():
    base = 2**31 - 10
    batches = [np.array([base, base + 3]), np.array([base + 3, 5]), np.array([base])]
    assert count_misses_lru(batches, 1) == _brute_lru(batches, 1)
    assert count_misses_belady(batches, 1) == _brute_belady(batches, 1)
    assert miss_curve_static(batches, np.array([base + 3, 5]), [0, 1, 2]).tolist() == [5, 3, 2]
    with pytest.raises(OocError, match="twice"):
        count_misses_belady([np.array([1, 1])], 2)
    with pytest.raises(OocError, match="capacities"):
        miss_curve_lru([np.array([1])], [-1])
    with pytest.raises(OocError, match="negative"):
        count_misses_lru([np.array([-3])], 1)


def test_belady_with_hot_tail_beats_static_on_short_superbatches():
    """A short superbatch never inserts a miss it does not use again, so plain Belady
    loses to the degree order there; counting the hot ids as used after each superbatch
    keeps the superbatch's own optimum and fills the rest of the cache with them."""
    from ooc.caches.policies import BeladyCache, StaticCache

    rng = np.random.default_rng(3)
    n, cap = 20000, 2000
    p = 1.0 / np.arange(1, n + 1) ** 0.9
    hot = rng.permutation(n)                       # hot[k]: the k-th most popular id
    trace = [np.unique(hot[rng.choice(n, 1500, p=p / p.sum())]) for _ in range(40)]
    static = StaticCache().simulate(trace, n, cap, hot_order=hot)["misses"]
    for s in (1, 4):
        plain = BeladyCache().simulate(trace, n, cap, superbatch_size=s)["misses"]
        tail = BeladyCache().simulate(trace, n, cap, superbatch_size=s, hot_order=hot)["misses"]
        assert plain > static >= tail
    # one superbatch of the whole epoch: nothing after it, the same optimum either way
    assert BeladyCache().simulate(trace, n, cap, superbatch_size=40)["misses"] == \
        BeladyCache().simulate(trace, n, cap, superbatch_size=40, hot_order=hot)["misses"]
