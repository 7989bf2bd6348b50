"""tools/size_caches.py (ooc.executor.profiler): report fields, plot, bad input, --sizes."""
import json
import os
import subprocess
import sys

import pytest

from ooc.executor.profiler import load_sizes, predict_epoch
from ooc.storage.errors import OocError
from ooc.storage.ingest import generate_synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTS = ["--fanouts", "4,3", "--batch-size", "64", "--hidden", "8", "--device", "cpu"]


def _run(*cmd):
    p = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return generate_synthetic(tmp_path_factory.mktemp("p") / "d", nodes=4000, avg_degree=6,
                              feature_dim=32, train_fraction=0.3, progress=False)


@pytest.fixture(scope="module")
def profiled(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("r")
    rep, png = out / "sizes.json", out / "curve.png"
    rc, so, se = _run("tools/size_caches.py", "--data", str(data), "--memory-budget", "1GiB",
                      "--runtime-disk-budget", "2MiB", *OPTS, "--report", str(rep),
                      "--plot", str(png))
    assert rc == 0, so + se
    return json.loads(rep.read_text()), png, rep


def test_report_fields_and_plot(profiled):
    r, png, _ = profiled
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec, plan, m = r["recommendation"], r["memory_plan"], r["measured"]
    budget = r["budget_bytes"]
    # the caches fit the budget with the measured working memory and the reserve
    feat_total = rec["feature_cache_rows"] * (r["dataset"]["row_bytes"] + 8)
    assert plan["working"] + r["reserve_bytes"] + feat_total + rec["neighbor_cache_bytes"] <= budget
    assert rec["feature_cache_bytes"] == rec["feature_cache_rows"] * r["dataset"]["row_bytes"]
    assert plan["min_budget"] == plan["working"] + r["reserve_bytes"]
    # stage peaks measured, above the setup RSS
    for k in ("sample_stage", "main_loop"):
        assert m["peak_rss_bytes"][k] >= m["setup_rss_bytes"] > 0
    # superbatch: disk budget / (2 x bytes per batch), capped by the epoch
    bpb = plan["runtime_bytes_per_batch"]
    assert plan["superbatch_size_disk"] == int(2 * 2**20 // (2 * bpb))
    nb = -(-r["dataset"]["train_nodes"] // 64)
    assert 1 <= rec["superbatch_size"] <= min(plan["superbatch_size_disk"], nb)
    assert m["runtime_files"]["bytes_per_batch"] <= bpb  # the plan is an upper bound
    assert rec["expected_epoch_s"] > 0 and "gpu" in m
    assert any("neighbor cache = B - peak(sample stage) - R" in a for a in r["arithmetic"])
    # curves: 1%..100%, ratios in [0, 1], non-increasing, Belady the optimum
    mc = r["miss_curves"]
    n = len(mc["capacity_rows"])
    assert mc["capacity_fraction"][0] <= 0.011 and mc["capacity_fraction"][-1] == 1.0
    for key in ("belady", "belady_with_init", "static_degree", "lru"):
        v = mc[key]
        assert len(v) == n and all(0.0 <= x <= 1.0 for x in v)
        assert all(a >= b - 1e-12 for a, b in zip(v, v[1:])), key
    for b, s, lr, bi in zip(mc["belady"], mc["static_degree"], mc["lru"], mc["belady_with_init"]):
        assert b <= s + 1e-12 and b <= lr + 1e-12 and b <= bi
    assert mc["belady"][-1] == 0.0 and mc["static_degree"][-1] == 0.0
    i = mc["capacity_rows"].index(rec["feature_cache_rows"])
    assert rec["predicted_miss_ratio"] == mc["belady"][i]
    s = r["sizes"]
    assert (s["feature_cache_size"], s["neighbor_cache_size"], s["superbatch_size"]) == (
        rec["feature_cache_bytes"], rec["neighbor_cache_bytes"], rec["superbatch_size"])


def test_train_uses_sizes(profiled, data, tmp_path):
    r, _, rep = profiled
    out = tmp_path / "t.json"
    rc, so, se = _run("-m", "ooc.train", "--data", str(data), "--sizes", str(rep), "--epochs", "1",
                      "--no-eval", "--no-progress", "--report", str(out), *OPTS)
    assert rc == 0, so + se
    info = json.loads(out.read_text())["mode_info"]
    rec = r["recommendation"]
    assert info["feature_cache_rows"] == rec["feature_cache_rows"]
    assert info["superbatch_size"] == rec["superbatch_size"]
    assert info["neighbor_cache_bytes"] <= rec["neighbor_cache_bytes"]


def test_budget_too_small(data):
    rc, so, se = _run("tools/size_caches.py", "--data", str(data), "--memory-budget", "8MiB",
                      *OPTS)
    assert rc == 2
    assert "smallest budget that can work is" in se and se.strip().count("\n") == 0


def test_bad_inputs(data, tmp_path):
    rc, _, se = _run("tools/size_caches.py", "--data", str(tmp_path / "nope"),
                     "--memory-budget", "1GiB")
    assert rc == 2 and "nope" in se
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rc, _, se = _run("-m", "ooc.train", "--data", str(data), "--sizes", str(bad), "--epochs", "1")
    assert rc == 2 and "bad.json" in se and "not JSON" in se
    rc, _, se = _run("-m", "ooc.train", "--data", str(data), "--sizes", str(tmp_path / "no.json"))
    assert rc == 2 and "no.json" in se


def test_load_sizes_validates(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"sizes": {"version": 1, "feature_cache_size": -5,
                                       "neighbor_cache_size": 0}}))
    with pytest.raises(OocError, match="feature_cache_size"):
        load_sizes(p)
    p.write_text(json.dumps({"foo": 1}))
    with pytest.raises(OocError, match="not a sizes file"):
        load_sizes(p)
    p.write_text(json.dumps({"version": 1, "feature_cache_size": 10, "neighbor_cache_size": 0,
                             "superbatch_size": 3}))
    assert load_sizes(p)["superbatch_size"] == 3


def test_predict_epoch_arithmetic():
    pb = {"sample": (0.01, 0.01), "changesets": (0.02, 0.02), "load": (0.0, 0.0),
          "gather": (0.03, 0.03), "compute": (0.05, 0.1)}
    e = predict_epoch("ooc", 10, 4, pb, switch_s=0.5, cores=2)
    # startup 4 x 0.03; overlapped max(0.5, 0.3, 6 x 0.03, (10 x 0.13 + 6 x 0.03) / 2 = 0.74)
    assert e["superbatches"] == 3
    assert e["epoch_s"] == pytest.approx(0.12 + 0.74 + 1.5)
    e = predict_epoch("static", 10, None, pb, switch_s=0.0, cores=2)
    assert e["epoch_s"] == pytest.approx(max(0.5, 0.4, 10 * 0.14 / 2))
