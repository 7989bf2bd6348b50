"""The three presets through one code path: identical batches and rows, identical losses;
presets composed of other readers and policies plug in at one place."""
import json

import numpy as np
import pytest
from conftest import CORA_RAW, skewed_dataset

from ooc.executor.loader.presets import PRESET_NAMES as MODES
from ooc.executor.loader.stack import ModeOptions, build_stack
from ooc.executor.training.trainer import TrainConfig, Trainer
from ooc.sampling.sampler import NeighborSampler

MODE_PARAMS = ["baseline", "static", "ooc", "packed"]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return skewed_dataset(tmp_path_factory.mktemp("m") / "d", 11, 24, "float16")


def _cfg(mode, **kw):
    base = dict(model="sage", fanouts=[5, 5], batch_size=64, hidden=16, epochs=2, seed=4,
                mode=mode, progress=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def _opts(tmp_path, row_bytes):
    # a small feature cache (150 rows of 3000) and neighbor cache: heavy churn
    return ModeOptions(superbatch_size=4, runtime_dir=str(tmp_path / "rt"),
                       feature_cache_size=150 * row_bytes, neighbor_cache_size=40_000,
                       queue_depth=8, io_threads=4)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_every_batch_bit_identical(ds, tmp_path, mode):
    d, x = ds
    cfg = _cfg(mode)
    mp = build_stack(d, cfg, _opts(tmp_path, d.layout.row_bytes))
    ref = NeighborSampler(d.indptr, np.asarray(d.indices), cfg.fanouts)
    try:
        for epoch in (1, 2):
            sb, bseeds = mp.train.plan(epoch)
            k = 0
            for batch, rows in mp.train.batches(epoch):
                assert batch.equals(ref.sample(sb[k], bseeds[k]))
                assert rows.dtype == x.dtype
                np.testing.assert_array_equal(rows, x[batch.node_ids])
                k += 1
            assert k == len(sb) > 20
        ev = mp.eval_factory(d.val_idx)
        for batch, rows in ev.batches(0):
            np.testing.assert_array_equal(rows, x[batch.node_ids])
        st = mp.train.io_stats()
        if mode == "baseline":
            assert st["feature_misses"] == st["feature_lookups"]
        else:
            assert 0 < st["feature_misses"] < st["feature_lookups"]
            assert st["feature_read_ops"] > 0 and st["neighbor_cache_misses"] > 0
    finally:
        mp.close()
    assert not list((tmp_path / "rt").rglob("*.bin"))


def test_same_losses_in_every_mode(ds, tmp_path):
    d, _ = ds
    losses = {}
    for mode in MODES:
        t = Trainer(d, _cfg(mode, eval_every=100), log=lambda m: None,
                    options=_opts(tmp_path / mode, d.layout.row_bytes))
        t.fit()
        t.close()
        losses[mode] = [h["loss"] for h in t.history]
        rec = t.history[-1]
        assert rec["io"]["feature_lookups"] > 0
        assert {"gather", "compute", "stall"} <= set(rec["timers"])
    # ooc with page-mates (48 B rows share pages): the cache changes, never the rows
    from ooc.caches.policies import BeladyCache

    with Trainer(d, _cfg("ooc", eval_every=100), log=lambda m: None,
                 options=_opts(tmp_path / "mates", d.layout.row_bytes),
                 preset=BeladyCache(page_mates=0.25)) as t:
        t.fit()
    losses["ooc-mates"] = [h["loss"] for h in t.history]
    assert t.history[-1]["io"]["feature_page_mates_read"] > 0
    assert set(losses) == {"baseline", "static", "ooc", "packed", "auto", "ooc-mates"}
    ref = losses["baseline"]
    for mode, ls in losses.items():
        np.testing.assert_allclose(ls, ref, rtol=1e-6, err_msg=mode)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_cli_mode_report(ds, tmp_path, mode):
    from ooc.train import main

    d, _ = ds
    rep = tmp_path / "r.json"
    rc = main(["--data", str(d.path), "--mode", mode, "--epochs", "1", "--fanouts", "5,5",
               "--batch-size", "128", "--hidden", "16", "--no-progress", "--device", "cpu",
               "--feature-cache-size", "8KiB", "--neighbor-cache-size", "30000",
               "--superbatch-size", "3", "--runtime-dir", str(tmp_path / "rt"),
               "--queue-depth", "4", "--report", str(rep)])
    assert rc == 0
    r = json.loads(rep.read_text())
    assert r["mode"] == mode and r["test_acc"] is not None
    io = r["epochs"][0]["io"]
    assert io["feature_lookups"] > 0
    if mode != "baseline":
        assert r["mode_info"]["feature_cache_rows"] == 8192 // d.layout.row_bytes


@pytest.mark.usefixtures("cora_raw")
def test_ooc_mode_cora_accuracy(tmp_path):
    from ooc.prepare import main as prepare
    from ooc.train import main

    assert prepare(["planetoid", "--root", str(CORA_RAW.parent.parent), "--name", "Cora",
                    "--out", str(tmp_path / "cora"), "--no-progress"]) == 0
    rep = tmp_path / "r.json"
    assert main(["--data", str(tmp_path / "cora"), "--mode", "ooc", "--model", "sage",
                 "--fanouts", "10,10", "--epochs", "50", "--batch-size", "140",
                 "--eval-every", "50", "--no-progress", "--device", "cpu",
                 "--report", str(rep)]) == 0
    assert json.loads(rep.read_text())["test_acc"] >= 0.78


def test_composed_presets_plug_in(ds, tmp_path):
    """A preset of O_DIRECT readers and no feature cache, and a cache policy object in
    place of a preset name, build through the same stack and give the same batches."""
    from ooc.caches.policies import BeladyCache, NoCache, StaticCache
    from ooc.executor.loader.presets import Preset, resolve_preset
    from ooc.executor.loader.readers import DirectReaders

    d, x = ds
    cfg = _cfg("ooc")
    ref = NeighborSampler(d.indptr, np.asarray(d.indices), cfg.fanouts)
    presets = [Preset("direct-nocache", DirectReaders(), NoCache()), StaticCache(),
               BeladyCache(superbatch_size=3, page_mates=0.25)]
    for preset in presets:
        mp = build_stack(d, cfg, _opts(tmp_path, d.layout.row_bytes), preset=preset)
        try:
            sb, bseeds = mp.train.plan(1)
            k = 0
            for batch, rows in mp.train.batches(1):
                assert batch.equals(ref.sample(sb[k], bseeds[k]))
                np.testing.assert_array_equal(rows, x[batch.node_ids])
                k += 1
            assert k == len(sb)
            st = mp.train.io_stats()
            info = mp.info
            assert info["readers"] == "direct"
            assert info["cache_policy"] == resolve_preset(preset).policy.name
            if isinstance(preset, Preset):
                assert "feature_cache_rows" not in info
                assert st["feature_misses"] == st["feature_lookups"]
            else:
                assert 0 < st["feature_misses"] < st["feature_lookups"]
            if isinstance(preset, BeladyCache):
                assert info["superbatch_size"] == 3
                assert st["feature_page_mates_read"] > 0
        finally:
            mp.close()


def test_unknown_preset_is_one_line(ds):
    from ooc.core.errors import OocError
    from ooc.executor.loader.presets import resolve_preset

    with pytest.raises(OocError, match=r"unknown preset 'fast' \(choose one of baseline, static, ooc"):
        resolve_preset("fast")


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_bad_belady_superbatch_size_is_one_line(bad):
    from ooc.caches.policies import BeladyCache
    from ooc.core.errors import OocError

    with pytest.raises(OocError, match=r"^BeladyCache: superbatch_size must be a positive "
                                       r"integer or None, got"):
        BeladyCache(superbatch_size=bad)
