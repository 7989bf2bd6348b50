"""python -m ooc.train --workers/--partitions: averaging over gloo, Q=1 vs Q=2, resume, failures.

Subprocess runs are the real thing (a parent starting two gloo workers on
127.0.0.1); the reference models are trained in this process from the
partition datasets, independently of the averaging code.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_one_line_error, community_graph
from fault_injection import fault_env

from ooc import train as train_cli
from ooc.executor.distributed import ensure_partitions, launch
from ooc.executor.training.checkpoint import load_checkpoint
from ooc.executor.training.trainer import TrainConfig, Trainer
from ooc.storage import OocError, open_dataset

pytestmark = pytest.mark.slow  # every test here runs several processes

P = 4
#: hang guard only (a healthy run takes seconds)
HANG_GUARD_S = 240
TRAIN = ["--fanouts", "5,5", "--batch-size", "40", "--hidden", "16", "--lr", "0.02",
         "--mode", "baseline", "--no-progress"]


@pytest.fixture(scope="module")
def parted(tmp_path_factory):
    """A 400-node 3-class graph and its 4 SPRING partitions."""
    root = tmp_path_factory.mktemp("dist")
    data = community_graph(root / "g")
    parts = ensure_partitions(data, P, root / "parts", log=lambda m: None)
    return data, parts


def cli(data, parts, *more, env=None, timeout=HANG_GUARD_S):
    """``python -m ooc.train`` in a subprocess (so it can start workers)."""
    cmd = [sys.executable, "-m", "ooc.train", "--data", str(data), "--partition-dir", str(parts),
           "--partitions", str(P), *TRAIN, *[str(a) for a in more]]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def model_state(ckdir, epoch):
    return load_checkpoint(ckdir / f"epoch_{epoch:04d}.pt")["model_state"]


def assert_same(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol)


def weighted_mean(states, weights):
    """``sum_j w_j states[j] / sum_j w_j`` per entry, in float64, in the entries' dtype (the
    averaging rule written out independently of ooc's code)."""
    total = float(sum(weights))
    return {k: (sum(s[k].double() * w for s, w in zip(states, weights, strict=True)) / total).to(v.dtype)
            for k, v in states[0].items()}


def reference_average(parts, epochs):
    """Each partition's local model trained ``epochs`` epochs here from the same init,
    averaged with its training-node count as weight: (weights, model, Adam state)."""
    states, opts, weights = [], [], []
    for j in range(P):
        ds = open_dataset(parts / f"part_{j:03d}")
        cfg = TrainConfig(model="sage", fanouts=[5, 5], batch_size=40, hidden=16, lr=0.02,
                          epochs=epochs, seed=0, mode="baseline", progress=False,
                          eval_every=10**9, eval_final=False)
        t = Trainer(ds, cfg, log=lambda m: None)
        for _ in range(epochs):
            t.train_epoch()
        t.close()
        states.append({k: v.clone() for k, v in t.model.state_dict().items()})
        opt = t.optimizer.state_dict()["state"]
        opts.append({f"{i}.{k}": torch.as_tensor(v).clone() for i, st in opt.items()
                     for k, v in st.items()})
        weights.append(len(ds.train_idx))
    assert min(weights) > 0 and len(set(weights)) > 1  # the weights matter
    assert not torch.equal(opts[0]["0.exp_avg"], opts[1]["0.exp_avg"])  # the average matters
    return weights, weighted_mean(states, weights), weighted_mean(opts, weights)


def test_two_workers_sync_is_weighted_average_and_matches_one_worker(parted, tmp_path, capsys):
    data, parts = parted
    ck2, ck1 = tmp_path / "q2", tmp_path / "q1"
    # Q = 2 (this process is the parent): one sync after two local epochs
    assert train_cli.main(["--data", str(data), "--partition-dir", str(parts), "--partitions",
                           str(P), "--workers", "2", "--sync-every", "2", "--epochs", "2",
                           "--checkpoint-dir", str(ck2), *TRAIN]) == 0
    out = capsys.readouterr().out
    assert "2 workers, 4 partitions" in out and "[averaged]" in out
    weights, ref, ref_opt = reference_average(parts, 2)
    assert_same(model_state(ck2, 2), ref, rtol=1e-5, atol=1e-6)
    state = load_checkpoint(ck2 / "epoch_0002.pt")
    assert state["extra"]["averaging"]["workers"] == 2
    assert state["extra"]["averaging"]["optimizer_sync"] == "average"
    assert state["args"]["partitions"] == P
    # the averaged Adam state (moments and step counts, the same weights)
    opt = {f"{i}.{k}": torch.as_tensor(v) for i, st in state["optimizer_state"]["state"].items()
           for k, v in st.items()}
    assert_same(opt, ref_opt, rtol=1e-5, atol=1e-6)

    # Q = 1 simulates the 4 partitions in one process: the same weights
    assert train_cli.main(["--data", str(data), "--partition-dir", str(parts), "--partitions",
                           str(P), "--workers", "1", "--sync-every", "2", "--epochs", "4",
                           "--checkpoint-dir", str(ck1), "--report", str(tmp_path / "r.json"),
                           *TRAIN]) == 0
    assert_same(model_state(ck1, 2), model_state(ck2, 2), rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in ck1.iterdir()) == ["epoch_0002.pt", "epoch_0004.pt"]
    import json

    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["train_nodes"] == weights and sum(weights) == 200
    assert [e["synced"] for e in rep["epochs"]] == [False, True, False, True]
    assert rep["epochs"][1]["val_acc"] is not None and rep["epochs"][0]["val_acc"] is None
    assert 0.0 <= rep["test_acc"] <= 1.0

    # resume the two-worker run to epoch 4 (the parent in this process; the settings come
    # from the checkpoint): the same model as the straight Q = 1 run
    capsys.readouterr()
    assert launch(["--checkpoint-dir", str(ck2), "--resume", "--epochs", "4"], 2) == 0
    assert "resumed from" in capsys.readouterr().out
    assert_same(model_state(ck2, 4), model_state(ck1, 4), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how,status,message", [
    ("kill", "killed by SIGKILL", "ooc: injected kill"),
    # a traceback: rank 0 loses its peer in the all_reduce (exit 75), rank 1 is still named
    ("raise", "exit code 1", "RuntimeError: injected raise"),
])
def test_failed_worker_ends_the_run_naming_the_rank(parted, tmp_path, how, status, message):
    """Rank 1 gets SIGKILL (kill -9), or raises, after epoch 1: the run stops with its rank
    and reason, in one line, as the last line."""
    data, parts = parted
    r = cli(data, parts, "--workers", 2, "--epochs", 4, env=fault_env(1, 1, how))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == \
        f"ooc: worker rank 1 failed: {status}: {message} after epoch 1 " \
        f"(OOC_TEST_FAULT=1:1:{how})", r.stderr[-3000:]
    assert "epoch   2/4" not in r.stdout  # nobody trained on alone


FAKE_WORKER = """#!/bin/sh
# a stand-in for `python -m ooc.train`: rank 0 fails slowly, rank 1 reports a lost peer at once
if [ "$RANK" = 0 ]; then sleep 1; echo "[rank0]: ValueError: the real cause" >&2; exit 1; fi
if [ "$RANK" = 1 ]; then echo "ooc: worker rank 1: all_reduce failed" >&2; exit 75; fi
exec sleep 60
"""


def test_parent_names_the_cause_not_the_lost_peer(tmp_path, capsys):
    """A worker that only lost its peer (exit 75) is not the cause; the third is stopped."""
    fake = tmp_path / "fake.sh"
    fake.write_text(FAKE_WORKER)
    fake.chmod(0o755)
    assert launch([], 3, python=str(fake)) == 1
    err = capsys.readouterr().err
    assert "ooc: worker rank 0 failed: exit code 1: ValueError: the real cause" in err


def test_bad_input(parted, tmp_path):
    data, parts = parted
    with pytest.raises(SystemExit) as e:
        train_cli.main(["--data", str(data), "--partition-dir", str(parts), "--partitions", "3",
                        "--workers", "1", *TRAIN])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        train_cli.main(["--data", str(data), "--workers", "1", "--sync-every", "0", *TRAIN])
    with pytest.raises(OocError, match="not a partition folder"):
        ensure_partitions(data, 2, tmp_path)


@pytest.mark.parametrize("var,value", [("OOC_DIST_TIMEOUT", "soon"),
                                       ("OOC_HEARTBEAT_TIMEOUT", "0")])
def test_bad_timeout_setting_is_one_line_before_any_worker(parted, monkeypatch, capsys, var,
                                                          value):
    data, parts = parted
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as e:
        train_cli.main(["--data", str(data), "--partition-dir", str(parts), "--partitions",
                        str(P), "--workers", "2", *TRAIN])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert_one_line_error(out.err, f"{var}={value!r}", "positive number of seconds")
    assert "starting" not in out.out  # no worker was started


def test_auto_partitions_hold_the_model_depth_as_halo(tmp_path):
    """Without --partition-dir the run partitions with an L-hop halo (L = layers): every
    owned node's sampled neighbourhood is the whole graph's."""
    import json

    data = community_graph(tmp_path / "g", n=120)
    assert train_cli.main(["--data", str(data), "--workers", "1", "--partitions", "2",
                           "--epochs", "1", *TRAIN]) == 0
    out = tmp_path / "g.partitions" / "spring_p2_h2"
    meta = json.loads((out / "part_000" / "meta.json").read_text())["partition"]
    assert meta["halo_hops"] == 2 and len(meta["num_replicas_per_hop"]) == 2
    assert not (tmp_path / "g.partitions" / "spring_p2").exists()
    with pytest.raises(SystemExit) as e:
        train_cli.main(["--data", str(data), "--workers", "1", "--partitions", "2",
                        "--halo-hops", "0", *TRAIN])
    assert e.value.code == 2
