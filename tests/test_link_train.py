"""python -m ooc.train --task link: training, link metrics, checkpoints, ooc.infer."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import require_cora

from ooc import infer as infer_cli
from ooc import train as train_cli
from ooc.executor.inference.store import read_embeddings
from ooc.executor.training.link import (
    HITS_AT,
    DotDecoder,
    MLPDecoder,
    rank_metrics,
    score_pairs,
)
from ooc.prepare import main as prepare_main


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    """A synthetic community graph with a 10%/10% link split and 20 negatives each."""
    out = tmp_path_factory.mktemp("link") / "g"
    assert prepare_main(["synthetic", "--nodes", "600", "--avg-degree", "8", "--feature-dim",
                         "16", "--out", str(out), "--link-split", "0.1,0.1", "--num-neg", "20",
                         "--no-progress"]) == 0
    return out


def run(argv):
    return train_cli.main([str(a) for a in argv] + ["--no-progress"])


def small(data, *more):
    return ["--data", data, "--task", "link", "--fanouts", "5,5", "--batch-size", "256",
            "--hidden", "16", "--lr", "0.01", *more]


def test_rank_metrics_brute_force():
    rng = np.random.default_rng(0)
    pos = rng.standard_normal(40)
    neg = np.round(rng.standard_normal((40, 150)), 1)
    neg[3, :5] = pos[3] = 0.5  # ties
    m = rank_metrics(pos, neg)
    wins = sum((n < p) + 0.5 * (n == p) for p, row in zip(pos, neg, strict=True) for n in row)
    assert m["auc"] == pytest.approx(wins / neg.size)
    ranks = [1 + sum(n > p for n in row) + 0.5 * sum(n == p for n in row)
             for p, row in zip(pos, neg, strict=True)]
    assert m["mrr"] == pytest.approx(np.mean([1 / r for r in ranks]))
    for h in HITS_AT:
        assert m[f"hits@{h}"] == pytest.approx(np.mean([r <= h for r in ranks]))


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_train_link_report(linked, tmp_path, decoder):
    rep_path = tmp_path / "r.json"
    assert run(small(linked, "--epochs", "2", "--decoder", decoder, "--mode", "ooc",
                     "--report", rep_path)) == 0
    rep = json.loads(rep_path.read_text())
    for key in ("val_auc", "test_auc", "test_mrr", "test_hits@20", "test_hits@50",
                "test_hits@100"):
        assert 0.0 <= rep[key] <= 1.0, key
    assert rep["test_auc"] > 0.6  # learns something on a community graph
    assert [e["epoch"] for e in rep["epochs"]] == [1, 2]
    assert all(e["val_auc"] is not None for e in rep["epochs"])


def test_resume_and_infer_the_embeddings(linked, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(small(linked, "--epochs", "3", "--checkpoint-dir", full, "--report",
                     tmp_path / "a.json", "--mode", "baseline", "--decoder", "mlp")) == 0
    assert run(small(linked, "--epochs", "1", "--checkpoint-dir", part, "--mode", "baseline",
                     "--decoder", "mlp")) == 0
    assert run(["--checkpoint-dir", part, "--resume", "--epochs", "3", "--report",
                tmp_path / "b.json"]) == 0
    a, b = (json.loads((tmp_path / f"{k}.json").read_text()) for k in "ab")
    assert [e["loss"] for e in a["epochs"]] == [e["loss"] for e in b["epochs"]]
    assert a["test_auc"] == b["test_auc"]
    # ooc.infer on the link checkpoint writes the encoder's embeddings
    out = tmp_path / "emb"
    assert infer_cli.main(["--data", str(linked), "--checkpoint", str(full), "--out", str(out),
                           "--no-progress"]) == 0
    state = torch.load(sorted(full.iterdir())[-1], weights_only=True)
    from ooc.executor.training.checkpoint import model_from_checkpoint
    from ooc.executor.training.link import load_decoder
    from ooc.storage import open_dataset

    ds = open_dataset(linked)
    enc = model_from_checkpoint(state).eval()
    dec = load_decoder(state["extra"]["decoder"], 16)
    assert isinstance(dec, MLPDecoder)
    # the reference: the full graph's forward pass in memory
    x = torch.from_numpy(np.asarray(ds.features.read(np.arange(ds.num_nodes)), np.float32))
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    ei = torch.from_numpy(np.stack([np.asarray(ds.indices, np.int64), dst]))
    with torch.no_grad():
        h = enc(x, ei)
    emb = read_embeddings(out, "h2")
    np.testing.assert_allclose(emb, h.numpy(), rtol=1e-4, atol=1e-4)
    pos, _ = ds.link_split.edges("test")
    got = score_pairs(out, pos[0], pos[1], dec)
    with torch.no_grad():
        want = dec(h[pos[0]], h[pos[1]]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(score_pairs(out, pos[0], pos[1]),
                               DotDecoder()(h[pos[0]], h[pos[1]]).numpy(), rtol=1e-4, atol=1e-4)


def test_no_link_split_and_workers_refused(tmp_path, capsys):
    from conftest import community_graph

    g = community_graph(tmp_path / "g", n=200)
    assert run(small(g, "--epochs", "1", "--report", tmp_path / "r.json")) == 0
    assert "no link split" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run(small(g, "--workers", "2"))
    assert e.value.code == 2


def test_cora_link_auc_with_the_defaults(tmp_path):
    """The issue's number: Cora, 5%/10% held out, `--task link` with the defaults."""
    raw = require_cora()
    data = tmp_path / "cora"
    assert prepare_main(["planetoid", "--root", str(raw.parent.parent), "--name", "Cora",
                         "--out", str(data), "--link-split", "0.05,0.10", "--no-progress"]) == 0
    rep_path = tmp_path / "r.json"
    assert run(["--data", data, "--task", "link", "--report", rep_path]) == 0
    assert json.loads(rep_path.read_text())["test_auc"] >= 0.90


def test_edges_per_epoch_bounds_the_steps_and_one_pass_scores_the_last_epoch(linked, tmp_path, monkeypatch):
    from ooc.executor.training.link import LinkTrainer

    seen = []
    step = LinkTrainer._step

    def counting(self, data, *a):
        seen.append(len(data.input_id))
        return step(self, data, *a)

    passes = []
    embed = LinkTrainer.embed
    monkeypatch.setattr(LinkTrainer, "_step", counting)
    monkeypatch.setattr(LinkTrainer, "embed",
                        lambda self, *a, **k: passes.append(1) or embed(self, *a, **k))
    rep = tmp_path / "r.json"
    assert run(small(linked, "--epochs", "2", "--edges-per-epoch", "300",
                     "--mode", "baseline", "--report", rep)) == 0
    assert seen == [256, 44, 256, 44]       # 300 positives an epoch in batches of 256
    # each epoch's validation a pass; the final metrics score the last one's embeddings
    assert len(passes) == 2
    r = json.loads(rep.read_text())
    assert r["val_auc"] == r["epochs"][-1]["val_auc"] and 0 <= r["test_auc"] <= 1
