"""python -m bench modes' bound: the fewest reads a cache of a mode's size could make in the last
epoch, over the batches the trainer trains on, and the epoch those reads take."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import brute_belady_steps  # noqa: E402

import ooc  # noqa: E402
from bench import modes as bench
from ooc.storage.ingest import generate_synthetic  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return generate_synthetic(tmp_path_factory.mktemp("bound") / "d", nodes=600, avg_degree=4,
                              feature_dim=8, train_fraction=0.15, progress=False)


def test_fewest_reads_are_beladys_over_the_loaders_batches(small):
    """The trace is the batches ooc.NodeLoader gives epoch after epoch (the trainer's), and
    the count is the last epoch's misses of Belady over the whole run."""
    epochs, bs, fanouts = 3, 16, [3, 2]
    trace, last = [], 0
    with ooc.NodeLoader(ooc.open_dataset(small), fanouts, input_nodes="train", batch_size=bs,
                        shuffle=True, preset="baseline", seed=0) as loader:
        for _ in range(epochs):
            ids = [d.n_id.numpy() for d in loader]
            trace += ids
            last = len(ids)
    lookups = sum(len(b) for b in trace[-last:])
    caps = {"none": 0, "some": 40, "all": 600}
    got = bench.fewest_reads(small, bs, fanouts, 0, epochs, caps)
    for name, cap in caps.items():
        want = sum(brute_belady_steps(trace, cap)[-last:])
        assert got[name] == {"capacity_rows": cap, "rows": want, "lookups": lookups,
                             "miss_ratio": want / lookups}
    assert got["none"]["rows"] == lookups and got["all"]["rows"] == 0
    assert 0 < got["some"]["rows"] < lookups


def test_the_disk_bound_is_reads_at_the_disks_rate_and_never_under_the_in_ram_epoch():
    few = {"rows": 200_000}
    b = bench.disk_bound(few, 4096, 100_000.0, 1.5)
    assert b == {"iops": 100_000.0, "reads_s": 2.0, "epoch_s": 2.0,
                 "over_in_ram": pytest.approx(2.0 / 1.5)}
    b = bench.disk_bound(few, 8192, 400_000.0, 1.5)   # reads faster than the model's step
    assert b["epoch_s"] == 1.5 and b["over_in_ram"] == 1.0
    assert bench.disk_bound(few, 4096, 100_000.0, None) == {"iops": 100_000.0, "reads_s": 2.0,
                                                            "epoch_s": 2.0}
    for row_bytes, iops in ((512, 1e5), (4096, None)):   # rows sharing pages; no rate
        b = bench.disk_bound(few, row_bytes, iops, 1.0)
        assert b["epoch_s"] is None and b["why"]
    assert np.isfinite(bench.disk_bound({"rows": 0}, 4096, 1e5, 1.0)["epoch_s"])


def test_the_disks_rate_is_fios_or_the_fastest_modes_whichever_is_higher():
    """A shared disk's fio sample can be below what a mode then read at: the bound takes the
    higher, so no mode's measured reads beat it."""
    modes = {"baseline": {"gather_iops": 30_000.0}, "ooc": {"gather_iops": 45_000.0},
             "in_ram": {"gather_iops": None}, "static": {"error": "failed"}}
    assert bench.disk_iops(22_000.0, modes) == 45_000.0
    assert bench.disk_iops(90_000.0, modes) == 90_000.0
    assert bench.disk_iops(None, modes) == 45_000.0
    assert bench.disk_iops(None, {"ooc": {"error": "failed"}}) is None
