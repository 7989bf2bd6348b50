"""The packed data path: misses replayed from the changesets, swept in stored order and
packed per batch; the same rows and losses as the direct path, every miss from a segment."""
import numpy as np
import pytest
from conftest import skewed_dataset
from test_modes import _cfg

from ooc.caches.changesets import FlatChangesets, precompute_changesets
from ooc.caches.policies import AutoCache, PackedCache
from ooc.core.errors import InvalidValue
from ooc.executor.loader import _packing_kernels as K
from ooc.executor.loader.packing import DiskRates, Packer, PackStats, choose, read_plan
from ooc.executor.loader.stack import ModeOptions, build_stack
from ooc.executor.training.trainer import Trainer
from ooc.storage.features import InMemoryFeatures


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return skewed_dataset(tmp_path_factory.mktemp("p") / "d", 5, 32, "float32")  # 128 B rows


def _replay(init, batches, cs):
    """Brute force: the misses of every batch on a Python set of cached ids."""
    cached = set(int(v) for v in init)
    out = []
    for j, ids in enumerate(batches):
        out.append([int(v) for v in ids if int(v) not in cached])
        st = cs.step(j)
        cached -= set(int(v) for v in st.out_ids)
        cached |= set(int(v) for v in st.in_ids)
    return out


def test_window_misses_match_a_replay():
    rng = np.random.default_rng(0)
    n = 500
    batches = [np.unique(rng.integers(0, n, 60)) for _ in range(9)]
    cs = FlatChangesets.from_changesets(precompute_changesets(batches, n, 40, device="cpu"))
    want = _replay(cs.init_ids, batches, cs)
    node_ids = np.concatenate(batches)
    node_ptr = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
    for cap in (1, 50, 10_000):   # one batch a window, a few, all
        bits = np.zeros(n // 8 + 1, np.uint8)
        K.set_bits(bits, np.asarray(cs.init_ids, np.int64), True)
        j, got = 0, []
        while j < len(batches):
            j1, m, ptr = K.window_misses(bits, node_ids, node_ptr, cs.in_ids, cs.in_ptr,
                                         cs.out_ids, cs.out_ptr, j, cap, 4)
            assert j + 1 <= j1 <= j + 4 and (j1 == j + 1 or ptr[-1] <= cap)
            got += [m[ptr[t]:ptr[t + 1]].tolist() for t in range(j1 - j)]
            j = j1
        assert got == want


def _superbatch(rng, n, count, size, cache):
    """``count`` batches of ``size`` draws over ``n`` nodes, their changesets at a cache of
    ``cache`` rows, every batch's misses (brute force), flat ids and pointers."""
    batches = [np.unique(rng.integers(0, n, size)) for _ in range(count)]
    cs = FlatChangesets.from_changesets(precompute_changesets(batches, n, cache, device="cpu"))
    node_ptr = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
    return cs, _replay(cs.init_ids, batches, cs), np.concatenate(batches), node_ptr


def test_packer_segments_hold_each_batch_misses_in_stored_order(tmp_path):
    rng = np.random.default_rng(1)
    n, dim = 700, 8
    x = rng.standard_normal((n, dim)).astype(np.float32)
    row_of = rng.permutation(n).astype(np.int64)          # node v's row is row_of[v]
    stored = np.empty_like(x)
    stored[row_of] = x
    cs, want, node_ids, node_ptr = _superbatch(rng, n, 6, 90, 50)
    packer = Packer(InMemoryFeatures(stored), row_of, n, window_rows=150, window_bytes=1 << 30,
                    stats=PackStats())
    packer.start(cs.init_ids)
    j = k = 0
    while j < len(want):
        j1 = packer.add(node_ids, node_ptr, cs, j)
        assert j1 > j
        win = packer.flush(tmp_path / f"w{j}.bin", [("sb", j, j1)])
        data = win.path.read_bytes()
        for t in range(j1 - j):
            miss = np.array(want[j + t], np.int64)
            rows = np.sort(row_of[miss])
            seg = np.frombuffer(data, np.float32, count=len(rows) * dim,
                                offset=int(win.offsets[t])).reshape(-1, dim)
            np.testing.assert_array_equal(seg, stored[rows])
            assert win.offsets[t] % 4096 == 0 and win.counts[t] == len(rows)
        win.remove()
        assert not win.path.exists()
        j, k = j1, k + 1
    assert k >= 3 and packer.stats.windows == k
    assert packer.stats.rows_packed == sum(map(len, want))


def _opts(tmp_path, row_bytes):
    return ModeOptions(superbatch_size=6, runtime_dir=str(tmp_path / "rt"),
                       feature_cache_size=150 * row_bytes, neighbor_cache_size=40_000,
                       queue_depth=8)


def test_packed_batches_are_the_direct_paths_every_miss_from_a_segment(ds, tmp_path):
    d, x = ds
    out = {}
    for name, preset in (("ooc", "ooc"), ("packed", PackedCache(window_rows=600)),
                         ("wide", PackedCache(window_rows=1 << 20))):
        st = build_stack(d, _cfg("ooc"), _opts(tmp_path / name, d.layout.row_bytes),
                         preset=preset)
        try:
            got = []
            for epoch in (1, 2):
                for batch, rows in st.train.batches(epoch):
                    np.testing.assert_array_equal(rows, x[batch.node_ids])
                    got.append(batch.node_ids.copy())
            out[name] = (got, st.train.io_stats())
        finally:
            st.close()
        assert not list((tmp_path / name / "rt").rglob("*.bin"))
    (a, sa), (b, sb) = out["ooc"], out["packed"]
    assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    # windows of several superbatches (the inspector runs ahead): the same batches
    c, sw = out["wide"]
    assert all(np.array_equal(u, v) for u, v in zip(a, c, strict=True))
    assert sw["packed_fallback_rows"] == 0 and sw["packed_rows_packed"] == sa["feature_misses"]
    assert sw["packed_windows"] < len(a) / 6      # fewer windows than superbatches
    assert sb["feature_misses"] == sa["feature_misses"] > 0
    assert sb["packed_fallback_rows"] == 0
    assert sb["packed_rows_packed"] == sb["feature_misses"]
    assert sb["packed_windows"] > 2 * 2        # several windows a superbatch (600-row windows)
    assert sb["packed_segment_reads"] > 0 and sb["packed_bytes_written"] > 0
    assert sb["packed_sweep_rows_copied"] == sb["packed_sweep_rows"]
    # the direct reader read only the switches' rows
    assert sb["feature_bytes_read"] < sa["feature_bytes_read"]


def test_packed_losses_equal_ooc(ds, tmp_path):
    d, _ = ds
    losses = {}
    for mode in ("ooc", "packed"):
        with Trainer(d, _cfg(mode, eval_every=100), log=lambda m: None,
                     options=_opts(tmp_path / mode, d.layout.row_bytes)) as t:
            t.fit()
        losses[mode] = [h["loss"] for h in t.history]
        if mode == "packed":
            assert t.history[-1]["io"]["packed_fallback_rows"] == 0
    assert losses["ooc"] == losses["packed"]


@pytest.mark.parametrize("bad", [dict(page_mates=0.25), dict(window_rows=0),
                                 dict(disk_share=1.0)])
def test_bad_packed_settings_are_one_line(bad):
    with pytest.raises(InvalidValue, match="PackedCache"):
        PackedCache(**bad)


def test_read_plan_reads_through_short_gaps():
    rows = np.array([0, 1, 2, 10, 11, 40], np.int64)          # 512 B rows
    assert read_plan(rows, 512, 0) == (3, 6 * 512)
    assert read_plan(rows, 512, 7 * 512) == (2, 12 * 512 + 512)   # 3..9 read through
    assert read_plan(rows, 512, 1 << 20) == (1, 41 * 512)
    assert read_plan(np.arange(1024, dtype=np.int64), 512, 0, max_read_bytes=256 << 10) \
        == (2, 1024 * 512)


def test_choose_packs_dense_windows_and_reads_sparse_ones_directly():
    rates = DiskRates(op_s=1e-5, page_s=4096 / 1.3e9, write_bps=1.5e9)   # ~this disk
    rng = np.random.default_rng(2)

    def window(n_rows, batches, per_batch):
        parts = [np.sort(rng.choice(n_rows, per_batch, replace=False)) for _ in range(batches)]
        rows = np.concatenate(parts).astype(np.int64)
        ptr = np.concatenate([[0], np.cumsum([len(b) for b in parts])]).astype(np.int64)
        return rows, ptr, np.unique(rows)

    dense = choose(*window(1 << 20, 20, 100_000), 512, 12 << 10, rates)
    sparse = choose(*window(1 << 26, 2, 2_000), 512, 12 << 10, rates)
    assert dense.packed and dense.packed_s < dense.direct_s
    assert not sparse.packed and sparse.direct_s < sparse.packed_s


def test_auto_reads_the_same_rows_packed_or_not(ds, tmp_path):
    d, x = ds
    st = build_stack(d, _cfg("auto"), _opts(tmp_path, d.layout.row_bytes),
                     preset=AutoCache(window_rows=600))
    try:
        for batch, rows in st.train.batches(1):
            np.testing.assert_array_equal(rows, x[batch.node_ids])
        io = st.train.io_stats()
    finally:
        st.close()
    assert io["packed_fallback_rows"] == 0
    assert io["packed_windows"] + io["packed_windows_direct"] > 2
    if st.info["disk_rates"] is not None:    # O_DIRECT here: a prediction for every window
        assert io["packed_predicted_direct_s"] > 0 and io["packed_predicted_packed_s"] > 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="page-locked memory needs a CUDA device")
def test_rows_gathered_pinned_on_cuda(ds, tmp_path):
    import torch

    d, x = ds
    st = build_stack(d, _cfg("packed"), _opts(tmp_path, d.layout.row_bytes))
    st.train.pin_rows = True
    try:
        for batch, rows in st.train.batches(1):
            np.testing.assert_array_equal(rows, x[batch.node_ids])
            assert torch.from_numpy(rows).is_pinned()
    finally:
        st.close()


def test_a_new_epoch_drops_the_batches_of_a_window_left_unflushed(tmp_path):
    """An epoch whose packing was halted mid-window left batches in the packer: the next
    epoch's first window holds its own batches only."""
    rng = np.random.default_rng(2)
    n, dim = 400, 4
    x = rng.standard_normal((n, dim)).astype(np.float32)
    cs, want, node_ids, node_ptr = _superbatch(rng, n, 4, 50, 30)
    packer = Packer(InMemoryFeatures(x), None, n, window_rows=10_000, window_bytes=1 << 30,
                    stats=PackStats())
    packer.start(cs.init_ids)
    assert packer.add(node_ids, node_ptr, cs, 0) == 4 and packer.batches == 4  # never flushed
    packer.begin(10_000)
    assert packer.batches == 0
    packer.start(cs.init_ids)
    assert packer.add(node_ids, node_ptr, cs, 0) == 4
    win = packer.flush(tmp_path / "w.bin", [("sb", 0, 4)])
    assert win.counts.tolist() == [len(m) for m in want]
    data = win.path.read_bytes()
    for t, miss in enumerate(want):
        seg = np.frombuffer(data, np.float32, count=len(miss) * dim,
                            offset=int(win.offsets[t])).reshape(-1, dim)
        np.testing.assert_array_equal(seg, x[np.sort(np.array(miss, np.int64))])
    win.remove()

