"""kill -9 at any point of ``prepare``, ``train``, ``partition`` and ``infer`` replacing an
earlier output leaves the old output or the new one at its path, complete and valid, never
a mix and never neither; and the next run is not blocked by what the killed one left.

Each command is first run to completion (its wall time ``T``, kernels compiled), then
killed at fractions of ``T`` from its start; every outcome is checked, whichever it is."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

from ooc.partition.split import part_name
from ooc.storage import open_dataset

pytestmark = pytest.mark.slow  # every test here runs several processes

FRACTIONS = (0.2, 0.5, 0.8, 0.95)


def _run(args, timeout=600) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return time.perf_counter() - t0


def _killed_at(args, seconds: float) -> int:
    p = subprocess.Popen([sys.executable, "-m", *map(str, args)], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
    return p.wait()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("k9")
    data = root / "syn"
    _run(["ooc.prepare", "synthetic", "--nodes", 150_000, "--avg-degree", 10, "--feature-dim",
          32, "--out", data, "--no-progress"])
    _run(["ooc.train", "--data", data, "--epochs", 1, "--fanouts", "3,3", "--hidden", 16,
          "--checkpoint-dir", root / "ck", "--no-progress", "--no-eval"])
    return root, data, root / "ck"


def _exercise(make_old, out, new_args, which) -> set:
    """Put the old output at ``out`` (made once by ``make_old()``, then put back as a copy),
    kill ``new_args`` at each fraction of its wall time, and classify what is at the output
    after each kill with ``which()`` ("old" or "new"; it asserts the output is complete and
    valid). What a killed run left beside ``out`` stays for the next. Returns the outcomes
    seen."""
    make_old()
    saved = out.parent / f"saved-{out.name}"
    shutil.copytree(out, saved, symlinks=True)

    def put_old():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(saved, out, symlinks=True)

    t = _run(new_args)
    assert which() == "new"
    seen = set()
    for f in FRACTIONS:
        put_old()
        assert which() == "old"
        _killed_at(new_args, f * t)
        seen.add(which())
    _run(new_args)  # nothing the killed runs left blocks the next one
    assert which() == "new"
    return seen


def test_prepare(synthetic, tmp_path):
    out = tmp_path / "d"
    old = ["ooc.prepare", "synthetic", "--nodes", 1000, "--out", out, "--no-progress"]
    new = ["ooc.prepare", "synthetic", "--nodes", 300_000, "--avg-degree", 10, "--feature-dim",
           32, "--out", out, "--overwrite", "--no-progress"]

    def make_old():
        _run(old)

    def which():
        return {1000: "old", 300_000: "new"}[open_dataset(out).num_nodes]

    assert _exercise(make_old, out, new, which) <= {"old", "new"}


def test_partition(synthetic, tmp_path):
    _, data, _ = synthetic
    out = tmp_path / "p"
    base = ["ooc.partition", "--data", data, "--out", out, "--quiet", "--overwrite"]

    def make_old():
        _run(base + ["--parts", 2])

    def which():
        rec = json.loads((out / "partition.json").read_text())
        for q in range(rec["p"]):
            open_dataset(out / part_name(q))
        assert not (out / part_name(rec["p"])).exists()
        return {2: "old", 5: "new"}[rec["p"]]

    assert _exercise(make_old, out, base + ["--parts", 5], which) <= {"old", "new"}


def test_infer(synthetic, tmp_path):
    import zarr

    _, data, ck = synthetic
    out = tmp_path / "e.zarr"
    base = ["ooc.infer", "--data", data, "--checkpoint", ck, "--out", out, "--no-progress",
            "--overwrite"]

    def make_old():
        _run(base + ["--chunk-rows", 65536])

    def which():
        g = zarr.open_group(str(out), mode="r")
        assert g.attrs["complete"] is True
        assert g["pred"].shape == (150_000,)
        return {65536: "old", 8192: "new"}[g["h2"].chunks[0]]

    assert _exercise(make_old, out, base + ["--chunk-rows", 8192], which) <= {"old", "new"}


def test_train(synthetic, tmp_path):
    """Checkpoints: each saved epoch is complete or absent; the run resumes after a kill."""
    from ooc.executor.training.checkpoint import list_checkpoints, load_checkpoint

    _, data, _ = synthetic
    ck = tmp_path / "ck"
    args = ["ooc.train", "--data", data, "--epochs", 3, "--fanouts", "3,3", "--hidden", 16,
            "--checkpoint-dir", ck, "--no-progress", "--no-eval"]
    t = _run(args)
    for f in FRACTIONS:
        for p in ck.iterdir():
            p.unlink()
        _killed_at(args, f * t)
        if ck.exists():
            found = list_checkpoints(ck)
            assert [e for e, _ in found] == list(range(1, len(found) + 1))
            for _, p in found:
                load_checkpoint(p)
            if found and found[-1][0] < 3:
                _run(args[:-2] + ["--resume", "--no-progress"])
                assert list_checkpoints(ck)[-1][0] == 3
