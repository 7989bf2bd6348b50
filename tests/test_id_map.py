"""IdMap (the caches' id -> slot hash map) against a Python dict, under churn."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ooc.storage import OocError
from ooc.storage.id_map import IdMap


def _check(m: IdMap, ref: dict, universe: np.ndarray) -> None:
    got = m.get(universe)
    want = np.array([ref.get(int(k), -1) for k in universe], np.int64)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(m.ids(), np.array(sorted(ref), np.int64))
    ids, vals = m.items()
    assert dict(zip(ids.tolist(), vals.tolist(), strict=True)) == ref and len(ids) == len(ref)
    assert len(m) == len(ref)


@pytest.mark.parametrize("max_key,direct", [(999, False), (2**40, False), (99, True)])
def test_matches_a_dict_under_churn(max_key, direct):
    """A hash table (int32 or int64 keys), or the direct table where that is smaller."""
    rng = np.random.default_rng(0)
    cap = 64
    # few distinct keys so that probe runs collide and wrap; large ids for int64 keys
    universe = np.unique(rng.integers(0, max_key + 1, 300)).astype(np.int64)
    m = IdMap(cap, max_key)
    assert m.keys.dtype == (np.int32 if max_key < 2**31 else np.int64)
    assert m.direct == direct
    assert m.nbytes <= (max_key + 1) * 4 or m.nbytes <= 4 * cap * m.keys.itemsize * 2
    ref: dict[int, int] = {}
    for _ in range(300):
        held = np.array(sorted(ref), np.int64)
        out = rng.choice(held, min(len(held), rng.integers(0, 20)), replace=False) \
            if len(held) else np.zeros(0, np.int64)
        absent = rng.choice(universe, 3)  # removing what is not there is a no-op
        vals = m.remove(np.concatenate([out, absent[~np.isin(absent, held)]]))
        assert list(vals[:len(out)]) == [ref.pop(int(k)) for k in out]
        assert (vals[len(out):] == -1).all()
        free = np.setdiff1d(universe, np.array(sorted(ref), np.int64))
        k = min(len(free), cap - len(ref), int(rng.integers(0, 20)))
        ins = rng.choice(free, k, replace=False)
        v = rng.integers(0, cap, k)
        m.put(ins, v)
        ref.update(zip(ins.tolist(), v.tolist(), strict=True))
        _check(m, ref, universe)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200))
def test_any_sequence_of_puts_and_removes(ops):
    """Keys 0..40 in a table of 16 places: every probe run wraps and collides."""
    m = IdMap(8, 40)
    assert not m.direct
    ref: dict[int, int] = {}
    for i, (add, k) in enumerate(ops):
        if add and k not in ref and len(ref) < 8:
            m.put(np.array([k]), np.array([i]))
            ref[k] = i
        elif not add:
            assert m.remove(np.array([k]))[0] == ref.pop(k, -1)
    _check(m, ref, np.arange(41, dtype=np.int64))


def test_over_capacity_is_refused():
    m = IdMap(2, 10)
    m.put(np.array([1, 2]), np.array([0, 1]))
    with pytest.raises(OocError, match="exceed its capacity 2"):
        m.put(np.array([3]), np.array([2]))
    assert m.nbytes == m.keys.nbytes + m.vals.nbytes
