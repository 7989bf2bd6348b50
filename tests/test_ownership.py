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
