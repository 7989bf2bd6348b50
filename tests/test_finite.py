"""Finite numbers in training: a non-finite loss or weights, or an exploding step, stops
the run with one line (CLI exit 2) and no checkpoint of that epoch; normal training
never trips the check; model averaging refuses a non-finite sum."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_line_error, community_graph

from ooc.executor.distributed.averaging import finish_average
from ooc.executor.training.finite import ExplodingUpdate, NonFiniteLoss, TrainingDiverged, UpdateWatch
from ooc.executor.training.trainer import TrainConfig, Trainer
from ooc.storage import csc_from_edges, open_dataset, write_dataset

REPO = Path(__file__).resolve().parents[1]
CLI = ["--fanouts", "5,5", "--batch-size", "64", "--hidden", "16", "--no-progress",
       "--device", "cpu", "--mode", "baseline"]


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=[5, 5], batch_size=64, hidden=16, epochs=1, progress=False,
                device="cpu", mode="baseline", eval_every=10**9, eval_final=False)
    return TrainConfig(**{**base, **kw})


def _train_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ooc.train", *CLI, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _poisoned(tmp_path, seed: int, degree: int, poison) -> tuple:
    """A 300-node, 8-feature, 3-class random graph of ``degree * n`` edges whose features
    ``poison(x)`` made non-finite; returns ``(path, indptr, indices)``."""
    n = 300
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, degree * n), rng.integers(0, n, degree * n)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    poison(x)
    idx = np.arange(n)
    data = write_dataset(tmp_path / "poisoned", indptr, indices, x, rng.integers(0, 3, n),
                         idx[:200], idx[200:250], idx[250:], num_classes=3,
                         allow_nonfinite=True)
    return data, indptr, indices


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    return community_graph(tmp_path_factory.mktemp("f") / "g", n=400)


def test_error_classes_are_builtin_arithmetic_errors():
    for cls in (TrainingDiverged, NonFiniteLoss, ExplodingUpdate):
        assert issubclass(cls, FloatingPointError) and issubclass(cls, ArithmeticError)


def test_growth_factor_matches_its_definition():
    torch.manual_seed(0)
    w = [torch.nn.Parameter(torch.randn(30, 4)), torch.nn.Parameter(torch.zeros(5))]
    watch = UpdateWatch(w)
    watch.start()
    before = [p.detach().numpy().astype(np.float64).copy() for p in w]
    with torch.no_grad():
        w[0].mul_(1.5)
        w[1].add_(0.25)
    after = [p.detach().numpy().astype(np.float64) for p in w]
    nb = np.array([np.linalg.norm(b) for b in before])
    na = np.array([np.linalg.norm(a) for a in after])
    rms = np.sqrt((nb ** 2).sum() / (30 * 4 + 5))
    floor = rms * np.sqrt([120.0, 5.0])
    want = ((na + floor) / (nb + floor)).max()
    assert float(watch.after_step()) == pytest.approx(want, rel=1e-5)
    with torch.no_grad():
        w[1][0] = float("nan")
    assert not np.isfinite(float(watch.after_step()))


def test_normal_training_never_trips_the_check(graph):
    for model in ("sage", "gcn", "gat"):
        with Trainer(open_dataset(graph), _cfg(model=model, epochs=8),
                     log=lambda m: None) as t:
            t.fit()
            growth = [r["max_weight_growth"] for r in t.history]
            assert all(1.0 <= g < 5 for g in growth), (model, growth)
            assert t.history[-1]["loss"] < t.history[0]["loss"]


def test_exploding_step_stops_fit_and_keeps_the_previous_checkpoint(graph, tmp_path):
    ck = tmp_path / "ck"
    with Trainer(open_dataset(graph), _cfg(epochs=1), log=lambda m: None) as t:
        t.fit(checkpoint_dir=ck)
        saved = (ck / "epoch_0001.pt").read_bytes()
        for group in t.optimizer.param_groups:
            group["lr"] = 50.0  # finite, but each step moves weights of ~0.1 by ~50
        with pytest.raises(ExplodingUpdate, match=r"the step of epoch 2, batch 1 of \d+ grew "
                                                  r"the weights [\d.e+]+x, above"):
            t.fit(epochs=2, checkpoint_dir=ck)
    assert sorted(p.name for p in ck.iterdir()) == ["epoch_0001.pt"]
    assert (ck / "epoch_0001.pt").read_bytes() == saved


def test_huge_lr_stops_the_cli_with_one_line_and_no_checkpoint(graph, tmp_path):
    ck = tmp_path / "ck"
    p = _train_cli("--data", str(graph), "--lr", "1e308", "--epochs", "1",
                   "--checkpoint-dir", str(ck))
    assert p.returncode == 2, p.stdout + p.stderr
    assert_one_line_error(p.stderr, "weights are not finite after the step of epoch 1, batch 1 of")
    assert not ck.exists() or not any(ck.iterdir())


def test_poisoned_feature_stops_the_cli_with_nan_loss(tmp_path):
    def poison(x):
        x[:, 0] = np.nan  # every row: the first batch's loss is NaN

    data, _, _ = _poisoned(tmp_path, 0, 8, poison)
    ck = tmp_path / "ck"
    p = _train_cli("--data", str(data), "--epochs", "1", "--checkpoint-dir", str(ck))
    assert p.returncode == 2, p.stdout + p.stderr
    assert_one_line_error(p.stderr, "training loss is nan at epoch 1, batch 1 of")
    assert not ck.exists() or not any(ck.iterdir())


def test_resumed_run_that_explodes_keeps_the_checkpoints_it_had(graph, tmp_path):
    ck = tmp_path / "ck"
    p = _train_cli("--data", str(graph), "--epochs", "1", "--checkpoint-dir", str(ck))
    assert p.returncode == 0, p.stderr
    saved = (ck / "epoch_0001.pt").read_bytes()
    # a limit that any step exceeds: epoch 2's first step stops the run
    p = _train_cli("--checkpoint-dir", str(ck), "--resume", "--epochs", "2",
                   "--max-weight-growth", "1.000001")
    assert p.returncode == 2, p.stdout + p.stderr
    assert_one_line_error(p.stderr, "the step of epoch 2, batch 1 of", "--max-weight-growth 1")
    assert sorted(f.name for f in ck.iterdir()) == ["epoch_0001.pt"]
    assert (ck / "epoch_0001.pt").read_bytes() == saved


@pytest.mark.slow
def test_diverged_worker_ends_the_distributed_run_with_exit_2(graph, tmp_path):
    ck = tmp_path / "ck"
    p = _train_cli("--data", str(graph), "--lr", "1e308", "--epochs", "1", "--workers", "2",
                   "--checkpoint-dir", str(ck))
    assert p.returncode == 2, p.stdout + p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert re.match(r"ooc: worker rank \d failed: exit code 2: .*weights are not finite after "
                    r"the step of epoch 1, batch 1 of", last), last
    assert not ck.exists() or not any(ck.iterdir())


def test_averaging_refuses_a_non_finite_sum():
    like = {"w": torch.zeros(3), "n": torch.zeros(1, dtype=torch.long)}
    ok = finish_average({"w": torch.tensor([2.0, 4.0, 6.0], dtype=torch.float64)}, 2.0, like)
    assert ok["w"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TrainingDiverged, match="w is not finite"):
        finish_average({"w": torch.tensor([1.0, float("nan"), 0.0], dtype=torch.float64)},
                       2.0, like)


def test_inference_names_the_first_node_whose_output_is_not_finite(tmp_path):
    from ooc.executor.training.checkpoint import save_checkpoint
    from ooc.executor.training.models import build_model

    def poison(x):
        x[137, 3] = np.inf  # node 137's own row; its out-neighbours see it from layer 1 on

    data, indptr, indices = _poisoned(tmp_path, 1, 6, poison)
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 8, 16, 3, 2))
    out = tmp_path / "emb.zarr"
    p = subprocess.run([sys.executable, "-m", "ooc.infer", "--data", str(data), "--checkpoint",
                        str(ck), "--out", str(out), "--no-progress"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    # the lowest node whose layer-1 output is non-finite: 137 itself (its root term),
    # or an earlier node with 137 among its in-neighbours
    feeders = [v for v in range(137) if 137 in indices[indptr[v]:indptr[v + 1]]]
    first = min(feeders + [137])
    assert_one_line_error(p.stderr, f"layer 1 of inference gives a non-finite output at node "
                                    f"{first} ")
    assert not out.exists()
