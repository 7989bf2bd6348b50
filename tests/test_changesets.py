"""Belady changesets against independent references.

References written here, separately from the fast paths:
* ``_brute_states``: the per-step Belady recurrence in plain Python (future
  scans for next use), with the documented tie-break; its states must equal
  the replayed changesets.
* ``_interval_optimum``: the optimum as a different problem, a maximum
  K-colourable set of reuse intervals (greedy by right end is optimal),
  which must equal the miss count.
* ``_exhaustive_optimum``: a DP over every cache state for tiny traces.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import draw_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from ooc.caches.changesets import precompute_changesets
from ooc.core.errors import OocError

METHODS = ["torch", "numba"]


# -- references --------------------------------------------------------------------

def _next_use(batches, x, i):
    for j in range(i + 1, len(batches)):
        if x in batches[j]:
            return j
    return None


def _brute_states(batches, capacity):
    """Cache states C_0..C_S and per-step misses of the per-step Belady recurrence."""
    bs = [set(int(v) for v in b) for b in batches]
    first = {}
    for i, b in enumerate(bs):
        for x in b:
            first.setdefault(x, i)
    c = set(sorted(first, key=lambda x: (first[x], x))[:capacity])
    states, misses = [set(c)], []
    for i, b in enumerate(bs):
        misses.append(len(b - c))
        cands = []
        for x in c | b:
            n = _next_use(bs, x, i)
            if n is not None:
                cands.append((n, 0 if x in c else 1, x))
        c = set(x for _, _, x in sorted(cands)[:capacity])
        states.append(set(c))
    return states, misses


def _interval_optimum(batches, capacity):
    """Minimum misses: total accesses minus a maximum set of reuse intervals with
    at most ``capacity`` covering any cache state (greedy by right end)."""
    S = len(batches)
    last, intervals, total = {}, [], 0
    for j, b in enumerate(batches):
        for x in (int(v) for v in b):
            total += 1
            # x must be cached in states (prev+1 .. j); a first access may use C_0
            intervals.append((j, last[x] + 1 if x in last else 0))
            last[x] = j
    load = [0] * (S + 1)
    kept = 0
    for end, start in sorted(intervals):
        if all(load[t] < capacity for t in range(start, end + 1)):
            for t in range(start, end + 1):
                load[t] += 1
            kept += 1
    return total - kept


def _exhaustive_optimum(batches, capacity):
    bs = [frozenset(int(v) for v in b) for b in batches]
    universe = sorted(set().union(*bs)) if bs else []
    best = {}
    for r in range(min(capacity, len(universe)) + 1):
        for c in itertools.combinations(universe, r):
            best[frozenset(c)] = 0
    for b in bs:
        nxt = {}
        for c, cost in best.items():
            cost += len(b - c)
            pool = sorted(c | b)
            for r in range(min(capacity, len(pool)) + 1):
                for d in itertools.combinations(pool, r):
                    d = frozenset(d)
                    if cost < nxt.get(d, 1 << 60):
                        nxt[d] = cost
        best = nxt
    return min(best.values()) if best else 0


def _replay(cs, batches, capacity):
    """Check every step's validity; return the states and misses."""
    c = set(int(v) for v in cs.init_ids)
    assert len(c) == len(cs.init_ids) <= capacity
    states, misses = [set(c)], []
    assert len(cs.steps) == len(batches)
    for b, st_ in zip(batches, cs.steps, strict=True):
        b = np.asarray(b, dtype=np.int64)
        bset = set(b.tolist())
        misses.append(len(bset - c))
        ins, outs, pos = (np.asarray(a) for a in (st_.in_ids, st_.out_ids, st_.in_positions))
        assert ins.dtype == outs.dtype == pos.dtype == np.int64
        assert len(set(ins.tolist())) == len(ins) and len(set(outs.tolist())) == len(outs)
        assert set(outs.tolist()) <= c
        assert set(ins.tolist()) <= bset - c
        assert np.array_equal(b[pos], ins)
        c = (c - set(outs.tolist())) | set(ins.tolist())
        assert len(c) <= capacity
        assert c <= states[-1] | bset
        states.append(set(c))
    assert np.array_equal(cs.misses, misses)
    return states, misses


def _check_all(batches, capacity, num_nodes=None, exhaustive=False):
    if num_nodes is None:
        num_nodes = max((int(np.max(b)) + 1 for b in batches if len(b)), default=1)
    ref_states, ref_misses = _brute_states(batches, capacity)
    results = [precompute_changesets(batches, num_nodes, capacity, method=m) for m in METHODS]
    assert results[0].equals(results[1])
    for cs in results:
        states, misses = _replay(cs, batches, capacity)
        assert states == ref_states
        assert misses == ref_misses
    opt = _interval_optimum(batches, capacity)
    assert sum(ref_misses) == opt
    if exhaustive:
        assert opt == _exhaustive_optimum(batches, capacity)
    return results[0]


# -- traces ------------------------------------------------------------------------------

def _random_trace(rng, S, N, max_b):
    return [rng.choice(N, size=int(rng.integers(0, min(N, max_b) + 1)), replace=False).astype(np.int64)
            for _ in range(S)]


def _power_law_graph(n, avg_deg, seed):
    """CSC of a directed graph whose edge sources follow a Zipf-like law."""
    rng = np.random.default_rng(seed)
    m = n * avg_deg
    w = 1.0 / np.arange(1, n + 1) ** 1.1
    src = rng.choice(n, size=m, p=w / w.sum())
    src = rng.permutation(n)[src]  # hubs at random ids
    dst = rng.integers(0, n, size=m)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int64)


def _khop(indptr, indices, seeds, fanouts, rng):
    nodes = list(dict.fromkeys(int(s) for s in seeds))
    seen = set(nodes)
    frontier = nodes
    for f in fanouts:
        nxt = []
        for v in frontier:
            nb = indices[indptr[v]:indptr[v + 1]]
            if len(nb) > f:
                nb = nb[rng.choice(len(nb), f, replace=False)]
            for u in nb.tolist():
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        nodes.extend(nxt)
        frontier = nxt
    return np.array(nodes, np.int64)


def _graph_trace(n=300, S=25, batch=4, fanouts=(3, 2), seed=0):
    indptr, indices = _power_law_graph(n, 5, seed)
    rng = np.random.default_rng(seed + 1)
    return [_khop(indptr, indices, rng.choice(n, batch, replace=False), fanouts, rng) for _ in range(S)]


# -- tests ------------------------------------------------------------------------------------

def test_tiny_traces_exhaustive():
    rng = np.random.default_rng(0)
    for _ in range(60):
        S, N = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        _check_all(_random_trace(rng, S, N, 4), int(rng.integers(0, N + 1)), exhaustive=True)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_traces(data):
    S = data.draw(st.integers(1, 12))
    N = data.draw(st.integers(1, 30))
    batches = draw_batches(data, S, N, 10)
    cap = data.draw(st.integers(0, N + 2))
    _check_all(batches, cap, num_nodes=N)


@pytest.mark.parametrize("frac", [0.0, 0.05, 0.2, 0.5, 1.0])
def test_power_law_traces(frac):
    batches = _graph_trace()
    touched = len(set(np.concatenate(batches).tolist()))
    cs = _check_all(batches, int(frac * touched), num_nodes=300)
    if 0 < frac < 1:
        assert 0 < cs.num_misses < cs.num_accesses


def test_capacity_zero_and_everything():
    batches = _graph_trace(S=10)
    cs = _check_all(batches, 0, num_nodes=300)
    assert cs.num_misses == cs.num_accesses and len(cs.init_ids) == 0
    assert len(cs.in_ids) == len(cs.out_ids) == 0
    u = np.unique(np.concatenate(batches))
    for cap in (len(u), len(u) + 50):
        cs = _check_all(batches, cap, num_nodes=300)
        assert np.array_equal(cs.init_ids, u)  # everything prefetched, never a miss
        assert cs.num_misses == 0
        # every id leaves the cache after its last use (nothing is used after the last batch)
        assert sorted(cs.out_ids.tolist()) == u.tolist()


def test_empty_batches_single_batch_no_batches():
    e = np.zeros(0, np.int64)
    _check_all([e, np.array([3, 1, 2]), e, e, np.array([2, 5]), e], 2, num_nodes=6)
    _check_all([e, e], 3, num_nodes=6)
    cs = _check_all([np.array([4, 0, 9])], 2, num_nodes=10)
    assert cs.init_ids.tolist() == [0, 4] and cs.misses.tolist() == [1]
    assert len(cs.in_ids) == 0 and cs.out_ids.tolist() == [0, 4]
    for m in METHODS:
        cs = precompute_changesets([], 10, 5, method=m)
        assert len(cs.steps) == 0 and len(cs.init_ids) == 0 and cs.num_misses == 0


def test_tie_break_prefers_cached_then_smaller_id():
    # after batch 0 the cache holds {1}; batch 1 brings 0 and 2; all three are next used at 2
    batches = [np.array([1]), np.array([2, 0]), np.array([0, 1, 2])]
    for m in METHODS:
        cs = precompute_changesets(batches, 3, 1, method=m)
        assert cs.init_ids.tolist() == [1]
        assert [s.in_ids.tolist() for s in cs.steps] == [[], [], []]
    batches = [np.array([5, 3]), np.array([3, 5])]
    for m in METHODS:
        cs = precompute_changesets(batches, 6, 1, method=m)
        assert cs.init_ids.tolist() == [3] and cs.misses.tolist() == [1, 1]


def test_inputs_tensors_and_large_ids():
    base = 2**31 - 40
    rng = np.random.default_rng(3)
    batches = [torch.from_numpy(base + b) for b in _random_trace(rng, 15, 40, 8)]
    cs = _check_all([b.numpy() for b in batches], 7, num_nodes=2**31)
    for m in METHODS:
        assert precompute_changesets(batches, 2**31, 7, method=m).equals(cs)
    big = [np.array([2**40 + 5, 7]), np.array([7, 2**40 + 5, 2**40])]
    for m in METHODS:
        c = precompute_changesets(big, 2**41, 1, method=m)
        assert c.init_ids.tolist() == [7] and c.misses.tolist() == [1, 2]


def test_bad_input():
    for m in METHODS:
        with pytest.raises(OocError, match="twice in batch 1"):
            precompute_changesets([np.array([1, 2]), np.array([3, 3])], 5, 2, method=m)
        with pytest.raises(OocError, match="outside"):
            precompute_changesets([np.array([1, 5])], 5, 2, method=m)
        with pytest.raises(OocError, match="capacity"):
            precompute_changesets([np.array([1])], 5, -1, method=m)
    with pytest.raises(OocError, match="1-D"):
        precompute_changesets([np.zeros((2, 2), np.int64)], 5, 2)
    with pytest.raises(OocError, match="method"):
        precompute_changesets([np.array([1])], 5, 2, method="gpu")


def _cyclic(S, m=7):
    """Batch i = [i % m, m + i]: a cycle of m ids plus an id never seen again.

    With capacity m-1 the optimum keeps the first m-1 cycle ids forever (a
    missed cycle id is the one used furthest ahead, so it is bypassed): the
    misses are S // m cycle misses plus the S one-off ids.
    """
    return [np.array([i % m, m + i], np.int64) for i in range(S)]


def test_long_superbatch_numba():
    S, m = 100_000, 7  # far past any 16-bit counter
    batches = _cyclic(S, m)
    cs = precompute_changesets(batches, S + m, m - 1, method="numba")
    assert len(cs.steps) == S
    assert cs.num_misses == S // m + S
    # C_0: the ids of batches 0..2 (accessed first); then the one-offs drop out
    # and the missed cycle ids 3..5 come in, after which the cache never changes
    assert cs.init_ids.tolist() == [0, 1, 2, m, m + 1, m + 2]
    # (until the last uses at the end of the superbatch)
    head = cs.steps[:S - 2 * m]
    assert sorted(v for s in head for v in s.out_ids.tolist()) == [m, m + 1, m + 2]
    assert [v for s in head for v in s.in_ids.tolist()] == [3, 4, 5]
    assert [v for s in head for v in s.in_positions.tolist()] == [0, 0, 0]
    small = batches[:40]
    assert precompute_changesets(small, S + m, m - 1, method="numba").num_misses == \
        _interval_optimum(small, m - 1) == 40 // m + 40
    # a cache one smaller must churn, and replaying it stays valid
    cs = precompute_changesets(batches, S + m, m - 2, method="numba")
    _replay(cs, batches, m - 2)
    assert cs.num_misses > S // m + S


def test_long_superbatch_torch_matches_numba():
    S, m = 33_000, 7  # past int16
    batches = _cyclic(S, m)
    a = precompute_changesets(batches, S + m, m - 1, method="torch")
    assert a.num_misses == S // m + S
    assert a.equals(precompute_changesets(batches, S + m, m - 1, method="numba"))


def test_sparse_reuse_across_many_batches():
    # ids reused hundreds of batches later: the top cached bucket lies many
    # bitmap words above the boundary, and buckets are evicted partly
    rng = np.random.default_rng(7)
    batches = [rng.choice(60, size=int(rng.integers(0, 4)), replace=False).astype(np.int64)
               for _ in range(260)]
    for cap in (1, 3, 8):
        _check_all(batches, cap, num_nodes=60)
    # a big future batch whose bucket is split by the capacity boundary
    batches = [np.arange(10 * i, 10 * i + 10) for i in range(6)] + [np.arange(60)[::-1].copy()]
    for cap in (5, 25, 59):
        cs = _check_all(batches, cap, num_nodes=60)
        assert cs.num_misses == 2 * (60 - cap)


def _later(batches, x, i):
    return any(x in set(int(v) for v in b) for b in batches[i + 1:])


@pytest.mark.parametrize("method", METHODS)
def test_keep_unused_and_cached_carry_the_cache_between_superbatches(method):
    """keep_unused: the replayed cache is Belady's state plus entries never accessed again
    (the most recently dropped ones, while there is room), with the same misses.
    cached=final_state(previous): the next superbatch starts from that cache (its states
    are the brute-force recurrence over [cached, ids_0, ...] after step 0, plus unused
    entries) and reads no more than starting from Ginex's initial set."""
    from ooc.caches.changesets import final_state

    rng = np.random.default_rng(5)
    for _ in range(40):
        N, S, cap = 40, 8, int(rng.integers(1, 15))
        prev, nxt = _random_trace(rng, S, N, 10), _random_trace(rng, S, N, 10)
        ref_states, ref_misses = _brute_states(prev, cap)
        a = precompute_changesets(prev, N, cap, method=method, keep_unused=True)
        plain = precompute_changesets(prev, N, cap, method=method)
        assert np.array_equal(a.misses, plain.misses) and np.array_equal(a.in_ids, plain.in_ids)
        states, misses = _replay(a, prev, cap)
        assert misses == ref_misses
        for i, (c, ref) in enumerate(zip(states, ref_states, strict=True)):
            assert ref <= c
            assert all(not _later(prev, x, i - 1) for x in c - ref)  # extras: never used again
        # the cache ends as full as it can be: min(capacity, distinct ids ever cached)
        ever = set(a.init_ids.tolist()) | set(a.in_ids.tolist())
        cached = final_state(a)
        assert set(cached.tolist()) == states[-1] and len(cached) == min(cap, len(ever))

        b = precompute_changesets(nxt, N, cap, method=method, cached=cached, keep_unused=True)
        states_b, misses_b = _replay(b, nxt, cap)
        ref_b, ref_mb = _brute_states([cached, *nxt], cap)
        assert misses_b == ref_mb[1:]
        for c, ref in zip(states_b, ref_b[1:], strict=True):
            assert ref <= c
        cset = set(cached.tolist())
        assert cset <= set(b.init_ids.tolist())  # nothing cached is thrown away at the switch
        g = precompute_changesets(nxt, N, cap, method=method)
        reads_b = len(set(b.init_ids.tolist()) - cset) + sum(misses_b)
        reads_g = len(set(g.init_ids.tolist()) - cset) + g.num_misses
        assert reads_b <= reads_g
    # Ginex's init {3, 1} drops cached 2 and misses it later; carrying {1, 2} misses only 3
    b = precompute_changesets([[3], [1], [2]], 4, 2, method=method, cached=[1, 2])
    assert b.init_ids.tolist() == [1, 2] and b.num_misses == 1
    with pytest.raises(OocError, match="exceed the capacity"):
        precompute_changesets([[1]], 4, 1, method=method, cached=[1, 2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the "
                    "torch path is checked on the CPU by the tests above")
def test_cuda_equals_numba_and_the_reference():
    """The torch path on CUDA (what ``method="auto"`` picks there) gives numba's changesets:
    graph traces at several capacities against the brute-force states, a long superbatch,
    the carried cache, and the duplicate-id refusal."""
    from ooc.caches.changesets import final_state

    batches = _graph_trace()
    touched = len(set(np.concatenate(batches).tolist()))
    ref_states, ref_misses = _brute_states(batches, touched // 5)
    for frac in (0.0, 0.05, 0.2, 1.0):
        cap = int(frac * touched)
        a = precompute_changesets(batches, 300, cap, device="cuda")
        assert a.method == "torch"
        assert a.equals(precompute_changesets(batches, 300, cap, method="numba"))
    states, misses = _replay(precompute_changesets(batches, 300, touched // 5, device="cuda"),
                             batches, touched // 5)
    assert states == ref_states and misses == ref_misses
    S, m = 5_000, 7
    long = _cyclic(S, m)
    assert precompute_changesets(long, S + m, m - 1, device="cuda").equals(
        precompute_changesets(long, S + m, m - 1, method="numba"))
    prev, nxt = batches[:12], batches[12:]
    a = precompute_changesets(prev, 300, 40, device="cuda", keep_unused=True)
    b = precompute_changesets(prev, 300, 40, method="numba", keep_unused=True)
    assert a.equals(b)
    cached = final_state(a)
    assert precompute_changesets(nxt, 300, 40, device="cuda", cached=cached, keep_unused=True).equals(
        precompute_changesets(nxt, 300, 40, method="numba", cached=cached, keep_unused=True))
    with pytest.raises(OocError, match="occurs twice in batch 1"):
        precompute_changesets([[1, 2], [3, 3]], 4, 1, device="cuda")


def _keep_unused_outs(plain, batches, capacity):
    """Reference for ``keep_unused``: replay Belady's outs with a Python FIFO of the entries
    it drops after their last access (found by scanning the later batches); a step that
    needs room evicts the oldest of them."""
    unused, size, outs = [], len(plain.init_ids), []
    for i, st_ in enumerate(plain.steps):
        out = sorted(int(v) for v in st_.out_ids)
        forced = [x for x in out if _later(batches, x, i)]
        unused += [x for x in out if not _later(batches, x, i)]
        size += len(st_.in_ids) - len(out)
        k = max(0, size + len(unused) - capacity)
        outs.append(sorted(forced + unused[:k]))
        unused = unused[k:]
    return outs


@pytest.mark.parametrize("method", METHODS)
def test_keep_unused_equals_a_fifo_of_dropped_entries(method):
    from ooc.caches.changesets import final_state

    rng = np.random.default_rng(11)
    traces = [_graph_trace(seed=s) for s in range(3)] + [_random_trace(rng, 30, 50, 12)
                                                         for _ in range(20)]
    for batches in traces:
        n = max(int(np.max(b)) for b in batches if len(b)) + 1
        for cap in (0, 1, 7, 40, n):
            plain = precompute_changesets(batches, n, cap, method=method)
            kept = precompute_changesets(batches, n, cap, method=method, keep_unused=True)
            assert [s.out_ids.tolist() for s in kept.steps] == _keep_unused_outs(plain, batches, cap)
            assert np.array_equal(kept.in_ids, plain.in_ids)
            assert np.array_equal(kept.out_later, np.zeros(0, bool))
            assert all(bool(lt) == _later(batches, int(x), i) for i, s in enumerate(plain.steps)
                       for x, lt in zip(s.out_ids, plain.out_later[plain.out_ptr[i]:], strict=False))
            cached = final_state(kept)
            full = [cached, *batches]
            carried = precompute_changesets(batches, n, cap, method=method, cached=cached,
                                            keep_unused=True)
            ref = _keep_unused_outs(precompute_changesets(full, n, cap, method=method), full, cap)
            assert [s.out_ids.tolist() for s in carried.steps] == ref[1:]


def test_final_state_of_huge_ids():
    from ooc.caches.changesets import final_state

    batches = _graph_trace()
    base = (1 << 62) - 1000  # past the packed sort key: the lexsort orders them
    a = precompute_changesets(batches, 300, 30, keep_unused=True)
    b = precompute_changesets([x + base for x in batches], base + 300, 30, keep_unused=True)
    assert len(final_state(a)) == 30
    assert np.array_equal(final_state(b), final_state(a) + base)


def test_bench_changesets_runs_and_checks_the_methods_agree(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "bench", "changesets", "--nodes", "20000", "--batch-size", "64",
                        "--superbatches", "2,5", "--rounds", "1", "--report",
                        str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300,
                       cwd=repo)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [row["superbatch"] for row in rep["rows"]] == [2, 5]
    assert set(rep["rows"][0]["median_s"]) >= {"numba", "torch-cpu"}
    assert 0 < rep["rows"][0]["misses"] <= rep["rows"][0]["accesses"]


def test_unique_sorted_is_numpys_unique_and_never_aliases_its_input():
    """Random, already strictly increasing (the fast path), sorted with repeats, empty and
    single inputs give ``np.unique``'s values; the result is never the input itself."""
    from ooc.caches.changesets import unique_sorted

    rng = np.random.default_rng(3)
    inc = np.sort(rng.choice(10_000, 3_000, replace=False)).astype(np.int64)
    cases = [rng.integers(0, 500, 2_000), inc, np.sort(rng.integers(0, 100, 1_000)),
             np.zeros(0, np.int64), np.array([7], np.int64), inc[::-1].copy()]
    for x in cases:
        x = np.asarray(x, dtype=np.int64)
        got = unique_sorted(x)
        np.testing.assert_array_equal(got, np.unique(x))
        assert not np.shares_memory(got, x) or x.size == 0


@pytest.mark.parametrize("seed", range(6))
def test_final_state_is_the_replayed_cache(seed):
    """The ids ``final_state`` gives are those a set holds after replaying every step's
    evictions and insertions from the initial ids (with and without a cached start,
    keeping unused entries or not)."""
    from ooc.caches.changesets import final_state

    rng = np.random.default_rng(seed)
    for trial in range(40):
        n = int(rng.integers(5, 80))
        cap = int(rng.integers(1, n))
        batches = [rng.choice(n, int(rng.integers(1, n)), replace=False)
                   for _ in range(int(rng.integers(1, 7)))]
        cached = rng.choice(n, int(rng.integers(0, cap + 1)), replace=False) if trial % 2 else None
        cs = precompute_changesets(batches, n, cap, cached=cached, keep_unused=bool(trial % 3))
        held = set(cs.init_ids.tolist())
        for i in range(len(cs)):
            held -= set(cs.out_ids[cs.out_ptr[i]:cs.out_ptr[i + 1]].tolist())
            held |= set(cs.in_ids[cs.in_ptr[i]:cs.in_ptr[i + 1]].tolist())
        np.testing.assert_array_equal(final_state(cs), np.array(sorted(held), np.int64))
