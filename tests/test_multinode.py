"""More than one machine: ``ooc.train --workers`` under ``torchrun --nnodes 2``.

Two torchrun agents on this host stand for two nodes (c10d rendezvous on
127.0.0.1), each with its own partition folder; they must train the model that
one process simulating every partition trains, and a worker killed on one node
is named, with its node, by the worker that lost it on the other. The pieces
(who partitions, the check that the nodes read the same data, the naming of the
gone workers) are also tested on their own in this process.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from conftest import CORA_RAW, REPO, community_graph, require_cora
from fault_injection import fault_env

from ooc import train as train_cli
from ooc.executor.distributed import liveness
from ooc.executor.distributed.comm import PeerLost
from ooc.executor.distributed.environment import free_port, identity
from ooc.executor.distributed.partitions import ensure_partitions_locked
from ooc.executor.distributed.worker import check_same_data, peer_lost_message
from ooc.executor.training.checkpoint import load_checkpoint
from ooc.storage import OocError, open_dataset

TRAIN = ["--fanouts", "5,5", "--batch-size", "40", "--hidden", "16", "--lr", "0.02",
         "--mode", "baseline", "--no-progress", "--partitions", "4", "--sync-every", "1"]
#: hang guard only (two agents start in well under a minute)
HANG_GUARD_S = 300


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    """Planetoid Cora from the shared raw files, as an ooc dataset."""
    require_cora()
    out = tmp_path_factory.mktemp("cora") / "cora"
    r = subprocess.run([sys.executable, "-m", "ooc.prepare", "planetoid", "--root",
                        str(CORA_RAW.parents[1]), "--name", "Cora", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def two_nodes(*node_args: list[str], env: dict[str, str] | None = None,
              monitor_s: float | None = None) -> list[subprocess.CompletedProcess]:
    """``torchrun --nnodes 2 --nproc-per-node 1 -m ooc.train ARGS`` twice at once on this
    host (c10d rendezvous on 127.0.0.1, gloo on the loopback), one per ``node_args``;
    ``monitor_s``: the agents' ``--monitor-interval``."""
    port = free_port()
    monitor = [] if monitor_s is None else ["--monitor-interval", str(monitor_s)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
           "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           f"127.0.0.1:{port}", "--local-addr", "127.0.0.1", *monitor, "-m", "ooc.train"]
    full_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    procs = [subprocess.Popen(cmd + [str(a) for a in args], cwd=REPO, env=full_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for args in node_args]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=HANG_GUARD_S)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


@pytest.mark.slow
def test_two_torchrun_nodes_train_the_one_process_model(cora, tmp_path):
    """Each node makes its own partition folder (the same partitions: SPRING with one seed)
    and the two workers average to the model that one process simulating the four
    partitions trains; rank 0 writes the report and the checkpoints."""
    ck, report = tmp_path / "ck", tmp_path / "r.json"
    common = ["--data", cora, "--workers", "2", "--epochs", "3", "--checkpoint-dir", ck,
              "--report", report, *TRAIN]
    runs = two_nodes([*common, "--partition-dir", tmp_path / "node_a"],
                     [*common, "--partition-dir", tmp_path / "node_b"])
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    out = "".join(r.stdout for r in runs)
    assert out.count("ooc.train: partitioning") == 2  # one copy per node
    assert (tmp_path / "node_a" / "owner.npy").read_bytes() == \
        (tmp_path / "node_b" / "owner.npy").read_bytes()
    rep = json.loads(report.read_text())
    assert [e["synced"] for e in rep["epochs"]] == [True, True, True]

    ck1, report1 = tmp_path / "ck1", tmp_path / "r1.json"
    assert train_cli.main(["--data", str(cora), "--workers", "1", "--epochs", "3",
                           "--partition-dir", str(tmp_path / "node_a"), "--checkpoint-dir",
                           str(ck1), "--report", str(report1), *TRAIN]) == 0
    two = load_checkpoint(ck / "epoch_0003.pt")["model_state"]
    one = load_checkpoint(ck1 / "epoch_0003.pt")["model_state"]
    assert set(two) == set(one)
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=1e-6)
    rep1 = json.loads(report1.read_text())
    assert rep["train_nodes"] == rep1["train_nodes"] and sum(rep["train_nodes"]) == 140
    assert abs(rep["test_acc"] - rep1["test_acc"]) <= 0.002  # one test node of 1,000
    assert rep["test_acc"] > 0.3  # 7 classes: a model that learnt nothing is near 0.14


@pytest.mark.slow
def test_a_worker_killed_on_one_node_is_named_with_its_node(cora, tmp_path):
    """Rank 1 (node 1's worker) gets SIGKILL after epoch 1; the worker on node 0 names it,
    its node and its host, and both agents fail: nobody trains on alone."""
    args = ["--data", cora, "--workers", "2", "--epochs", "4", *TRAIN]
    # torchrun's agent on node 0 stops its worker (SIGTERM) once it sees node 1's agent
    # leave, which it checks every --monitor-interval (0.1 s by default): on a busy machine
    # that can come before the worker has seen the lost peer's beats stop for 3 s
    runs = two_nodes(args, args, env=fault_env(1, 1, "kill"), monitor_s=10)
    assert all(r.returncode != 0 for r in runs), [r.stderr[-2000:] for r in runs]
    err = "".join(r.stderr for r in runs)
    host = re.escape(socket.gethostname())
    line = re.search(rf"^ooc: worker rank 1 \(node 1, host {host}, pid \d+\) failed: gone "
                     rf"\([^)]*\); worker rank 0 \(node 0, host {host}, pid \d+\) lost it: "
                     rf"all_reduce failed", err, re.M)
    assert line, [ln for ln in err.splitlines() if ln.startswith("ooc")]
    assert "epoch   2/4" not in "".join(r.stdout for r in runs)


def test_partitions_are_made_once_when_two_processes_ask_at_once(tmp_path):
    """Two processes (nodes sharing a folder, or workers of one node) ensure the same
    partition folder together: the first to take the lock partitions, the other then
    finds the folder made and reuses it (no second writer, no error)."""
    data = community_graph(tmp_path / "g", n=120)
    out, logs = tmp_path / "parts", [[], []]
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(ensure_partitions_locked, data, 2, out, 120, 0, logs[i].append)
                   for i in range(2)]
        assert [f.result() for f in futures] == [out, out]
    assert sum(any("partitioning" in m for m in log) for log in logs) == 1
    assert not any(p.name.endswith(".ooc-lock") for p in tmp_path.iterdir())


class FakeComm:
    """A group whose gather returns what the test says and whose gone workers are given."""

    def __init__(self, rank, world, gathered=None, gone=None):
        self.rank, self.world_size, self.gathered, self._gone = rank, world, gathered, gone

    def all_gather_object(self, obj):
        return [obj if p is None else p for p in self.gathered]

    def gone(self):
        return self._gone


def test_nodes_that_read_other_partitions_are_refused_naming_both(tmp_path):
    """Before training every worker compares the digests of its dataset and partitions with
    the others': one line naming both workers, their nodes and folders."""
    data = community_graph(tmp_path / "g", n=120)
    parts = {h: ensure_partitions_locked(data, 2, tmp_path / f"p{h}", 60, log=lambda m: None,
                                         halo_hops=h) for h in (1, 2)}
    run = SimpleNamespace(dataset=open_dataset(data), part_dir=parts[1], parts=2)
    other = SimpleNamespace(dataset=run.dataset, part_dir=parts[2], parts=2)
    theirs = check_same_data(FakeComm(0, 1, [None]), other)[0]
    theirs.update(rank=1, node=1, host="node-b", pid=7)
    with pytest.raises(OocError, match=r"the partitions differ between workers: worker rank 0 "
                       r"\(node 0, host .*\) reads .*p1 \[[0-9a-f]{16}\], worker rank 1 \(node "
                       r"1, host node-b, pid 7\) reads .*p2 \[[0-9a-f]{16}\]; copy one node's"):
        check_same_data(FakeComm(0, 2, [None, theirs]), run)
    same = dict(theirs, part_dir=str(parts[1]), parts=check_same_data(
        FakeComm(0, 1, [None]), run)[0]["parts"])
    assert len(check_same_data(FakeComm(0, 2, [None, same]), run)) == 2
    with pytest.raises(ValueError, match="the datasets differ.*give every node a copy"):
        check_same_data(FakeComm(0, 2, [None, dict(same, data="0" * 16)]), run)


def test_the_lost_worker_is_named_with_its_node_only_when_it_is_another():
    me = dict(identity(), rank=0)
    peers = [me, dict(me, rank=1, pid=11), dict(me, rank=2, node=1, host="node-b", pid=12)]
    e = PeerLost("all_reduce failed, another worker died or timed out (Connection closed)")
    msg = peer_lost_message(e, FakeComm(0, 3, gone=[2]), peers)
    assert msg == (f"ooc: worker rank 2 (node 1, host node-b, pid 12) failed: gone (its beats "
                   f"in the group's store stopped for 3s); worker rank 0 (node 0, host "
                   f"{me['host']}, pid {me['pid']}) lost it: {e}")
    assert peer_lost_message(e, FakeComm(0, 3, gone=[1]), peers).startswith(
        "ooc: worker rank 1 failed: gone")  # on this node: named as the launcher names it
    assert peer_lost_message(e, FakeComm(0, 3, gone=[]), peers) == \
        f"ooc: worker rank 0 (node 0, host {me['host']}, pid {me['pid']}): {e}"
    # the store's host is gone too: of two workers the other one is the gone one
    assert peer_lost_message(e, FakeComm(1, 2, gone=None), peers[:2]).startswith(
        "ooc: worker rank 0 failed: gone (the group's store is gone with it)")


def test_liveness_finds_the_worker_whose_beats_stopped(monkeypatch):
    """Three workers beat in a real TCP store; the one that stops is the one found gone."""
    import datetime

    import torch.distributed as dist

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    beats = [liveness.Liveness(r, 3) for r in range(3)]
    try:
        threading.Event().wait(2 * liveness.INTERVAL_S)
        beats[2].close()
        assert beats[0].gone() == [2]
    finally:
        for b in beats:
            b.close()
        del server
