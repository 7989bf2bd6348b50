"""Model averaging and workload allocation (ooc.executor.distributed.averaging): pure functions."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ooc.executor.distributed.averaging import (
    allocate_partitions,
    assign_partitions,
    dataset_bytes,
    finish_average,
    flatten,
    unflatten,
    weighted_sum,
    zeros_like_state,
)
from ooc.storage import OocError


def test_allocation_rule_boundary():
    # M = 150, T = 2/3 M = 100: each worker holds M - T = 50 bytes of data
    assert allocate_partitions(100, 2, 150) == 2          # S = q (M - T): one part each
    assert allocate_partitions(101, 2, 150) == 3          # ceil(101 / 50)
    assert allocate_partitions(0, 4, 150) == 4
    assert allocate_partitions(500, 1, 300) == 5          # exactly 5 x 100
    assert allocate_partitions(501, 1, 300) == 6
    assert allocate_partitions(10**12, 3, None) == 3      # no budget: p = q
    assert allocate_partitions(1000, 4, 100, compute_fraction=0.5) == 20
    assert allocate_partitions(1000, 4, 100, compute_bytes=90) == 100
    assert allocate_partitions(1000, 4, 100, compute_bytes=0) == 10


@settings(max_examples=200, deadline=None)
@given(s=st.integers(0, 10**7), q=st.integers(1, 16), m=st.integers(3, 10**6),
       t_num=st.integers(0, 99))
def test_allocation_rule_matches_definition(s, q, m, t_num):
    t = m * t_num // 100  # integer T < M
    p = allocate_partitions(s, q, m, compute_bytes=t)
    if s <= q * (m - t):
        assert p == q
    else:
        assert p == -(-s // (m - t)) and p > q
        # every partition fits the free memory, one fewer would not
        assert s <= p * (m - t) and s > (p - 1) * (m - t)


def test_allocation_rule_errors():
    with pytest.raises(OocError, match="workers"):
        allocate_partitions(10, 0, 100)
    with pytest.raises(OocError, match="^compute_fraction must be"):
        allocate_partitions(10, 1, 100, compute_fraction=1.0)
    with pytest.raises(OocError, match="T=100"):
        allocate_partitions(10, 1, 100, compute_bytes=100)


def test_cyclic_assignment():
    assert assign_partitions(4, 2) == [[0, 2], [1, 3]]
    assert assign_partitions(5, 2) == [[0, 2, 4], [1, 3]]
    assert assign_partitions(2, 3) == [[0], [1], []]
    a = assign_partitions(7, 3)
    assert sorted(j for r in a for j in r) == list(range(7))
    assert {len(r) for r in a} <= {math.floor(7 / 3), math.ceil(7 / 3)}


def _states(k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g),
             "n": torch.tensor(7)} for _ in range(k)]


def average(states, weights):
    """The one-process average: the weighted sum divided by the total weight."""
    return finish_average(weighted_sum(states, weights), float(sum(weights)), states[0])


def numpy_average(states, weights, key):
    return sum(np.float64(w) * s[key].numpy().astype(np.float64)
               for s, w in zip(states, weights, strict=True)) / float(sum(weights))


def test_weighted_average_against_numpy():
    states, weights = _states(3), [10, 30, 60]
    avg = average(states, weights)
    np.testing.assert_allclose(avg["w"].numpy(), numpy_average(states, weights, "w"), rtol=1e-6)
    assert avg["w"].dtype == torch.float32
    assert int(avg["n"]) == 7  # integer buffers are copied, not averaged
    # equal weights: the plain mean; one state: itself
    np.testing.assert_allclose(average(states, [1, 1, 1])["b"].numpy(),
                               torch.stack([s["b"] for s in states]).mean(0).numpy(), rtol=1e-6)
    assert torch.equal(average(states[:1], [5])["w"], states[0]["w"])


def test_partial_sums_over_workers_equal_one_process():
    """What two workers compute (partial sums, summed, divided) = the one-process average."""
    states, weights = _states(4, seed=1), [3, 5, 7, 11]
    like = states[0]
    keys = [k for k, v in like.items() if v.is_floating_point()]
    parts = [weighted_sum([states[j] for j in mine], [weights[j] for j in mine])
             for mine in assign_partitions(4, 2)]
    total = flatten(parts[0], keys) + flatten(parts[1], keys)
    avg = finish_average(unflatten(total, like, keys), sum(weights), like)
    for k in keys:
        np.testing.assert_allclose(avg[k].numpy(), numpy_average(states, weights, k), rtol=1e-6)
    assert torch.equal(avg["n"], like["n"])
    zero = zeros_like_state(like)
    assert set(zero) == set(keys) and all(float(v.abs().sum()) == 0 for v in zero.values())
    with pytest.raises(OocError, match="no training nodes"):
        finish_average(parts[0], 0.0, like)


def test_dataset_bytes(small_dataset):
    path, _ = small_dataset
    files = [f for f in path.iterdir() if f.is_file()]
    (path / "runtime").mkdir()
    (path / "runtime" / "junk").write_bytes(b"x" * 1000)
    assert dataset_bytes(path) == sum(f.stat().st_size for f in files)
    with pytest.raises(OocError, match="not a dataset folder"):
        dataset_bytes(path / "nope")
