"""Read-only places: an output, a checkpoint folder, a report or the default dataset's
cache on a file system ooc cannot write is one line (exit 2) before any work is lost, and
``--out .`` never replaces the working folder."""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, assert_one_line_error, community_graph


@contextlib.contextmanager
def _read_only_folder(path: Path):
    """``path`` made read-only for this process, even as root: a read-only tmpfs mount,
    else the immutable attribute, else (not root) mode 0555."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                      capture_output=True).returncode == 0:
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=True)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        try:
            yield path
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        return
    pytest.skip("running as root without mount or chattr: no way to make a folder read-only")


def _cli(*args, cwd=REPO, env=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    root = tmp_path_factory.mktemp("ro")
    data = community_graph(root / "g", n=300)
    assert _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3,3",
                "--checkpoint-dir", str(root / "ck"), "--no-progress").returncode == 0
    return data, root / "ck"


def test_read_only_outputs_are_one_line(graph, tmp_path):
    data, ck = graph
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n")
    with _read_only_folder(tmp_path / "ro") as ro:
        cases = [
            (["ooc.prepare", "edgelist", str(edges), "--out", str(ro / "d"), "--no-progress"],
             f"{ro}/.d.ooc-lock"),
            (["ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3,3",
              "--checkpoint-dir", str(ro / "ck"), "--no-progress"], f"{ro}/.ck.ooc-lock"),
            (["ooc.train", "--data", str(data), "--epochs", "1", "--report", str(ro / "r.json")],
             f"{ro}: --report's folder is not writable"),
            (["ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out",
              str(ro / "e.zarr"), "--no-progress"], f"{ro}/.e.zarr.ooc-lock"),
            (["ooc.partition", "--data", str(data), "--parts", "2", "--out", str(ro / "p")],
             f"{ro}/.p.ooc-lock"),
        ]
        for args, needle in cases:
            p = _cli(*args)
            assert p.returncode == 2, (args, p.stdout, p.stderr)
            assert_one_line_error(p.stderr, needle)
            assert "done in" not in p.stdout  # the report is refused before training


def test_default_dataset_under_a_read_only_home(tmp_path):
    with _read_only_folder(tmp_path / "home") as home:
        env = {k: v for k, v in os.environ.items()
               if k not in ("OOC_CACHE", "XDG_CACHE_HOME", "NUMBA_CACHE_DIR")}
        env["HOME"] = str(home)
        p = _cli("ooc.train", "--epochs", "1", "--no-progress", env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert_one_line_error(p.stderr, f"{home}/.cache/ooc: cannot create the default dataset's "
                                    f"folder", "set OOC_CACHE")


def test_out_dot_never_replaces_the_working_folder(graph, tmp_path):
    data, ck = graph
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("x")
    (work / "e.txt").write_text("0 1\n")
    for args in (["ooc.prepare", "edgelist", "e.txt", "--out", ".", "--overwrite", "--no-progress"],
                 ["ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out", ".",
                  "--overwrite", "--no-progress"],
                 ["ooc.partition", "--data", str(data), "--parts", "2", "--out", ".",
                  "--overwrite"]):
        p = _cli(*args, cwd=work)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert_one_line_error(p.stderr, ".")
    assert sorted(q.name for q in work.iterdir()) == ["e.txt", "mine.txt"]
