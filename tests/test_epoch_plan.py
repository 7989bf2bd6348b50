"""The epoch plan: the same batches and sampling seeds as the code before it, in every
preset, the trainer's loader, the planner's probe and the benchmarks' harness."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from conftest import community_graph

import ooc
from ooc.sampling import EpochPlan, NeighborSampler, derive_seed, epoch_batches, unplanned_seed

PRESETS = ["baseline", "static", "ooc"]
FANOUTS, BATCH, SEED = [4, 3], 48, 11


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = community_graph(tmp_path_factory.mktemp("plan") / "g", n=500)
    return ooc.open_dataset(path)


def reference_plan(ids, batch_size: int, seed: int, epoch: int, shuffle: bool = True):
    """The plan as every consumer wrote it out before :class:`EpochPlan`."""
    batches = epoch_batches(ids, batch_size, seed, epoch, shuffle=shuffle)
    return batches, [derive_seed(seed, epoch, b) for b in range(len(batches))]


def reference_samples(ds, ids, epoch: int, seed: int = SEED, shuffle: bool = True):
    """The sampled batches of ``epoch`` from an in-memory sampler over the reference plan."""
    sampler = NeighborSampler(np.asarray(ds.indptr), np.asarray(ds.indices), FANOUTS)
    return sampler.sample_many(*reference_plan(ids, BATCH, seed, epoch, shuffle))


def digest(batches) -> int:
    """crc32 of every batch's node ids and edges, in order."""
    h = 0
    for b in batches:
        h = zlib.crc32(np.ascontiguousarray(b.node_ids, dtype=np.int64).tobytes(), h)
        h = zlib.crc32(np.ascontiguousarray(b.edge_index, dtype=np.int64).tobytes(), h)
    return h


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("epoch", [0, 1, 2, 7])
def test_plan_is_the_reference(epoch, shuffle):
    ids = np.random.default_rng(3).permutation(1000)[:613].astype(np.int64)
    plan = EpochPlan(ids, 50, SEED, epoch, shuffle)
    batches, seeds = reference_plan(ids, 50, SEED, epoch, shuffle)
    assert len(plan) == len(batches) == 13
    assert all(np.array_equal(a, b) for a, b in zip(plan.batches, batches, strict=True))
    assert plan.seeds == seeds
    first_b, first_s = plan.first(4)
    assert first_s == seeds[:4] and len(first_b) == 4
    assert all(np.array_equal(a, b) for a, b in zip(first_b, batches[:4], strict=True))
    assert plan.first(100)[1] == seeds  # more than the epoch: all of it


def test_plan_edges():
    assert len(EpochPlan(np.empty(0, np.int64), 8, 0, 1)) == 0
    assert EpochPlan(np.empty(0, np.int64), 8, 0, 1).first() == ([], [])
    with pytest.raises(ooc.OocError, match="batch_size must be positive"):
        EpochPlan(np.arange(4), 0, 0, 1)
    ids = np.arange(10, dtype=np.int64)
    assert unplanned_seed(5, ids) == derive_seed(5, 0, zlib.crc32(ids.tobytes()))


@pytest.mark.parametrize("preset", PRESETS)
def test_loader_batches_are_the_reference(graph, preset):
    """Every preset's loader samples the reference plan's batches, epoch after epoch."""
    with ooc.NodeLoader(graph, FANOUTS, "train", batch_size=BATCH, shuffle=True, seed=SEED,
                        preset=preset, superbatch_size=3) as loader:
        for epoch in (1, 2, 3):
            got = [b for b, _ in loader.sampled(epoch)]
            want = reference_samples(graph, graph.train_idx, epoch)
            assert len(got) == len(want) == len(loader)
            assert all(a.equals(b) for a, b in zip(got, want, strict=True)), (preset, epoch)


def test_recorded_batches(graph):
    """The reference itself against batches recorded before the epoch plan was one class
    (the digests of epochs 1 to 3 and of the evaluation order)."""
    got = [digest(reference_samples(graph, graph.train_idx, e)) for e in (1, 2, 3)]
    got.append(digest(reference_samples(graph, graph.val_idx, 0, SEED + 0x5EED, False)))
    assert got == RECORDED


#: :func:`digest` of the reference batches, recorded on the commit before EpochPlan
RECORDED: list[int] = [1379419858, 680438090, 2574947939, 1730221867]


def test_trainer_loader_is_the_reference(graph):
    """The trainer's loader: the same batches as a user's, through the public constructor."""
    from ooc.executor.training.trainer import TrainConfig, Trainer

    cfg = TrainConfig(fanouts=FANOUTS, batch_size=BATCH, seed=SEED, mode="static", epochs=1,
                      hidden=8, progress=False)
    with Trainer(graph, cfg) as t:
        got = [b for b, _ in t.train_loader.sampled(2)]
    want = reference_samples(graph, graph.train_idx, 2)
    assert all(a.equals(b) for a, b in zip(got, want, strict=True))


def test_bench_harness_plan_is_the_reference():
    from bench import harness as H

    ids = np.arange(300, dtype=np.int64)
    batches, seeds = H.epoch_plan(ids, 32, 5, 4)
    ref_b, ref_s = reference_plan(ids, 32, 5, 4)
    assert seeds == ref_s
    assert all(np.array_equal(a, b) for a, b in zip(batches, ref_b, strict=True))
