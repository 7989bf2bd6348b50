"""Runtime files and the inspector pipeline (sampling overlapped with changesets)."""
import threading

import numpy as np
import pytest

from ooc.sampling.pipeline import Inspector, measure_bytes_per_batch, superbatch_size_for_budget
from ooc.sampling.runtime import (
    FlatChangesets,
    SuperbatchSamples,
    read_changesets,
    read_samples,
    write_changesets,
    write_samples,
)
from ooc.sampling.sampler import NeighborSampler, derive_seed, epoch_batches
from ooc.storage import OocError, csc_from_edges


def _graph(n=400, e=4000, seed=0):
    rng = np.random.default_rng(seed)
    return csc_from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)


def _batches(n, bs, seed=0):
    seeds = epoch_batches(np.arange(n), bs, seed, 0)
    return seeds, [derive_seed(seed, 0, i) for i in range(len(seeds))]


def test_runtime_round_trip(tmp_path):
    indptr, indices = _graph()
    sampler = NeighborSampler(indptr, indices, [5, 3])
    seeds, bseeds = _batches(400, 32)
    batches = sampler.sample_many(seeds[:5], bseeds[:5])
    samples = SuperbatchSamples.from_batches(batches, 2)
    write_samples(tmp_path / "sb", samples)
    back = read_samples(tmp_path / "sb")
    assert len(back) == 5
    for i, b in enumerate(batches):
        assert back.batch(i).equals(b)
        np.testing.assert_array_equal(back.ids(i), b.node_ids)


class _Step:
    def __init__(self, i, o, p):
        self.in_ids, self.out_ids, self.in_positions = i, o, p


class _CS:
    def __init__(self, init, steps):
        self.init_ids, self.steps = init, steps


def test_changeset_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    steps = [_Step(rng.integers(0, 99, k), rng.integers(0, 99, k // 2), rng.integers(0, 9, k))
             for k in (0, 3, 7, 1)]
    flat = FlatChangesets.from_changesets(_CS(np.array([4, 5, 6]), steps))
    (tmp_path / "sb").mkdir()
    write_changesets(tmp_path / "sb", flat)
    back = read_changesets(tmp_path / "sb")
    np.testing.assert_array_equal(back.init_ids, [4, 5, 6])
    for i, s in enumerate(steps):
        ins, outs, pos = back.step(i)
        np.testing.assert_array_equal(ins, s.in_ids)
        np.testing.assert_array_equal(outs, s.out_ids)
        np.testing.assert_array_equal(pos, s.in_positions)


def test_truncated_runtime_file_is_an_error(tmp_path):
    indptr, indices = _graph()
    sampler = NeighborSampler(indptr, indices, [4])
    seeds, bseeds = _batches(400, 50)
    batches = sampler.sample_many(seeds[:2], bseeds[:2])
    write_samples(tmp_path / "sb", SuperbatchSamples.from_batches(batches, 1))
    p = tmp_path / "sb" / "node_ids.bin"
    p.write_bytes(p.read_bytes()[:-8])
    with pytest.raises(OocError, match="node_ids.bin: truncated"):
        read_samples(tmp_path / "sb")


@pytest.mark.parametrize("superbatch_size", [1, 3, 100])
def test_pipeline_yields_every_batch_in_order(tmp_path, superbatch_size):
    indptr, indices = _graph()
    sampler = NeighborSampler(indptr, indices, [4, 4])
    seeds, bseeds = _batches(400, 30)
    seen_ids = []

    def fake_changesets(ids):
        seen_ids.append([a.copy() for a in ids])
        return _CS(ids[0][:2], [_Step(a[:1], np.zeros(0, np.int64), np.zeros(1, np.int64)) for a in ids])

    insp = Inspector(sampler, tmp_path / "rt", superbatch_size, changesets=fake_changesets)
    got = []
    folders = []
    for sb in insp.epoch(seeds, bseeds):
        samples, cs = sb.load()
        assert len(cs) == len(samples) == len(sb.batch_indices)
        for j, i in enumerate(sb.batch_indices):
            assert samples.batch(j).equals(sampler.sample(seeds[i], bseeds[i]))
            np.testing.assert_array_equal(cs.step(j)[0], samples.ids(j)[:1])
            got.append(i)
        folders.append(sb.folder)
        sb.release()
        assert not sb.folder.exists()
    assert got == list(range(len(seeds)))
    assert insp.stats.batches == len(seeds) and insp.stats.sample_s > 0
    assert sum(len(x) for x in seen_ids) == len(seeds)
    assert not any(f.exists() for f in folders)


def test_pipeline_error_and_early_close_clean_up(tmp_path):
    indptr, indices = _graph()
    sampler = NeighborSampler(indptr, indices, [4])
    seeds, bseeds = _batches(400, 20)

    def broken(ids):
        raise RuntimeError("changeset pass failed")

    with pytest.raises(RuntimeError, match="changeset pass failed"):
        for _sb in Inspector(sampler, tmp_path / "rt", 4, changesets=broken).epoch(seeds, bseeds):
            pass
    gen = Inspector(sampler, tmp_path / "rt2", 2).epoch(seeds, bseeds)
    next(gen)  # the sampler now waits for disk room the consumer never gives back
    gen.close()
    assert list((tmp_path / "rt2").iterdir()) == []

    class Failing(NeighborSampler):
        def sample_many(self, seed_batches, batch_seeds):
            raise OSError("indices.bin: read failed")

    bad = Failing(indptr, indices, [4])
    with pytest.raises(OSError, match="read failed"):
        list(Inspector(bad, tmp_path / "rt3", 2).epoch(seeds, bseeds))
    assert list((tmp_path / "rt3").iterdir()) == []
    # both stages' threads ended every time
    assert not [t for t in threading.enumerate() if t.name in ("ooc-sample", "ooc-changesets")]


def test_superbatch_size_from_budget():
    indptr, indices = _graph()
    sampler = NeighborSampler(indptr, indices, [4, 4])
    seeds, bseeds = _batches(400, 30)
    per = measure_bytes_per_batch(sampler, seeds, bseeds)
    assert per > 0
    s = superbatch_size_for_budget(int(per * 2 * 10) + 1, per, ahead=1)
    assert s == 10
    with pytest.raises(OocError, match="too small"):
        superbatch_size_for_budget(10, per)
