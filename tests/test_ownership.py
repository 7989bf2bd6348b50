"""ooc deletes or replaces only what carries its marker: a stub meta.json does not make a
user's folder replaceable, and a user's folder named like a runtime folder survives the
sweep of stale runs."""
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, assert_one_line_error

from ooc.storage import csc_from_edges, write_dataset
from ooc.storage.ownership import MARKER, made_by_ooc


def _cli(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_stub_meta_json_does_not_make_a_folder_replaceable(tmp_path):
    user = tmp_path / "notes"
    user.mkdir()
    (user / "meta.json").write_text(json.dumps({"format": "ooc-dataset"}))
    (user / "thesis.tex").write_text("mine")
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n")
    r = _cli("ooc.prepare", "edgelist", str(edges), "--out", str(user), "--overwrite",
             "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, str(user), "was not made by ooc")
    assert (user / "thesis.tex").read_text() == "mine"
    # what ooc made carries the marker and is replaced
    out = tmp_path / "ds"
    assert _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out),
                "--no-progress").returncode == 0
    assert made_by_ooc(out, "output") and (out / MARKER).is_file()
    assert _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out), "--overwrite",
                "--no-progress").returncode == 0


def test_a_symlink_to_an_ooc_output_is_not_an_ooc_output(tmp_path):
    rng = np.random.default_rng(0)
    indptr, indices = csc_from_edges(rng.integers(0, 20, 60), rng.integers(0, 20, 60), 20)
    real = write_dataset(tmp_path / "real", indptr, indices,
                         rng.standard_normal((20, 2)).astype(np.float32))
    assert made_by_ooc(real, "output")
    (tmp_path / "link").symlink_to(real)
    assert not made_by_ooc(tmp_path / "link", "output")


def test_the_runtime_sweep_keeps_a_users_folder_of_that_name(tmp_path):
    rng = np.random.default_rng(0)
    n = 60
    indptr, indices = csc_from_edges(rng.integers(0, n, 300), rng.integers(0, n, 300), n)
    data = write_dataset(tmp_path / "d", indptr, indices,
                         rng.standard_normal((n, 4)).astype(np.float32),
                         labels=rng.integers(0, 2, n), train_idx=np.arange(30))
    rt = tmp_path / "rt"
    rt.mkdir()
    dead = _dead_pid()
    user = rt / f"run{dead}-results"
    user.mkdir()
    (user / "table.csv").write_text("1,2\n")
    stale = rt / f"run{dead}-abc"                      # what a killed training leaves
    stale.mkdir()
    (stale / MARKER).write_text(json.dumps({"kind": "runtime", "token": "t", "pid": dead}))
    r = _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3",
             "--runtime-dir", str(rt), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (user / "table.csv").read_text() == "1,2\n"
    assert not stale.exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inf")
    rng = np.random.default_rng(1)
    n = 60
    indptr, indices = csc_from_edges(rng.integers(0, n, 300), rng.integers(0, n, 300), n)
    data = write_dataset(tmp / "d", indptr, indices, rng.standard_normal((n, 4)).astype(np.float32),
                         labels=rng.integers(0, 2, n), train_idx=np.arange(30))
    r = _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3",
             "--checkpoint-dir", str(tmp / "ck"), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    return data, tmp / "ck"


def test_infer_overwrite_needs_more_than_a_stub_progress_json(trained, tmp_path):
    data, ck = trained
    user = tmp_path / "mine.zarr"
    user.mkdir()
    (user / "progress.json").write_text(json.dumps({"complete": True}))
    (user / "notes.txt").write_text("mine")
    r = _cli("ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out", str(user),
             "--overwrite", "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, str(user))
    assert (user / "notes.txt").read_text() == "mine"
    out = tmp_path / "e.zarr"
    for extra in ([], ["--overwrite"]):                  # ooc's own output is replaced
        r = _cli("ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out", str(out),
                 "--no-progress", *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        assert made_by_ooc(out, "output")


def test_infer_refuses_a_symlink_at_its_partial_path(trained, tmp_path):
    data, ck = trained
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    (tmp_path / ".e.zarr.partial").symlink_to(target)
    r = _cli("ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out",
             str(tmp_path / "e.zarr"), "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "symlink")
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def _user_files(folder):
    (folder / "notes.txt").write_text("mine")
    (folder / "plots").mkdir()
    (folder / "plots" / "a.csv").write_text("1\n")


def _kept(folder):
    return ((folder / "notes.txt").read_text() == "mine"
            and (folder / "plots" / "a.csv").read_text() == "1\n")


def test_overwriting_a_dataset_keeps_the_users_files_in_it(tmp_path):
    from ooc.storage import open_dataset
    from ooc.storage.ownership import user_entries

    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n")
    out = tmp_path / "ds"
    assert _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out),
                "--no-progress").returncode == 0
    _user_files(out)
    (out / "neighbor_cache" / "123").mkdir(parents=True)   # what training adds: ooc's
    (out / "neighbor_cache" / "123" / MARKER).write_text(json.dumps({"kind": "output",
                                                                      "token": "t"}))
    assert user_entries(out) == ["notes.txt", "plots"]
    edges.write_text("0 1\n1 2\n2 3\n")
    r = _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out), "--overwrite",
             "--no-progress")
    assert r.returncode == 0, r.stderr
    assert open_dataset(out).num_nodes == 4 and _kept(out)
    assert not (out / "neighbor_cache").exists()
    assert user_entries(out) == ["notes.txt", "plots"]
    # a name the new output also has is refused before anything moves
    from ooc.storage.ownership import marker, record_files  # noqa: F401

    (out / "features.bin").rename(out / "f.tmp")
    (out / "features.bin").write_text("a user file named like ooc's")
    doc = json.loads((out / MARKER).read_text())
    doc["files"].remove("features.bin")
    (out / MARKER).write_text(json.dumps(doc))
    r = _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out), "--overwrite",
             "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "holds features.bin, which ooc did not write")
    assert (out / "features.bin").read_text() == "a user file named like ooc's" and _kept(out)


def test_overwriting_partitions_and_inference_keeps_the_users_files(trained, tmp_path):
    data, ck = trained
    parts = tmp_path / "parts"
    args = ["ooc.partition", "--data", str(data), "--parts", "2", "--out", str(parts)]
    assert _cli(*args).returncode == 0
    _user_files(parts)
    r = _cli(*args, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert _kept(parts) and (parts / "partition.json").is_file()
    out = tmp_path / "e.zarr"
    args = ["ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out", str(out),
            "--no-progress"]
    assert _cli(*args).returncode == 0
    _user_files(out)
    r = _cli(*args, "--overwrite", "--chunk-rows", "16")   # another run: replaced
    assert r.returncode == 0, r.stderr
    assert _kept(out) and made_by_ooc(out, "output")


def test_a_killed_replacement_never_sweeps_the_users_files(tmp_path):
    """A temporary folder of a dead run that holds files of the user's (moved there
    while replacing an output) is not removed with the other stale temporaries."""
    from ooc.storage.atomic import remove_stale_temps
    from ooc.storage.ownership import mark, record_files

    final = tmp_path / "out"
    dead = _dead_pid()
    for tag, user in (("a", True), ("b", False)):
        t = tmp_path / f".out.tmp-{dead}-{tag}"
        t.mkdir()
        mark(t, "output")
        (t / "meta.json").write_text("{}")
        record_files(t)
        if user:
            _user_files(t)
    removed = remove_stale_temps(final)
    assert [p.name for p in removed] == [f".out.tmp-{dead}-b"]
    assert _kept(tmp_path / f".out.tmp-{dead}-a")


# -- one ownership rule for every path ooc writes (issue 57) ---------------------------------
TRAIN = ["--fanouts", "3", "--epochs", "1", "--hidden", "8", "--batch-size", "32",
         "--no-progress", "--no-eval"]


def _refused(main, argv, capsys, *needles) -> str:
    """Run a CLI's ``main`` in this process: exit 2 with one line holding ``needles``."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    assert e.value.code == 2
    return assert_one_line_error(capsys.readouterr().err, *needles)


@pytest.fixture(scope="module")
def two_graphs(tmp_path_factory):
    """Two datasets of the same shape (different graphs) and a checkpoint folder of a run
    on the first."""
    from conftest import community_graph

    from ooc import train as train_cli

    root = tmp_path_factory.mktemp("own")
    a = community_graph(root / "a", n=300, seed=0)
    b = community_graph(root / "b", n=300, seed=5)
    assert train_cli.main(["--data", str(a), "--checkpoint-dir", str(root / "ck"), *TRAIN,
                           "--epochs", "2"]) == 0
    return a, b, root / "ck"


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_train_report_refuses_a_file_of_the_dataset(two_graphs, tmp_path, capsys):
    from ooc import train as train_cli

    a, _, _ = two_graphs
    before = _snapshot(a)
    _refused(train_cli.main, ["--data", a, "--report", a / "meta.json", *TRAIN], capsys,
             f"{a}/meta.json: exists and is not a report ooc wrote")
    # a new file inside the dataset, or inside the run's checkpoint folder, is refused too
    _refused(train_cli.main, ["--data", a, "--report", a / "r.json", *TRAIN], capsys,
             "--report is or lies inside the dataset")
    _refused(train_cli.main, ["--data", a, "--report", tmp_path / "ck" / "epoch_0001.pt",
                              "--checkpoint-dir", tmp_path / "ck", *TRAIN], capsys,
             "lies inside --checkpoint-dir")
    assert _snapshot(a) == before and not (tmp_path / "ck").exists()


def test_infer_report_refuses_a_checkpoint(two_graphs, tmp_path, capsys):
    from ooc import infer as infer_cli

    a, _, ck = two_graphs
    before = _snapshot(ck)
    _refused(infer_cli.main, ["--data", a, "--checkpoint", ck / "epoch_0002.pt", "--out",
                              tmp_path / "e.zarr", "--report", ck / "epoch_0001.pt",
                              "--no-progress"], capsys,
             "epoch_0001.pt: exists and is not a report ooc wrote")
    assert _snapshot(ck) == before and not (tmp_path / "e.zarr").exists()


def test_prepare_and_partition_reports_refuse_their_inputs(two_graphs, tmp_path, capsys):
    from ooc import prepare as prepare_cli
    from ooc.partition.__main__ import main as partition_main

    a, _, _ = two_graphs
    edges = tmp_path / "x.npy"
    np.save(edges, np.array([[0, 1, 2], [1, 2, 0]]))
    kept = edges.read_bytes()
    _refused(prepare_cli.main, ["edgelist", edges, "--out", tmp_path / "ds", "--report", edges,
                                "--no-progress"], capsys, f"{edges}: exists and is not a report")
    _refused(prepare_cli.main, ["edgelist", edges, "--out", tmp_path / "ds", "--report",
                                tmp_path / "ds", "--no-progress"], capsys,
             "--report is or lies inside --out")
    assert edges.read_bytes() == kept and not (tmp_path / "ds").exists()
    table = tmp_path / "table.csv"
    table.write_text("mine\n")
    _refused(partition_main, ["--data", a, "--parts", "2", "--out", tmp_path / "p", "--report",
                              table, "--quiet"], capsys, f"{table}: exists and is not a report")
    assert table.read_text() == "mine\n" and not (tmp_path / "p").exists()


def test_a_report_ooc_wrote_is_marked_and_replaced(tmp_path, capsys):
    from ooc import prepare as prepare_cli
    from ooc.cli import REPORT_KEY, is_report

    edges = tmp_path / "x.npy"
    np.save(edges, np.array([[0, 1, 2], [1, 2, 0]]))
    rep = tmp_path / "r.json"
    assert prepare_cli.main(["edgelist", str(edges), "--out", str(tmp_path / "ds"), "--report",
                             str(rep), "--no-progress"]) == 0
    doc = json.loads(rep.read_text())
    assert doc[REPORT_KEY] == "ooc.prepare" and doc["num_nodes"] == 3 and is_report(rep)
    assert prepare_cli.main(["edgelist", str(edges), "--out", str(tmp_path / "ds2"),
                             "--report", str(rep), "--no-progress"]) == 0
    assert json.loads(rep.read_text())["out"] == str(tmp_path / "ds2")
    rep.write_text(json.dumps({"num_nodes": 3}))  # a JSON file without the mark is not one
    assert not is_report(rep)


def test_partition_overwrite_never_replaces_a_dataset_or_an_inference_output(two_graphs,
                                                                            tmp_path, capsys):
    from ooc import infer as infer_cli
    from ooc.partition.__main__ import main as partition_main

    a, b, ck = two_graphs
    import shutil

    victim = tmp_path / "b"
    shutil.copytree(b, victim)
    before = _snapshot(victim)
    _refused(partition_main, ["--data", a, "--parts", "2", "--out", victim, "--overwrite",
                              "--quiet"], capsys,
             "is a dataset (ooc.prepare), not a partition set (ooc.partition)")
    assert _snapshot(victim) == before
    emb = tmp_path / "e.zarr"
    assert infer_cli.main(["--data", str(a), "--checkpoint", str(ck), "--out", str(emb),
                           "--no-progress"]) == 0
    capsys.readouterr()
    zarr_before = _snapshot(emb)
    _refused(partition_main, ["--data", a, "--parts", "2", "--out", emb, "--overwrite",
                              "--quiet"], capsys, "is an inference output (ooc.infer)")
    assert _snapshot(emb) == zarr_before


def test_prepare_overwrite_refuses_one_partition_of_a_set(two_graphs, tmp_path, capsys):
    from ooc import prepare as prepare_cli
    from ooc.partition.__main__ import main as partition_main
    from ooc.storage import open_dataset

    a, _, _ = two_graphs
    parts = tmp_path / "p"
    assert partition_main(["--data", str(a), "--parts", "2", "--out", str(parts),
                           "--quiet"]) == 0
    capsys.readouterr()
    part = parts / "part_000"
    assert part.is_dir()
    before = _snapshot(part)
    edges = tmp_path / "x.npy"
    np.save(edges, np.array([[0, 1, 2], [1, 2, 0]]))
    _refused(prepare_cli.main, ["edgelist", edges, "--out", part, "--overwrite",
                                "--no-progress"], capsys, f"lies inside {parts}",
             "partition set")
    assert _snapshot(part) == before and open_dataset(part).num_nodes > 3


def test_train_refuses_another_datasets_partitions_without_overwrite(two_graphs, tmp_path,
                                                                    capsys):
    from ooc import train as train_cli
    from ooc.storage import open_dataset

    a, b, _ = two_graphs
    parts = tmp_path / "p"
    run = ["--workers", "1", "--partitions", "2", "--partition-dir", parts, "--mode",
           "baseline", *TRAIN]
    assert train_cli.main([str(v) for v in ["--data", a, *run]]) == 0
    capsys.readouterr()
    rec = (parts / "partition.json").read_bytes()
    _refused(train_cli.main, ["--data", b, *run], capsys, f"{parts}: holds the partitions of "
             f"another dataset ({a})", "pass --overwrite", "another --partition-dir")
    assert (parts / "partition.json").read_bytes() == rec
    # other settings of this dataset's partitions: refused too
    _refused(train_cli.main, ["--data", a, *run, "--halo-hops", "2"], capsys,
             "1-hop halo, not --halo-hops 2")
    # --overwrite partitions the given dataset there
    assert train_cli.main([str(v) for v in ["--data", b, *run, "--overwrite"]]) == 0
    fp = json.loads((parts / "partition.json").read_text())["source_fingerprint"]
    assert fp == open_dataset(b).fingerprint()


def test_train_refuses_a_checkpoint_folder_of_another_run(two_graphs, tmp_path, capsys):
    import shutil

    from ooc import train as train_cli
    from ooc.executor.training.checkpoint import dataset_fingerprint, load_checkpoint
    from ooc.storage import open_dataset

    a, b, ck0 = two_graphs
    ck = tmp_path / "ck"
    shutil.copytree(ck0, ck)
    before = _snapshot(ck)
    _refused(train_cli.main, ["--data", b, "--checkpoint-dir", ck, *TRAIN], capsys,
             f"{ck}: holds the checkpoints of another run (epoch_0001.pt .. epoch_0002.pt, "
             f"sage on {a})",
             "--resume", "--overwrite")
    assert _snapshot(ck) == before
    # --resume on another dataset, or with another model, names what differs
    _refused(train_cli.main, ["--data", b, "--checkpoint-dir", ck, "--resume", "--epochs", "3",
                              "--no-progress"], capsys, f"trained on {a}", f"not on {b}")
    _refused(train_cli.main, ["--checkpoint-dir", ck, "--resume", "--hidden", "16"], capsys,
             "--hidden 16 differs from the checkpoint's 8")
    _refused(train_cli.main, ["--checkpoint-dir", ck, "--resume", "--overwrite"], capsys,
             "give one of them")
    assert _snapshot(ck) == before
    # --overwrite: the new run's checkpoints only, none of the old run's left to resume
    assert train_cli.main([str(v) for v in ["--data", b, "--checkpoint-dir", ck, *TRAIN,
                                            "--overwrite"]]) == 0
    assert sorted(p.name for p in ck.iterdir()) == ["epoch_0001.pt"]
    state = load_checkpoint(ck / "epoch_0001.pt")
    assert state["dataset_fingerprint"] == dataset_fingerprint(open_dataset(b))


def test_train_overwrite_replaces_only_ooc_checkpoints(two_graphs, tmp_path, capsys):
    from ooc import train as train_cli

    a, _, _ = two_graphs
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "epoch_0001.pt").write_text("my notes, named like a checkpoint")
    _refused(train_cli.main, ["--data", a, "--checkpoint-dir", ck, *TRAIN, "--overwrite"],
             capsys, "epoch_0001.pt: not an ooc checkpoint",
             "--overwrite replaces only ooc's checkpoints")
    assert (ck / "epoch_0001.pt").read_text() == "my notes, named like a checkpoint"


def test_saving_never_replaces_a_checkpoint_of_another_run(tmp_path):
    """From Python too (``Trainer.fit``, ``save_checkpoint``): an epoch file of another model
    or dataset, or a file that is no checkpoint, is not replaced; the same run's is."""
    import torch

    from ooc.executor.training.checkpoint import load_checkpoint, save_checkpoint
    from ooc.executor.training.models import build_model

    torch.manual_seed(0)
    small, wide = build_model("sage", 8, 16, 3, 2), build_model("sage", 8, 32, 3, 2)
    path = save_checkpoint(tmp_path, 1, small)
    kept = path.read_bytes()
    with pytest.raises(FileExistsError, match="is a checkpoint of another run \\(another model\\)"):
        save_checkpoint(tmp_path, 1, wide)
    assert path.read_bytes() == kept
    save_checkpoint(tmp_path, 1, small, history=[{"epoch": 1}])  # the same run: replaced
    assert load_checkpoint(path)["history"] == [{"epoch": 1}]
    (tmp_path / "epoch_0002.pt").write_text("mine")
    with pytest.raises(FileExistsError, match="ooc replaces only its own checkpoints"):
        save_checkpoint(tmp_path, 2, small)
    assert (tmp_path / "epoch_0002.pt").read_text() == "mine"
