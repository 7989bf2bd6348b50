"""A binding that dies of a signal can never take the process down.

Each case runs ``python -m ooc.train`` in a subprocess whose auto order starts
with a stand-in native binding that kills its process with SIGILL, as a wheel
built for another CPU does: training must still run, with one note naming the
crash and the backend that reads instead, and an error after a note must stay
the last line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, community_graph, write_stand_in_binding

# ooc.train's main with the stand-in binding registered first in the auto order
RUNNER = """
import sys
from ooc.storage import io_backends as B
B.REGISTRY["crashy"] = "crashy_binding:Crash"
B.AUTO_ORDER = ("crashy",) + tuple(b for b in B.AUTO_ORDER if b != "crashy")
from ooc.train import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh")
    write_stand_in_binding(root, "crashy_binding")
    (root / "runner.py").write_text(RUNNER)
    data = community_graph(root / "graph", n=300)
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        OOC_CACHE=str(root / "cache"))
    return root, data, e


def _train(env, *args, timeout=300):
    root, data, e = env
    return subprocess.run([sys.executable, str(root / "runner.py"), "--data", str(data),
                           "--epochs", "1", "--batch-size", "64", "--fanouts", "5,5",
                           "--no-progress", *args], capture_output=True, text=True, env=e,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("mode", ["ooc", "static"])
def test_crashing_binding_still_trains(env, mode, tmp_path):
    rep = tmp_path / "r.json"
    r = _train(env, "--mode", mode, "--report", str(rep))
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [line for line in r.stderr.splitlines() if line.startswith("ooc: note:")]
    crash = [n for n in notes if "crashy 9.9 crashed in a probe (SIGILL)" in n]
    assert len(crash) == 1, r.stderr[-3000:]
    backend = json.loads(rep.read_text())["mode_info"]["reader_backend"]
    assert backend not in ("crashy", None)
    assert "Traceback" not in r.stderr
    # the verdict is cached where the next process finds it
    assert list((Path(env[2]["OOC_CACHE"]) / "probe").glob("crashy-*.json"))


def test_error_after_a_note_is_the_last_line(env):
    """A budget too small is refused after the readers opened (and noted the fallback)."""
    r = _train(env, "--mode", "ooc", "--memory-budget", "1MiB")
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_line_error(r.stderr, "budget")


def test_explicit_backend_that_crashed_is_one_line(env):
    r = _train(env, "--io-backend", "crashy")
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_line_error(r.stderr, "crashy unavailable", "crashed in a probe (SIGILL)")


def test_infer_reads_with_the_backend_asked_for(env, tmp_path):
    """ooc.infer takes --io-backend; its report names the reader; a conflict is one line."""
    root, data, e = env
    ck = tmp_path / "ck"
    r = _train(env, "--checkpoint-dir", str(ck), "--io-backend", "preadv")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = tmp_path / "infer.json"
    base = [sys.executable, "-m", "ooc.infer", "--data", str(data), "--checkpoint", str(ck),
            "--no-progress", "--memory-budget", "1GiB"]
    r = subprocess.run(base + ["--out", str(tmp_path / "emb.zarr"), "--io-backend", "preadv",
                               "--report", str(rep)], capture_output=True, text=True, env=e,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(rep.read_text())["feature_reader"] == "direct (preadv)"
    r = subprocess.run(base + ["--out", str(tmp_path / "emb2.zarr"), "--io-backend", "preadv",
                               "--features", "mmap"], capture_output=True, text=True, env=e,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "--io-backend preadv", "--features mmap")
    assert not (tmp_path / "emb2.zarr").exists()
