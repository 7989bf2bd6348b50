"""storage.reorder.locality_order: planted communities hidden by a random permutation come
back as contiguous groups; the order is a permutation; windows do not change the result."""
import numpy as np
import pytest

from ooc.storage import csc_from_edges
from ooc.storage.reorder import OrderStats, locality_order


def _planted(k: int = 40, size: int = 24, p_out: float = 0.05, seed: int = 0):
    """k communities of ``size`` nodes (dense inside, a few edges across), ids permuted;
    returns (indptr, indices, community of every node id)."""
    rng = np.random.default_rng(seed)
    n = k * size
    comm = np.repeat(np.arange(k), size)
    src, dst = [], []
    for c in range(k):
        members = np.arange(c * size, (c + 1) * size)
        for v in members:
            nb = rng.choice(members[members != v], 8, replace=False)
            src += [v] * len(nb)
            dst += nb.tolist()
    m = int(p_out * len(src))
    src += rng.integers(0, n, m).tolist()
    dst += rng.integers(0, n, m).tolist()
    perm = rng.permutation(n)
    src, dst = perm[np.array(src)], perm[np.array(dst)]
    keep = src != dst
    both = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    indptr, indices = csc_from_edges(both[0], both[1], n)
    comm_of = np.empty(n, np.int64)
    comm_of[perm] = comm
    return indptr, indices, comm_of


def _contiguity(order: np.ndarray, comm: np.ndarray) -> float:
    """Share of neighbouring positions of the order that hold the same community."""
    c = comm[order]
    return float((c[1:] == c[:-1]).mean())


def test_planted_communities_become_contiguous():
    indptr, indices, comm = _planted()
    st = OrderStats(0, [], 0, 0)
    order = locality_order(indptr, indices, cap=64, stats=st)
    assert order.dtype == np.int32
    np.testing.assert_array_equal(np.sort(order), np.arange(len(comm)))
    assert _contiguity(np.arange(len(comm)), comm) < 0.1       # the ids hide them
    assert _contiguity(order, comm) > 0.9, st
    assert st.largest_group <= 64 and st.sweeps >= 1


def test_cap_bounds_every_group():
    indptr, indices, comm = _planted(k=10, size=40)
    st = OrderStats(0, [], 0, 0)
    locality_order(indptr, indices, cap=16, stats=st)
    assert st.largest_group <= 16


@pytest.mark.parametrize("window", [8, 256, 1 << 20])
def test_window_size_does_not_change_the_order(window):
    indptr, indices, _ = _planted(k=12, size=20, seed=3)
    ref = locality_order(indptr, indices, cap=64)
    np.testing.assert_array_equal(locality_order(indptr, indices, cap=64, window_bytes=window),
                                  ref)


def test_isolated_nodes_and_empty_graph():
    indptr = np.zeros(6, np.int64)
    order = locality_order(indptr, np.zeros(0, np.int32))
    np.testing.assert_array_equal(order, np.arange(5))
