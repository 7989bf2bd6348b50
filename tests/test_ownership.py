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
