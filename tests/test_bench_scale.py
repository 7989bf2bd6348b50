"""bench/scale_graph.py writes OGB's binary raw layout that numpy reads back as written;
python -m bench scale refuses, before writing anything, a disk too small for the run."""
import gzip
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import scale as bench_scale
from bench import scale_graph as sg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    shape = sg.Shape.of(0.0001)           # 11,106 nodes, 161,569 edges
    folder = tmp_path_factory.mktemp("ogb")
    facts = sg.write_ogb_binary(folder, shape, chunk_edges=50_000, chunk_rows=3000,
                                log=lambda m: None)
    return folder, shape, facts


def _ids(path: Path) -> np.ndarray:
    with gzip.open(path, "rt") as f:
        return np.array([int(line) for line in f if line.strip()], dtype=np.int64)


def test_layout_and_content(tiny):
    folder, shape, facts = tiny
    z = np.load(folder / "raw" / "data.npz")
    ei, x = z["edge_index"], z["node_feat"]
    assert ei.shape == (2, shape.edges) and ei.dtype == np.int64
    assert x.shape == (shape.nodes, 128) and x.dtype == np.float32
    assert 0 <= ei.min() and ei.max() < shape.nodes and not (ei[0] == ei[1]).any()
    assert int(z["num_nodes_list"][0]) == shape.nodes and int(z["num_edges_list"][0]) == shape.edges
    # chunked writing equals one pass of the generator (rows regenerated for the targets)
    src = sg.SyntheticEdges(shape.nodes, shape.edges, shape.classes, shape.p_in, shape.seed,
                            communities=facts["communities"])
    s, d, _, _ = next(src.chunks(shape.edges, shape.nodes))
    np.testing.assert_array_equal(ei[0], s)
    np.testing.assert_array_equal(ei[1], d)
    y = np.load(folder / "raw" / "node-label.npz")["node_label"]
    assert y.shape == (shape.nodes, 1)
    splits = [_ids(folder / "split" / "time" / f"{n}.csv.gz") for n in ("train", "valid", "test")]
    labelled = np.flatnonzero(~np.isnan(y[:, 0]))
    np.testing.assert_array_equal(np.sort(np.concatenate(splits)), labelled)   # disjoint, all labelled
    for ids, frac in zip(splits, shape.fractions, strict=True):
        assert abs(len(ids) / shape.nodes - frac) < 0.004
    assert set(np.unique(y[labelled, 0])) <= set(range(shape.classes))
    deg = np.bincount(ei.ravel(), minlength=shape.nodes)
    assert deg.min() >= 1 and deg.max() > 20 * deg.mean()          # no isolated node; skewed
    assert 0.05 < facts["features_only_acc"] < 0.5                  # the features alone are weak


def test_rewrite_is_skipped_only_for_the_same_parameters(tiny):
    folder, shape, _ = tiny
    assert sg.written(folder, shape, compress=False) is not None
    assert sg.written(folder, shape, compress=True) is None
    assert sg.written(folder, sg.Shape.of(0.0001, seed=1), compress=False) is None


def test_refuses_a_disk_too_small(tmp_path, monkeypatch, capsys):
    class Usage:
        free = 10 << 20
    monkeypatch.setattr(bench_scale.shutil, "disk_usage", lambda p: Usage)
    with pytest.raises(SystemExit) as e:
        bench_scale.main(["--scale", "0.001", "--memory-budget", "1GiB", "--workdir",
                          str(tmp_path / "w")])
    assert e.value.code == 2
    err = capsys.readouterr().out.strip().splitlines()[-1]
    assert "free" in err and "writes about" in err
    assert not (tmp_path / "w").exists()


def test_later_stages_need_room_for_their_outputs_only(tmp_path, monkeypatch):
    """A run of the stages after ingest, over a dataset already written, does not count
    the dataset or ingest's files again; one that ingests again gets back what it removes."""
    shape = sg.Shape.of(0.01)
    free = [0]

    class Usage:
        @property
        def free(self):
            return free[0]
    monkeypatch.setattr(bench_scale.shutil, "disk_usage", lambda p: Usage())
    data = bench_scale.dataset_bytes(shape)
    free[0] = (64 << 20) + 1
    assert bench_scale.check_disk(tmp_path, shape, ["train"], True)["need_bytes"] == 64 << 20
    with pytest.raises(SystemExit):
        bench_scale.check_disk(tmp_path, shape, ["ingest"], True)
    need = bench_scale.check_disk(tmp_path, shape, ["ingest"], True,
                                  reclaimed=2 * data)["need_bytes"]
    assert data < need < 2 * data
    with pytest.raises(SystemExit):  # the raw graph too, when it is not written yet
        bench_scale.check_disk(tmp_path, shape, ["ingest"], False, reclaimed=need)


def test_a_stage_over_its_time_limit_is_stopped_and_says_so():
    from ooc.executor.sizing import memcg

    r = memcg.run("sleeper", ["-c", "import time; time.sleep(60)"], None, seconds=0.5)
    assert r["stopped"] and r["rc"] == -9
    r = memcg.run("quick", ["-c", "print('done')"], None, seconds=60)
    assert not r["stopped"] and r["rc"] == 0 and r["lines"] == ["done"]


def test_plan_only_samples_the_graph_ingest_stores_and_writes_nothing(tiny, tmp_path):
    """``--plan-only`` builds the generator's graph in memory exactly as ingest stores it,
    so its batches are the training planner's own; and it writes nothing but its report."""
    import json
    import subprocess

    from bench import scale_plan
    from ooc.executor.sizing.budget import plan_memory
    from ooc.executor.training.config import TrainConfig
    from ooc.storage import open_dataset

    folder, shape, _ = tiny
    data = tmp_path / "data"
    rep = tmp_path / "ingest.json"
    subprocess.run([sys.executable, "-m", "ooc.prepare", "ogb", "--root", str(folder), "--out",
                    str(data), "--undirected", "--buffer", "64MiB", "--no-progress", "--report",
                    str(rep)],
                   check=True, capture_output=True)
    ingest = json.loads(rep.read_text())  # the plan's base has numba's runtime in it
    assert ingest["peak_rss_bytes"] <= ingest["planned_peak_bytes"]
    ds = open_dataset(data)
    indptr, indices = scale_plan.in_memory_graph(shape)
    np.testing.assert_array_equal(indptr, np.asarray(ds.indptr))
    np.testing.assert_array_equal(indices, np.asarray(ds.indices))
    np.testing.assert_array_equal(sg.split_ids(shape)[0], np.asarray(ds.train_idx))

    fanouts = [15, 10, 5]
    batches = scale_plan.sample_batches(shape, fanouts, 64, scale_plan.train_in_flight())
    # measured in this process, whose RSS holds what earlier tests loaded: a budget that
    # is not the point here
    probe = plan_memory(ds, TrainConfig(fanouts=fanouts, batch_size=64), 4 << 30)
    assert np.mean(batches["nodes"]) == probe.ids_per_batch
    assert batches["runtime_bytes_per_batch"] == probe.runtime_bytes_per_batch

    work, report = tmp_path / "w", tmp_path / "plan.json"
    assert bench_scale.main(["--scale", "0.0001", "--memory-budget", "1GiB", "--plan-only",
                             "--workdir", str(work), "--report", str(report)]) == 0
    assert not work.exists()
    rep = json.loads(report.read_text())
    assert rep["fits"] == {s: True for s in bench_scale.STAGES}
    train = rep["stages"]["train"]
    assert train["stages"]["row_map"] == 4 * shape.nodes
    assert train["min_budget"] <= train["planned_peak_bytes"] + train["reserve"] <= 1 << 30
    infer = rep["stages"]["infer"]
    assert infer["start_rss_bytes"] == infer["base_bytes"] + 4 * shape.nodes
    assert len(infer["layers"]) == len(fanouts)


def test_plan_only_a_failed_baseline_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from bench import scale_plan

    def fail(*a, **k):
        raise RuntimeError("measuring the ingest baseline failed: boom")

    monkeypatch.setattr(scale_plan, "base_rss", fail)
    report = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as e:
        bench_scale.main(["--scale", "0.0001", "--memory-budget", "1GiB", "--plan-only",
                          "--stages", "ingest", "--report", str(report)])
    assert e.value.code == 2 and not report.exists()
    err = capsys.readouterr().out.strip().splitlines()[-1]
    assert err.startswith("bench_scale: error: --plan-only:") and "boom" in err


def test_link_task_holds_out_edges_and_reports_the_link_metrics(tmp_path):
    import json

    rep_path = tmp_path / "r.json"
    rc = bench_scale.main(["--scale", "0.0001", "--task", "link", "--memory-budget", "2GiB",
                           "--stages", "ingest,train", "--epochs", "1", "--link-edges", "2000",
                           "--workdir", str(tmp_path / "w"), "--report", str(rep_path)])
    assert rc == 0
    rep = json.loads(rep_path.read_text())
    meta = json.loads((tmp_path / "w" / "data" / "meta.json").read_text())
    shape = sg.Shape.of(0.0001)
    split = meta["link_split"]
    held = [split["num_val"], split["num_test"]]    # 1% of the distinct pairs each
    assert split["val_fraction"] == split["test_fraction"] == 0.01
    assert all(0.005 * shape.edges < h <= 0.01 * shape.edges for h in held), held
    assert set(rep["train"]) == {*bench_scale.LINK_METRICS, "last_epoch_s"}
    assert rep["train"]["last_epoch_s"] > 0
    assert all(0.0 <= rep["train"][k] <= 1.0 for k in bench_scale.LINK_METRICS)
    assert rep["stages"]["train"]["rc"] == 0


def test_presets_run_the_train_stage_once_each(tmp_path, capsys):
    w = {k: tmp_path / k for k in ("raw", "data", "ckpt", "runtime", "emb", "parts", "reports")}
    argv = bench_scale.stage_argv("train", w, 1 << 30, 1, way="packed")
    assert argv[argv.index("--mode") + 1] == "packed"
    infer = bench_scale.stage_argv("infer", w, 1 << 30, 1)
    assert infer[infer.index("--aggregate") + 1] == "auto"
    infer = bench_scale.stage_argv("infer", w, 1 << 30, 1, layer_dtype="float16")
    assert infer[infer.index("--layer-dtype") + 1] == "float16"
    with pytest.raises(SystemExit) as e:
        bench_scale.main(["--scale", "0.0001", "--memory-budget", "1GiB", "--presets", "ooc,x"])
    assert e.value.code == 2 and "--presets" in capsys.readouterr().err


def test_float16_layers_are_planned_with_float16_slices():
    """``--layer-dtype float16`` plans the layers before the last as float16: a later
    layer's slices hold twice the columns, so fewer slices and fewer bytes read."""
    from bench import scale_plan

    shape = sg.Shape.of(0.02)
    p32, p16 = (scale_plan.infer_plan(shape, 700 << 20, 300 << 20, 256, 3, dt)
                for dt in ("float32", "float16"))
    for l, (a, b) in enumerate(zip(p32["layers"], p16["layers"], strict=True)):
        assert a["mode"] == b["mode"] == "sliced"
        assert b["col_dtype"] == ("float32" if l == 0 else "float16")
        if l > 0:
            assert b["input_bytes"] * 2 == a["input_bytes"]
            assert b["slices"] < a["slices"] and b["planned_bytes"] < a["planned_bytes"]
    assert p16["bytes_read"] < p32["bytes_read"]
