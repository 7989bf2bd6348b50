"""The feature cache against plain numpy indexing, under heavy churn."""
import numpy as np
import pytest

from ooc.executor.cache.feature_cache import FeatureCache


class ArraySource:
    def __init__(self, x):
        self.x = x
        self.reads = 0

    def read(self, ids):
        self.reads += len(ids)
        return self.x[ids]


def _random_changeset(rng, cached, batch, capacity):
    """A valid changeset: insert some batch ids not cached, evict enough to fit."""
    cand = np.setdiff1d(batch, cached)
    ins = rng.choice(cand, size=min(len(cand), rng.integers(0, capacity + 1)), replace=False) \
        if len(cand) else np.zeros(0, np.int64)
    room = capacity - len(cached)
    need = max(0, len(ins) - room)
    extra = rng.integers(0, 3)
    evict = rng.choice(cached, size=min(len(cached), need + extra), replace=False) \
        if len(cached) else np.zeros(0, np.int64)
    if len(cached) - len(evict) + len(ins) > capacity:
        ins = ins[: capacity - (len(cached) - len(evict))]
    return ins.astype(np.int64), evict.astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_and_update_match_numpy(dtype):
    rng = np.random.default_rng(0)
    n, d, cap = 300, 17, 40
    x = rng.standard_normal((n, d)).astype(dtype)
    src = ArraySource(x)
    fc = FeatureCache(n, cap, d, dtype)
    init = rng.choice(n, 25, replace=False)
    assert fc.switch(init, src) == 25
    cached = np.sort(init)
    total_miss = 0
    for step in range(200):
        batch = rng.choice(n, rng.integers(1, 60), replace=False)
        out, nmiss = fc.gather(batch, src)
        np.testing.assert_array_equal(out, x[batch])
        assert nmiss == len(np.setdiff1d(batch, cached))
        total_miss += nmiss
        ins, evict = _random_changeset(rng, cached, batch, cap)
        pos = np.array([np.flatnonzero(batch == i)[0] for i in ins], dtype=np.int64)
        fc.update(ins, evict, pos, out)
        cached = np.sort(np.union1d(np.setdiff1d(cached, evict), ins))
        np.testing.assert_array_equal(fc.cached_ids(), cached)
        assert len(fc) == len(cached) <= cap
        slots = fc.address_table[cached]
        np.testing.assert_array_equal(fc.cache[slots], x[cached])
        if step % 50 == 49:  # a superbatch switch keeps the rows that stay
            new_init = rng.choice(n, 30, replace=False)
            reads_before = src.reads
            fc.switch(new_init, src)
            assert src.reads - reads_before == len(np.setdiff1d(new_init, cached))
            cached = np.sort(new_init)
            np.testing.assert_array_equal(fc.cached_ids(), cached)
    assert fc.lookups > 0 and fc.hits == fc.lookups - total_miss


def test_zero_capacity_reads_everything():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    fc = FeatureCache(10, 0, 4, np.float32)
    out, nmiss = fc.gather(np.array([3, 1]), ArraySource(x))
    np.testing.assert_array_equal(out, x[[3, 1]])
    assert nmiss == 2
    fc.update(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), out)
