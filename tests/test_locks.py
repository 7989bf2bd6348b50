"""One writer at a time: a checkpoint folder, a dataset and a partition output being written
are locked (flock, released when the holder dies); the second writer gets one line naming
the holder's pid and leaves the first one's files alone."""
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import REPO, assert_one_line_error

from ooc.storage import OocError, csc_from_edges, write_dataset
from ooc.storage.locks import exclusive, exclusive_wait, lock_path

HOLD = """
import sys, time
from ooc.storage.locks import exclusive
with exclusive(sys.argv[1], "test output"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder():
    """Start a process that holds the lock of a target; kill -9 it after the test."""
    procs = []

    def start(target):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    n = 80
    indptr, indices = csc_from_edges(rng.integers(0, n, 400), rng.integers(0, n, 400), n)
    return write_dataset(tmp_path_factory.mktemp("l") / "d", indptr, indices,
                         rng.standard_normal((n, 4)).astype(np.float32),
                         labels=rng.integers(0, 2, n), train_idx=np.arange(40),
                         val_idx=np.arange(40, 60))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_second_training_on_a_checkpoint_folder_is_refused(data, tmp_path, holder):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "mine.txt").write_text("kept")
    p = holder(ck)
    r = _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3",
             "--checkpoint-dir", str(ck), "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, str(ck), f"process {p.pid}", "checkpoint folder")
    assert sorted(x.name for x in ck.iterdir()) == ["mine.txt"]
    os.kill(p.pid, signal.SIGKILL)            # the kernel releases a dead holder's lock
    p.wait()
    r = _cli("ooc.train", "--data", str(data), "--epochs", "1", "--fanouts", "3",
             "--checkpoint-dir", str(ck), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(ck.glob("*.pt")) and not lock_path(ck).exists()


def test_trainer_fit_takes_the_same_lock(data, tmp_path, holder):
    import ooc
    from ooc.executor import TrainConfig, Trainer

    ck = tmp_path / "ck"
    p = holder(ck)
    with Trainer(ooc.open_dataset(data), TrainConfig(fanouts=[3], epochs=1)) as t:
        with pytest.raises(OocError, match=f"process {p.pid}"):
            t.fit(checkpoint_dir=ck)
    assert not ck.exists()


def test_a_dataset_being_written_is_locked(tmp_path, holder):
    out = tmp_path / "ds"
    p = holder(out)
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n")
    r = _cli("ooc.prepare", "edgelist", str(edges), "--out", str(out), "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, str(out), f"process {p.pid}", "dataset")
    assert not out.exists()


def test_a_partition_output_being_written_is_locked(data, tmp_path, holder):
    out = tmp_path / "parts"
    p = holder(out)
    r = _cli("ooc.partition", "--data", str(data), "--parts", "2", "--out", str(out), "--quiet")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, f"process {p.pid}", "partition output")
    assert not out.exists()


def test_an_inference_output_being_written_is_locked(data, tmp_path, holder):
    from ooc.executor.training.checkpoint import save_checkpoint
    from ooc.executor.training.models import build_model

    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 4, 8, 2, 1))
    out = tmp_path / "e.zarr"
    p = holder(out)
    r = _cli("ooc.infer", "--data", str(data), "--checkpoint", str(ck), "--out", str(out),
             "--no-progress")
    assert r.returncode == 2
    assert_one_line_error(r.stderr, str(out), f"process {p.pid}", "inference output")
    assert not out.exists()


def test_the_lock_is_released_and_removed_after_the_block(tmp_path):
    target = tmp_path / "x"
    with exclusive(target, "thing") as path:
        assert path.read_text() == str(os.getpid())
        with pytest.raises(OocError, match="being written by process"):
            with exclusive(target, "thing"):
                pass
    assert not path.exists()
    with exclusive(target, "thing"):
        pass


def test_exclusive_wait_waits_for_the_holder_then_times_out_naming_it(tmp_path, holder):
    """A waiter gets the lock as soon as its holder lets go, and one line naming the holder
    when it does not let go in time (TimedOut is a TimeoutError)."""
    target = tmp_path / "x"
    with exclusive(target, "thing"):
        with pytest.raises(OocError, match=f"process {os.getpid()} after 0.3s of waiting") as e:
            with exclusive_wait(target, "thing", 0.3):
                pass
    assert isinstance(e.value, TimeoutError)
    # held by another process that dies (kill -9): the kernel releases it, the waiter goes on
    p = holder(target)
    threading.Timer(0.5, p.kill).start()
    with exclusive_wait(target, "thing", 60) as path:
        assert path.read_text() == str(os.getpid())
    assert p.wait() == -signal.SIGKILL
