"""python -m ooc.prepare: help, report, exit code 2 with one line on bad input."""
import errno
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ooc.prepare import main
from ooc.storage import open_dataset
from ooc.storage import reserve as reserve_mod

REPO = Path(__file__).resolve().parents[1]
CORA = REPO.parent / "shared" / "data" / "planetoid"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "ooc.prepare", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_help(capsys):
    r = _run("--help")
    assert r.returncode == 0 and "edgelist" in r.stdout and "synthetic" in r.stdout
    for sub in ("edgelist", "ogb", "planetoid", "synthetic"):
        with pytest.raises(SystemExit) as ei:
            main([sub, "--help"])
        out = capsys.readouterr().out
        assert ei.value.code == 0 and "--out" in out and "--report" in out


def test_synthetic_report_subprocess(tmp_path):
    r = _run("synthetic", "--nodes", 2000, "--avg-degree", 6, "--feature-dim", 8, "--classes", 4,
             "--out", tmp_path / "g", "--report", tmp_path / "r.json", "--buffer", "64MiB")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert set(rep) >= {"num_nodes", "num_edges", "time_s", "peak_rss_bytes", "out"}
    ds = open_dataset(rep["out"])
    assert rep["num_nodes"] == ds.num_nodes == 2000 and rep["num_edges"] == ds.num_edges
    assert rep["peak_rss_bytes"] > 0
    # existing output: refused with exit 2 and one line
    r = _run("synthetic", "--nodes", 2000, "--out", tmp_path / "g")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("ooc: ") and "already exists" in r.stderr


def _main_fails(capsys, argv):
    with pytest.raises(SystemExit) as ei:
        main([str(a) for a in argv])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ooc: ")
    return err[-1]


def test_edgelist_cli(tmp_path, capsys):
    p = tmp_path / "e.txt"
    p.write_text("0 1\n1 2\n2 0\n2 0\n")
    assert main(["edgelist", str(p), "--out", str(tmp_path / "d"), "--undirected", "--dedup",
                 "--no-progress", "--report", str(tmp_path / "r.json")]) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["num_nodes"] == 3 and rep["num_edges"] == 6
    p.write_text("0 1\n1 two\n")
    assert "e.txt: line 2: malformed" in _main_fails(capsys, ["edgelist", p, "--out", tmp_path / "x",
                                                               "--no-progress"])
    assert "missing.txt: not found" in _main_fails(capsys, ["edgelist", tmp_path / "missing.txt",
                                                             "--out", tmp_path / "x"])
    assert not (tmp_path / "x").exists()


def test_full_disk_cli(tmp_path, capsys, monkeypatch):
    p = tmp_path / "e.npy"
    np.save(p, np.array([[0, 1, 2], [1, 2, 0]]))

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reserve_mod.os, "posix_fallocate", enospc)
    msg = _main_fails(capsys, ["edgelist", p, "--out", tmp_path / "d", "--no-progress"])
    assert "disk full" in msg
    assert not (tmp_path / "d").exists()
    assert list(tmp_path.iterdir()) == [p]


def test_a_disk_that_fills_while_rows_are_placed_is_one_line(tmp_path):
    """A small tmpfs that holds the adjacency but not the feature rows' buckets (rows placed
    in the locality order as they stream in): one line saying the disk is full, exit 2,
    and nothing left on that disk."""
    from conftest import mount_small_tmpfs

    mnt = tmp_path / "small"
    # above the up-front lower bound (nodes' files and features, ~4.5 MiB), below what the
    # edges and the rows' buckets take as they stream in
    why = mount_small_tmpfs(mnt, "5m")
    if why:
        pytest.skip(why)
    try:
        p = subprocess.run([sys.executable, "-m", "ooc.prepare", "synthetic", "--nodes", "30000",
                            "--avg-degree", "8", "--feature-dim", "32", "--community-size", "50",
                            "--buffer", "1MiB", "--no-progress", "--out", str(mnt / "d")],
                           capture_output=True, text=True, timeout=300)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1, p.stderr
        assert "disk full while writing dataset" in err[0], err[0]
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_bad_size_and_planetoid_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["synthetic", "--out", str(tmp_path / "d"), "--buffer", "lots"])
    assert ei.value.code == 2  # argparse's own exit code for bad arguments
    msg = _main_fails(capsys, ["planetoid", "--root", tmp_path, "--name", "Cora", "--out", tmp_path / "d"])
    assert "ind.cora.x: not found" in msg


@pytest.mark.usefixtures("cora_raw")
def test_planetoid_cli(tmp_path):
    assert main(["planetoid", "--root", str(CORA), "--name", "Cora", "--out", str(tmp_path / "cora"),
                 "--report", str(tmp_path / "r.json")]) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["num_nodes"] == 2708 and rep["num_edges"] == 10556


def test_reorder_flag(tmp_path):
    """--reorder auto stores 128-byte rows in a locality order (node ids unchanged), none
    keeps node order; both give the same rows by node id."""
    args = ["synthetic", "--nodes", 3000, "--avg-degree", 8, "--feature-dim", 32,
            "--community-size", 50, "--no-progress", "--buffer", "4MiB"]
    assert main([*map(str, args), "--out", str(tmp_path / "a")]) == 0
    assert main([*map(str, args), "--out", str(tmp_path / "b"), "--reorder", "none"]) == 0
    a, b = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "b")
    assert a.meta["feature_order"]["kind"] == "locality" and a.row_of is not None
    assert b.row_of is None and "feature_order" not in b.meta
    ids = np.arange(3000)
    np.testing.assert_array_equal(a.features.read(ids), b.features.read(ids))
    r = _run("synthetic", "--nodes", 100, "--out", tmp_path / "c", "--reorder", "rabbit")
    assert r.returncode == 2 and "invalid choice: 'rabbit'" in r.stderr
