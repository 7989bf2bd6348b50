"""python -m ooc.train: the report, resume, the default dataset, Cora, bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import CORA_RAW, REPO, assert_one_line_error, community_graph

from ooc import train as train_cli

QUIET = ["--no-progress", "--mode", "baseline"]  # this file tests the baseline loop


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return community_graph(tmp_path_factory.mktemp("cli") / "tiny")


def run(argv):
    return train_cli.main([str(a) for a in argv] + QUIET)


def small_args(data, *more):
    return ["--data", data, "--fanouts", "5,5", "--batch-size", "50", "--hidden", "16",
            "--lr", "0.02", *more]


def test_report_fields(tiny, tmp_path, capsys):
    rep_path = tmp_path / "r.json"
    assert run(small_args(tiny, "--epochs", "3", "--eval-every", "2", "--report", rep_path)) == 0
    out = capsys.readouterr().out
    assert "epoch   3/3" in out and "test_acc" in out
    rep = json.loads(rep_path.read_text())
    assert rep["mode"] == "baseline"
    assert 0.0 <= rep["test_acc"] <= 1.0 and 0.0 <= rep["val_acc"] <= 1.0
    assert rep["peak_rss_bytes"] > 0
    assert [e["epoch"] for e in rep["epochs"]] == [1, 2, 3]
    for e in rep["epochs"]:
        assert e["loss"] > 0 and e["time_s"] >= 0 and "train_acc" in e
    assert rep["epochs"][1]["val_acc"] is not None and rep["epochs"][0]["val_acc"] is None
    assert set(rep["timers"]) >= {"sample", "gather", "transfer", "compute"}
    assert rep["model"]["kind"] == "sage" and rep["model"]["num_layers"] == 2


def test_the_last_epochs_validation_is_not_repeated(tiny, tmp_path, monkeypatch):
    """The final validation accuracy is the last epoch's (same weights, fixed evaluation
    seed): validation runs once per evaluated epoch, then the test split once; it equals
    what evaluating again gives."""
    from ooc.executor.training.trainer import Trainer

    calls = []
    real = Trainer.evaluate

    def counted(self, ids):
        acc = real(self, ids)
        calls.append((len(ids), acc))
        if len(calls) == 2:  # the last epoch's validation, evaluated again
            assert real(self, ids) == acc
        return acc

    monkeypatch.setattr(Trainer, "evaluate", counted)
    rep_path = tmp_path / "r.json"
    assert run(small_args(tiny, "--epochs", "2", "--report", rep_path)) == 0
    rep = json.loads(rep_path.read_text())
    assert len(calls) == 3  # validation after epochs 1 and 2, then the test split
    assert rep["val_acc"] == rep["epochs"][-1]["val_acc"] == calls[1][1]
    assert rep["test_acc"] == calls[2][1]


def test_a_run_stopped_midway_leaves_the_report_of_its_epochs(tiny, tmp_path, monkeypatch):
    """The report is rewritten after every epoch: stopped in its third epoch, a run leaves
    two epochs, marked incomplete; a run that ends marks it complete."""
    from ooc.executor.training.trainer import Trainer

    real = Trainer.train_epoch

    def stopping(self):
        if self.epoch == 2:
            raise KeyboardInterrupt
        return real(self)

    rep_path = tmp_path / "r.json"
    monkeypatch.setattr(Trainer, "train_epoch", stopping)
    assert run(small_args(tiny, "--epochs", "4", "--report", rep_path)) != 0  # interrupted
    rep = json.loads(rep_path.read_text())
    assert rep["complete"] is False and [e["epoch"] for e in rep["epochs"]] == [1, 2]
    assert rep["test_acc"] is None and rep["total_time_s"] > 0
    monkeypatch.setattr(Trainer, "train_epoch", real)
    assert run(small_args(tiny, "--epochs", "1", "--report", rep_path)) == 0
    rep = json.loads(rep_path.read_text())
    assert rep["complete"] is True and rep["test_acc"] is not None


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_other_models_and_layers(tiny, tmp_path, model):
    rep_path = tmp_path / "r.json"
    assert run(["--data", tiny, "--model", model, "--layers", "3", "--batch-size", "100",
                "--hidden", "8", "--heads", "2", "--epochs", "1", "--report", rep_path]) == 0
    rep = json.loads(rep_path.read_text())
    assert rep["model"]["kind"] == model and rep["model"]["num_layers"] == 3


def test_resume_continues_exactly(tiny, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(small_args(tiny, "--epochs", "4", "--checkpoint-dir", full,
                          "--report", tmp_path / "a.json")) == 0
    assert sorted(p.name for p in full.iterdir()) == [f"epoch_000{i}.pt" for i in range(1, 5)]
    assert run(small_args(tiny, "--epochs", "2", "--checkpoint-dir", part)) == 0
    torch.manual_seed(123)  # whatever happened before must not matter
    # settings come from the checkpoint; only --epochs is given again
    assert run(["--checkpoint-dir", part, "--resume", "--epochs", "4",
                "--report", tmp_path / "b.json"]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert [e["loss"] for e in a["epochs"]] == [e["loss"] for e in b["epochs"]]
    assert a["test_acc"] == b["test_acc"]
    assert b["resumed_from"].endswith("epoch_0002.pt")


def test_resume_with_no_epoch_left_says_so(tiny, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert run(small_args(tiny, "--epochs", "2", "--checkpoint-dir", ck)) == 0
    capsys.readouterr()
    assert run(["--checkpoint-dir", ck, "--resume", "--epochs", "2"]) == 0
    err = capsys.readouterr().err
    assert "has trained 2 epochs already" in err and "raise --epochs" in err
    assert sorted(p.name for p in ck.iterdir()) == ["epoch_0001.pt", "epoch_0002.pt"]


def test_default_dataset_created_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OOC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train_cli, "DEFAULT_DATASET",
                        dict(train_cli.DEFAULT_DATASET, nodes=3000, avg_degree=5, feature_dim=16,
                             classes=4))
    monkeypatch.setitem(train_cli.DEFAULTS, "epochs", 1)
    assert run(["--report", tmp_path / "r.json"]) == 0
    assert "creating the default dataset" in capsys.readouterr().out
    assert (tmp_path / "cache" / "default-v1" / "meta.json").is_file()
    assert run(["--fanouts", "3", "--batch-size", "256"]) == 0
    out = capsys.readouterr().out
    assert "using the default dataset" in out and "creating" not in out
    assert json.loads((tmp_path / "r.json").read_text())["test_acc"] is not None


def _bad(argv, capsys, match):
    with pytest.raises(SystemExit) as e:
        run(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ooc: ") and "\n" not in err, err
    assert match in err, err


def test_bad_input(tiny, tmp_path, capsys):
    _bad(["--data", tmp_path / "missing"], capsys, "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "meta.json").write_text("{not json")
    _bad(["--data", broken], capsys, "meta.json")
    for f in ("10,x", "0", "10,-2", ","):
        _bad(["--data", tiny, "--fanouts", f], capsys, "--fanouts")
    _bad(["--data", tiny, "--fanouts", "5,5", "--layers", "3"], capsys, "--layers")
    _bad(["--data", tiny, "--batch-size", "0"], capsys, "batch-size")
    _bad(["--data", tiny, "--resume"], capsys, "--checkpoint-dir")
    _bad(["--data", tiny, "--resume", "--checkpoint-dir", tmp_path / "none"], capsys,
         "cannot resume")
    (tmp_path / "empty").mkdir()
    _bad(["--data", tiny, "--resume", "--checkpoint-dir", tmp_path / "empty"], capsys,
         "no epoch_*.pt")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign / "epoch_0001.pt")
    _bad(["--data", tiny, "--resume", "--checkpoint-dir", foreign], capsys, "not an ooc checkpoint")
    (foreign / "epoch_0002.pt").write_bytes(b"garbage")
    _bad(["--data", tiny, "--resume", "--checkpoint-dir", foreign], capsys, "not an ooc checkpoint")
    ck = tmp_path / "ck"
    assert run(small_args(tiny, "--epochs", "1", "--checkpoint-dir", ck)) == 0
    capsys.readouterr()
    _bad(["--resume", "--checkpoint-dir", ck, "--hidden", "32"], capsys, "differs")


def test_partitions_beyond_the_nodes_names_partitions(tiny, tmp_path, capsys):
    """``--partitions 5000`` on a 400-node dataset once named ``--parts``, the partitioner's
    option the user never wrote; refused before anything is partitioned."""
    parts = tmp_path / "parts"
    _bad(["--data", tiny, "--workers", "1", "--partitions", "5000", "--partition-dir", parts],
         capsys, "--partitions 5000 exceeds the dataset's 400 nodes; give --partitions at "
                 "most 400")
    assert not parts.exists()


def test_subprocess_exit_code(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ooc.train", "--data", str(tmp_path / "nope")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "nope")


@pytest.mark.usefixtures("cora_raw")
def test_cora_acceptance(tmp_path):
    """The foundation issue's criterion: SAGE, fanouts 10,10, 50 epochs -> test_acc >= 0.78."""
    from ooc.prepare import main as prepare_main

    data = tmp_path / "cora"
    assert prepare_main(["planetoid", "--root", str(CORA_RAW.parent.parent), "--name", "Cora",
                         "--out", str(data), "--no-progress"]) == 0
    rep_path = tmp_path / "r.json"
    assert run(["--data", data, "--model", "sage", "--fanouts", "10,10", "--epochs", "50",
                "--eval-every", "10", "--report", rep_path]) == 0
    rep = json.loads(rep_path.read_text())
    assert rep["test_acc"] >= 0.78, rep["test_acc"]
