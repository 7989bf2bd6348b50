"""Faults during runs: kill -9 then resume, stopped/hung workers, foreign checkpoints.

The killed processes are real children killed with SIGKILL at a batch (or
output chunk) drawn from a seeded RNG; the references are straight runs of
the same command.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, community_graph
from fault_injection import fault_env

from ooc import train as train_cli
from ooc.executor.distributed import ensure_partitions, launch
from ooc.executor.distributed import heartbeat as HB
from ooc.executor.training.checkpoint import load_checkpoint

#: hang guard only (each run takes seconds)
GUARD_S = 300
#: Runs ``python -m ooc.train``/``ooc.infer`` and kills itself with SIGKILL when the
#: K-th training step starts (train) or the K-th output chunk is recorded (infer).
KILLER = r"""
import os, signal, sys
which, K = sys.argv[1], int(sys.argv[2])
count = [0]
def hit():
    count[0] += 1
    if count[0] == K:
        os.kill(os.getpid(), signal.SIGKILL)
if which == "train":
    import ooc.executor.training.trainer as T
    orig = T.Trainer._step
    def patched(self, *args):
        hit()
        return orig(self, *args)
    T.Trainer._step = patched
    from ooc.train import main
else:
    import ooc.executor.inference.store as I
    orig = I.fsync_path
    def patched(path):
        orig(path)
        if "/c/" in str(path):  # an output chunk, durably written
            hit()
    I.fsync_path = patched
    from ooc.infer import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return community_graph(root / "g", n=300), root


def killed(tmp_path: Path, which: str, k: int, argv: list[str]) -> subprocess.CompletedProcess:
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    return subprocess.run([sys.executable, str(script), which, str(k), *map(str, argv)],
                          cwd=REPO, capture_output=True, text=True, timeout=GUARD_S)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ooc", "baseline"])
def test_kill9_mid_epoch_then_resume_equals_a_straight_run(graph, tmp_path, mode):
    """SIGKILL at a random batch of epoch 2 or 3; --resume gives the straight run's
    per-epoch losses and final weights bit for bit. ooc mode runs several superbatches
    per epoch with a small Belady cache, so the cache state carried across superbatches
    is lost by the kill."""
    data, _ = graph
    rt = tmp_path / "rt"
    args = ["--data", data, "--fanouts", "4,4", "--batch-size", "20", "--hidden", "16",
            "--lr", "0.02", "--epochs", "3", "--mode", mode, "--no-progress", "--no-eval",
            "--runtime-dir", rt, "--superbatch-size", "2", "--feature-cache-size", "2KiB"]
    args = [str(a) for a in args]
    assert train_cli.main(args + ["--checkpoint-dir", str(tmp_path / "a"),
                                  "--report", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    nb = len(list(range(0, 150, 20)))  # batches per epoch (150 training nodes)
    k = int(np.random.default_rng(17 + len(mode)).integers(nb + 1, 3 * nb))
    r = killed(tmp_path, "train", k, args + ["--checkpoint-dir", tmp_path / "b"])
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    done = (k - 1) // nb  # epochs finished (and checkpointed) before the kill
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == \
        [f"epoch_{e:04d}.pt" for e in range(1, done + 1)]
    stale = [p.name for p in rt.iterdir()] if rt.exists() else []
    assert len(stale) == (1 if mode == "ooc" else 0), stale  # the killed run's runtime folder
    live = rt / f"run{os.getpid()}-live"  # a run of a live process: kept
    live.mkdir(parents=True)
    assert train_cli.main(["--checkpoint-dir", str(tmp_path / "b"), "--resume", "--epochs", "3",
                           "--report", str(tmp_path / "b.json"), "--no-progress"]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert [e["loss"] for e in b["epochs"]] == [e["loss"] for e in a["epochs"]]
    assert b["epochs"][0]["val_acc"] is None  # --no-eval came back from the checkpoint
    wa = load_checkpoint(tmp_path / "a" / "epoch_0003.pt")["model_state"]
    wb = load_checkpoint(tmp_path / "b" / "epoch_0003.pt")["model_state"]
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert sorted(p.name for p in rt.iterdir()) == [live.name]  # stale gone, none left


def test_resume_on_another_dataset_is_refused(graph, tmp_path, capsys):
    """Same dimensions, another graph: the meta.json fingerprint tells them apart."""
    data, _ = graph
    other = community_graph(tmp_path / "other", n=300, seed=1)
    ck = tmp_path / "ck"
    common = ["--fanouts", "3", "--batch-size", "50", "--hidden", "8", "--mode", "baseline",
              "--no-progress", "--no-eval"]
    assert train_cli.main(["--data", str(data), "--epochs", "1", "--checkpoint-dir", str(ck),
                           *common]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_cli.main(["--data", str(other), "--checkpoint-dir", str(ck), "--resume",
                        "--epochs", "2", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "checkpoint was trained on" in err and "fingerprint" in err, err
    assert sorted(p.name for p in ck.iterdir()) == ["epoch_0001.pt"]
    # a moved copy of the same dataset resumes
    moved = tmp_path / "moved"
    os.rename(community_graph(tmp_path / "copy", n=300), moved)
    assert train_cli.main(["--data", str(moved), "--checkpoint-dir", str(ck), "--resume",
                           "--epochs", "2", "--no-progress"]) == 0


def test_kill9_during_inference_leaves_no_store_and_resumes(graph, tmp_path):
    """SIGKILL after a random output chunk: nothing opens at --out; the same command
    resumes from the partial folder and gives the straight run's arrays."""
    import zarr

    from ooc.executor.inference.layerwise import partial_path, read_embeddings
    from ooc.executor.training.checkpoint import save_checkpoint
    from ooc.executor.training.models import build_model

    data, _ = graph
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 8, 16, 3, num_layers=2))
    base = ["--data", data, "--checkpoint", ck, "--memory-budget", "4GiB", "--chunk-rows", "32",
            "--no-progress", "--keep-layers"]
    from ooc.infer import main as infer_main

    assert infer_main([str(a) for a in base + ["--out", tmp_path / "full.zarr"]]) == 0
    out = tmp_path / "emb.zarr"
    k = int(np.random.default_rng(5).integers(2, 2 * 10))  # 10 chunks per layer, 2 layers
    r = killed(tmp_path, "infer", k, base + ["--out", out])
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not out.exists()
    with pytest.raises(FileNotFoundError):
        zarr.open_group(str(out), mode="r")
    assert partial_path(out).is_dir()
    assert infer_main([str(a) for a in base + ["--out", out, "--report", tmp_path / "r.json"]]) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    # the k-th chunk was written, its progress record not yet: k - 1 chunks are kept
    assert rep["resumed"] and rep["resumed_chunks"] == k - 1
    assert not partial_path(out).exists()
    for name in ("h1", "h2", "pred"):
        np.testing.assert_array_equal(read_embeddings(out, name),
                                      read_embeddings(tmp_path / "full.zarr", name))


# -- workers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parted(graph):
    data, root = graph
    return data, ensure_partitions(data, 2, root / "parts", log=lambda m: None)


@pytest.mark.parametrize("how,env,reason", [
    # the issue's case: rank 0's collective times out first (gloo, 3 s) and exits as
    # "peer lost"; the launcher still names the stopped rank 1
    ("stop", {"OOC_DIST_TIMEOUT": "3"},
     r"no heartbeat for [\d.]+s \(the process is stopped.*seen after another worker lost"),
    ("hang", {HB.ENV_TIMEOUT: "5"},
     r"no progress for [\d.]+s while working \(hung\); limit OOC_HEARTBEAT_TIMEOUT=5s"),
    # a stall in start-up (alive, beating, no batch yet) is not judged by the heartbeat;
    # rank 0's collective times out (3 s) and the launcher names rank 1, not rank 0 (rank 1
    # entered two: the rendezvous and the check that the workers read the same data)
    ("hang@0", {"OOC_DIST_TIMEOUT": "3", HB.ENV_TIMEOUT: "600"},
     r"still starting up \(2 collectives entered, the rendezvous included\) while the other "
     r"workers timed out waiting for it"),
])
@pytest.mark.slow
def test_stopped_or_hung_worker_is_named(parted, monkeypatch, capsys, how, env, reason):
    """kill -STOP (SIGSTOP) or a hang of rank 1 after epoch 1, while rank 0 waits in the
    all_reduce: the launcher names rank 1 (not the waiting rank 0) and ends the run."""
    import re

    import psutil

    data, parts = parted
    how, _, at = how.partition("@")
    for k, v in {**env, **fault_env(1, int(at or 1), how)}.items():
        monkeypatch.setenv(k, v)
    rc = launch(["--data", str(data), "--partition-dir", str(parts), "--partitions", "2",
                 "--workers", "2", "--epochs", "3", "--fanouts", "3,3", "--batch-size", "20",
                 "--hidden", "8", "--mode", "baseline", "--no-progress"], 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("ooc: worker rank 1 failed: "), err[-5:]
    assert re.search(reason, err[-1]), err[-1]
    assert not [p for p in psutil.Process().children(recursive=True)
                if "ooc.train" in " ".join(p.cmdline())]


def test_monitor_blames_the_worker_that_blocks_the_others(tmp_path):
    """The monitor's rules on hand-written slots and a fake clock."""
    clock = [100.0]
    path = HB.create_file(tmp_path / "hb", 3)
    mon = HB.HeartbeatMonitor(path, 3, timeout=10.0, startup=30.0, clock=lambda: clock[0])
    slots = np.memmap(path, dtype=np.int64, mode="r+").reshape(3, HB.SLOT)

    def tick(seconds, beat=(0, 1, 2), progress=()):
        clock[0] += seconds
        for r in beat:
            slots[r, HB.BEATS] += 1
        for r in progress:
            slots[r, HB.PROGRESS] += 1
        return mon.check([0, 1, 2])

    # nobody has beaten yet: within the start-up allowance, then rank 2 never starts
    slots[:, HB.BEATS] = 0
    assert mon.check([0, 1, 2]) is None
    assert tick(20, beat=(0, 1)) is None
    r = tick(11, beat=(0, 1))
    assert r[0] == 2 and "within 30s" in r[1]
    slots[2, HB.BEATS] = 1
    # ranks 0 and 2 wait in collective #4; rank 1 works, then stops progressing: rank 1
    slots[:, HB.PHASE] = [HB.COLLECTIVE, HB.WORK, HB.COLLECTIVE]
    slots[:, HB.COLLECTIVES] = [4, 3, 4]
    assert tick(5, progress=(0, 1, 2)) is None
    assert tick(6, progress=(1,)) is None
    r = tick(11)
    assert r[0] == 1 and "no progress" in r[1]
    # all three in a collective and stuck: the one behind (fewest collectives)
    slots[1, HB.PHASE] = HB.COLLECTIVE
    assert tick(1, progress=(0, 1, 2)) is None
    r = tick(11)
    assert r[0] == 1 and "stuck in collective #3" in r[1]
    # a stopped process: its beats stop, whatever its phase
    slots[:, HB.COLLECTIVES] = 4
    assert tick(1, progress=(0, 1, 2)) is None
    r = tick(11, beat=(0, 1), progress=(0, 1))
    assert r[0] == 2 and "no heartbeat" in r[1]
    # a worker that is setting up is judged on its beats only
    slots[:, HB.PHASE] = HB.SETUP
    assert tick(1, progress=(0, 1, 2)) is None
    assert tick(30) is None


def test_heartbeat_thread_and_marks(tmp_path):
    """A real Heartbeat: the thread beats, beat()/collective() move progress and phase."""
    import time

    path = HB.create_file(tmp_path / "hb", 2)
    hb = HB.Heartbeat(path, 1, interval=0.01)
    slots = np.memmap(path, dtype=np.int64, mode="r").reshape(2, HB.SLOT)
    try:
        t_end = time.monotonic() + 30
        while slots[1, HB.BEATS] < 3 and time.monotonic() < t_end:
            time.sleep(0.01)
        assert slots[1, HB.BEATS] >= 3 and slots[1, HB.PID] == os.getpid()
        assert slots[1, HB.PHASE] == HB.SETUP
        hb.beat()
        assert slots[1, HB.PHASE] == HB.WORK and slots[1, HB.PROGRESS] == 1
        with hb.collective():
            assert slots[1, HB.PHASE] == HB.COLLECTIVE and slots[1, HB.COLLECTIVES] == 1
        assert slots[1, HB.PHASE] == HB.WORK and slots[1, HB.PROGRESS] == 3
        assert slots[0].tolist() == [0] * HB.SLOT  # another rank's slot is untouched
    finally:
        hb.close()


CHILD = r"""
import sys, time
from ooc.executor.distributed.heartbeat import Heartbeat, create_file
hb = Heartbeat(create_file(sys.argv[1], 1), 0, interval=0.05)
open(sys.argv[2], "w").close()
time.sleep(120)
"""


def test_worker_exits_when_its_launcher_is_gone(tmp_path):
    """A shell starts a process with a Heartbeat and exits (as a launcher killed with -9
    would): the orphan notices within a beat and exits, saying why."""
    import psutil

    (tmp_path / "child.py").write_text(CHILD)
    ready, log = tmp_path / "ready", tmp_path / "child.err"
    sh = (f"{sys.executable} {tmp_path / 'child.py'} {tmp_path / 'hb'} {ready} 2> {log} & "
          f"echo $!; while [ ! -e {ready} ]; do sleep 0.1; done")
    p = subprocess.run(["sh", "-c", sh], cwd=REPO, capture_output=True, text=True,
                       timeout=GUARD_S)
    pid = int(p.stdout.split()[0])
    try:
        psutil.Process(pid).wait(timeout=GUARD_S)  # raises TimeoutExpired if it lives on
    except psutil.NoSuchProcess:
        pass
    assert "its launcher" in log.read_text() and "is gone; exiting" in log.read_text()
