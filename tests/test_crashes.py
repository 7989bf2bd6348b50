"""Inputs that used to end in a traceback or a signal: each now works (a graph without edges
trains as an MLP would) or is one line, exit 2 from the CLIs."""
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import REPO, assert_one_line_error

import ooc
from ooc.storage import OocError, write_dataset


def _cli(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def no_edges(tmp_path_factory):
    """600 nodes, no edge; features that give the label away (an MLP learns it)."""
    n, c = 600, 3
    rng = np.random.default_rng(0)
    y = rng.integers(0, c, n)
    x = (np.eye(c)[y] * 2 + 0.3 * rng.standard_normal((n, c))).astype(np.float32)
    return write_dataset(tmp_path_factory.mktemp("z") / "ds", np.zeros(n + 1, np.int64),
                         np.zeros(0, np.int64), x, labels=y, train_idx=np.arange(400),
                         val_idx=np.arange(400, 500), test_idx=np.arange(500, 600))


@pytest.mark.parametrize("preset", ["ooc", "static", "baseline"])
def test_a_graph_without_edges_loads_in_every_preset(no_edges, preset):
    ds = ooc.open_dataset(no_edges)
    seen = []
    with ooc.NodeLoader(ds, [5, 5], batch_size=64, input_nodes="train", preset=preset) as loader:
        for data in loader:
            assert data.edge_index.shape == (2, 0)
            assert data.x.shape[0] == data.batch_size          # the seeds alone
            np.testing.assert_array_equal(data.x.numpy(), ds.features.read(data.n_id.numpy()))
            seen.append(data.n_id.numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(400))


def test_a_graph_without_edges_trains_from_the_cli(no_edges):
    r = _cli("ooc.train", "--data", str(no_edges), "--fanouts", "5,5", "--epochs", "5",
             "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    val = float(r.stdout.split("val_acc")[-1].split()[0])
    assert val > 0.9, r.stdout                                   # chance is 1/3


def test_deeply_nested_meta_json_is_one_line(no_edges, tmp_path):
    bad = tmp_path / "nested"
    bad.mkdir()
    for f in no_edges.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "meta.json").write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = _cli("ooc.train", "--data", str(bad), "--epochs", "1")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "meta.json", "nested too deeply")


def test_negative_fanouts_are_a_value_not_an_option(no_edges):
    r = _cli("ooc.train", "--data", str(no_edges), "--fanouts", "-1,-1", "--epochs", "1",
             "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _cli("ooc.train", "--data", str(no_edges), "--fanouts", "1e20", "--epochs", "1")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "--fanouts")


def test_partition_negative_seed_is_one_line(no_edges, tmp_path):
    r = _cli("ooc.partition", "--data", str(no_edges), "--parts", "2", "--out",
             str(tmp_path / "p"), "--seed", "-1")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "--seed")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("preset", ["ooc", "static", "baseline"])
def test_an_iterator_kept_past_close_says_so(no_edges, preset):
    loader = ooc.NodeLoader(ooc.open_dataset(no_edges), [5], batch_size=64,
                            input_nodes="train", preset=preset)
    it = iter(loader)
    next(it)
    loader.close()
    # the threads preparing the next batches ended before the readers closed
    assert not [t.name for t in threading.enumerate() if t.name.startswith("ooc-")]
    with pytest.raises(OocError, match="NodeLoader is closed"):
        next(it)
    with pytest.raises(OocError, match="NodeLoader is closed"):
        iter(loader)


def test_fit_after_close_says_so(no_edges):
    from ooc.executor import TrainConfig, Trainer

    t = Trainer(ooc.open_dataset(no_edges), TrainConfig(fanouts=[5], epochs=1, mode="ooc"))
    t.close()
    with pytest.raises(OocError, match="Trainer is closed"):
        t.fit()
    with pytest.raises(OocError, match="Trainer is closed"):
        t.evaluate(np.arange(10))


def test_infer_partition_that_is_not_an_assignment_is_one_line(tmp_path):
    from ooc.storage import csc_from_edges

    rng = np.random.default_rng(0)
    n = 50
    src, dst = rng.integers(0, n, 200), rng.integers(0, n, 200)
    indptr, indices = csc_from_edges(src, dst, n)
    data = write_dataset(tmp_path / "d", indptr, indices,
                         rng.standard_normal((n, 4)).astype(np.float32),
                         labels=rng.integers(0, 2, n), train_idx=np.arange(30))
    r = _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3",
             "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    text = tmp_path / "part.txt"
    text.write_text("not an array\n")
    r = _cli("ooc.infer", "--data", str(data), "--checkpoint", str(tmp_path / "ck"), "--out",
             str(tmp_path / "e.zarr"), "--partition", str(text), "--order", "pds",
             "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "part.txt", "not a partition assignment")
    assert not (tmp_path / "e.zarr").exists()


def test_an_unreadable_kernel_cache_is_cleared_and_compiled_again(tmp_path):
    """A tampered numba cache file (here in a cache folder of the test's own) is cleared
    and the command runs again from the start, with one note saying so."""
    import os

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "nb"))
    env.pop("OOC_KERNEL_CACHE_RESET", None)
    cmd = [sys.executable, "-m", "ooc.prepare", "synthetic", "--nodes", "300", "--feature-dim",
           "4", "--no-progress", "--out"]
    r = subprocess.run(cmd + [str(tmp_path / "a")], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    index = sorted((tmp_path / "nb").rglob("*.nbi"))
    assert index
    for f in index:
        f.write_text("garbage")
    r = subprocess.run(cmd + [str(tmp_path / "b")], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kernels was unreadable" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "b" / "meta.json").is_file()


def _launcher_with_workers(tmp_path):
    """``ooc.train --workers 2`` on a small dataset (its temp folder under ``tmp_path``),
    once both workers exist (they are still importing torch): ``(launcher, workers)``."""
    import os
    import time

    import psutil

    from ooc.storage import csc_from_edges

    rng = np.random.default_rng(0)
    n = 200
    indptr, indices = csc_from_edges(rng.integers(0, n, 1000), rng.integers(0, n, 1000), n)
    data = write_dataset(tmp_path / "d", indptr, indices,
                         rng.standard_normal((n, 4)).astype(np.float32),
                         labels=rng.integers(0, 2, n), train_idx=np.arange(100))
    (tmp_path / "tmp").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "ooc.train", "--data", str(data), "--workers",
                          "2", "--partitions", "2", "--epochs", "50", "--fanouts", "3",
                          "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    workers: list = []
    t0 = time.monotonic()
    while len(workers) < 2 and time.monotonic() - t0 < 300 and p.poll() is None:
        workers = []
        for c in psutil.Process(p.pid).children():
            try:
                if "ooc.train" in " ".join(c.cmdline()):
                    workers.append(c)
            except psutil.Error:  # a child that ended while being listed
                pass
        time.sleep(0.02)
    # the launcher partitions first (SPRING's kernels compile on a cold cache)
    assert len(workers) == 2, (f"launcher exit {p.poll()}, {len(workers)} workers after "
                               f"{time.monotonic() - t0:.0f} s")
    return p, workers


def _workers_gone(workers) -> None:
    import psutil

    _, alive = psutil.wait_procs(workers, timeout=30)
    for w in alive:
        w.kill()
    assert not alive, [w.pid for w in alive]


def test_workers_end_with_a_kill_of_the_launcher_during_start_up(tmp_path):
    """``kill -9`` of ``ooc.train --workers 2`` as soon as its workers exist: the kernel
    ends them with it (PR_SET_PDEATHSIG). Workers left alone would wait for their
    launcher's heartbeat for 120 s; the test allows them 30 (a loaded machine can take
    seconds to run a worker up to ``import ooc``)."""
    import os
    import signal

    p, workers = _launcher_with_workers(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    _workers_gone(workers)


def test_sigterm_to_the_launcher_stops_its_workers_and_cleans_up(tmp_path):
    """SIGTERM to ``ooc.train --workers 2`` (``timeout``, a scheduler's stop): the launcher
    stops its workers, removes its heartbeat folder and exits 143 with one line."""
    import signal

    p, workers = _launcher_with_workers(tmp_path)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    _workers_gone(workers)
    assert p.returncode == 143, err[-2000:]
    assert_one_line_error(err, "terminated (SIGTERM)")
    assert list((tmp_path / "tmp").glob("ooc-*")) == []  # torch leaves a folder of its own
