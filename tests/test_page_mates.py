"""Belady changesets with page-mates against a plain-Python reference.

When rows share pages, a step also inserts the ids that share a page with one of
the batch's misses (their rows come with the pages read): ``_brute_mates`` is the
recurrence written out with sets and future scans, separately from both fast paths.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import draw_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from ooc.caches.changesets import precompute_changesets
from ooc.core.errors import OocError

METHODS = ["torch", "numba"]


def _next_use(bs, x, i):
    return next((j for j in range(i + 1, len(bs)) if x in bs[j]), None)


def _brute_mates(batches, capacity, page, fraction):
    """States C_0..C_S, per-step misses and per-step inserted page-mates (sorted)."""
    bs = [set(int(v) for v in b) for b in batches]
    trace = set().union(*bs) if bs else set()
    first = {}
    for i, b in enumerate(bs):
        for x in b:
            first.setdefault(x, i)
    c = set(sorted(first, key=lambda x: (first[x], x))[:capacity])
    states, misses, mates_in = [set(c)], [], []
    for i, b in enumerate(bs):
        miss = b - c
        misses.append(len(miss))
        read = {page(x) for x in miss}
        mates = [(n, x) for x in trace - c - b if page(x) in read
                 for n in [_next_use(bs, x, i)] if n is not None]
        mates = set(x for _, x in sorted(mates)[:int(fraction * len(b))])
        cands = []
        for x in c | b | mates:
            n = _next_use(bs, x, i)
            if n is not None:
                cands.append((n, 0 if x in c else 1, x))
        new = set(x for _, _, x in sorted(cands)[:capacity])
        mates_in.append(sorted(new & mates))
        c = new
        states.append(set(c))
    return states, misses, mates_in


def _replay(cs, batches, capacity, page):
    """Every step valid: page-mates at positions after the batch, on pages the batch
    read, not cached and not in the batch. Returns states, misses and inserted mates."""
    c = set(int(v) for v in cs.init_ids)
    states, misses, mates_in = [set(c)], [], []
    for i, b in enumerate(batches):
        b = np.asarray(b, dtype=np.int64)
        bset = set(b.tolist())
        miss = bset - c
        misses.append(len(miss))
        s = cs.step(i)
        ins, outs, pos = (np.asarray(a) for a in s)
        inb = pos < len(b)
        assert np.array_equal(b[pos[inb]], ins[inb])
        assert set(ins[inb].tolist()) <= miss
        mates = ins[~inb]
        assert pos[~inb].tolist() == list(range(len(b), len(b) + len(mates)))
        assert mates.tolist() == sorted(mates.tolist())
        assert not (set(mates.tolist()) & (c | bset))
        assert {page(x) for x in mates.tolist()} <= {page(x) for x in miss}
        assert set(outs.tolist()) <= c
        c = (c - set(outs.tolist())) | set(ins.tolist())
        assert len(c) <= capacity
        mates_in.append(mates.tolist())
        states.append(set(c))
    assert cs.misses.tolist() == misses
    return states, misses, mates_in


def _check(batches, capacity, num_nodes, rows_per_page, fraction=0.25, row_of=None):
    row_of = np.arange(num_nodes) if row_of is None else row_of

    def pages(ids):
        return row_of[np.asarray(ids, np.int64)] // rows_per_page

    def page(x):
        return int(row_of[x]) // rows_per_page

    ref = _brute_mates(batches, capacity, page, fraction)
    results = [precompute_changesets(batches, num_nodes, capacity, method=m, pages=pages,
                                     mate_fraction=fraction) for m in METHODS]
    assert results[0].equals(results[1])
    for cs in results:
        assert _replay(cs, batches, capacity, page) == ref
    return results[1], ref


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_traces_with_page_mates(data):
    S = data.draw(st.integers(1, 10))
    N = data.draw(st.integers(1, 40))
    batches = draw_batches(data, S, N, 12)
    cap = data.draw(st.integers(0, N + 2))
    rpp = data.draw(st.sampled_from([2, 4, 8]))
    frac = data.draw(st.sampled_from([0.1, 0.5, 1.0, 4.0]))
    perm = np.random.default_rng(data.draw(st.integers(0, 99))).permutation(N)
    _check(batches, cap, N, rpp, frac, perm)


def test_page_mates_save_reads_and_compact_ids():
    """On a trace with locality, page-mates cut the pages read; ids far apart (compact
    local ids) give the same changesets as small ids."""
    rng = np.random.default_rng(5)
    n, rpp = 400, 8
    batches = []
    for _ in range(24):  # each batch: a few pages' worth of neighbouring ids
        starts = rng.choice(n // rpp, 4, replace=False) * rpp
        ids = np.unique(np.concatenate([s + rng.choice(rpp, 3, replace=False) for s in starts]))
        batches.append(rng.permutation(ids).astype(np.int64))
    cap = 60

    def pages_read(cs):
        c, total = set(cs.init_ids.tolist()), 0
        for i, b in enumerate(batches):
            total += len({x // rpp for x in set(b.tolist()) - c})
            ins, outs, _ = cs.step(i)
            c = (c - set(outs.tolist())) | set(ins.tolist())
        return total

    plain = precompute_changesets(batches, n, cap)
    with_mates, _ = _check(batches, cap, n, rpp, 1.0)
    assert with_mates.num_misses < plain.num_misses
    assert pages_read(with_mates) < pages_read(plain)
    big = 1 << 40
    for m in METHODS:
        far = precompute_changesets([b + big for b in batches], big + n, cap, method=m,
                                    pages=lambda ids: (ids - big) // rpp, mate_fraction=1.0)
        assert far.misses.tolist() == with_mates.misses.tolist()
        assert np.array_equal(far.in_ids - big, with_mates.in_ids)
        assert np.array_equal(far.in_positions, with_mates.in_positions)


@pytest.mark.parametrize("method", METHODS)
def test_page_mates_carried_across_superbatches(method):
    """With ``cached`` and ``keep_unused`` (what training runs), the replay stays valid."""
    rng = np.random.default_rng(2)
    batches = [rng.choice(200, 30, replace=False).astype(np.int64) for _ in range(12)]
    cached = None
    for a in (0, 6):
        part = batches[a:a + 6]
        cs = precompute_changesets(part, 200, 40, method=method, cached=cached,
                                   keep_unused=True, pages=lambda ids: ids // 4, mate_fraction=0.5)
        other = precompute_changesets(part, 200, 40, method="numba" if method == "torch"
                                      else "torch", cached=cached, keep_unused=True,
                                      pages=lambda ids: ids // 4, mate_fraction=0.5)
        assert cs.equals(other)
        c = set(cs.init_ids.tolist())
        for i, b in enumerate(part):
            ins, outs, pos = cs.step(i)
            assert set(outs.tolist()) <= c
            mates = ins[pos >= len(b)]
            assert not (set(mates.tolist()) & (c | set(b.tolist())))
            c = (c - set(outs.tolist())) | set(ins.tolist())
            assert len(c) <= 40
        from ooc.caches.changesets import final_state
        cached = final_state(cs)
        assert set(cached.tolist()) == c


def test_bad_page_arguments():
    b = [np.array([0, 1, 2], np.int64)]
    with pytest.raises(OocError, match="pages"):
        precompute_changesets(b, 4, 2, method="numba", pages=lambda ids: ids[:1])
    with pytest.raises(OocError, match="mate_fraction"):
        precompute_changesets(b, 4, 2, pages=lambda ids: ids, mate_fraction=-1)
