"""``python -m ooc.infer`` end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ooc.executor.checkpoint import save_checkpoint
from ooc.executor.inference import read_embeddings
from ooc.executor.models import build_model
from ooc.infer import main

from conftest import assert_one_line_error


@pytest.fixture
def run(small_dataset, tmp_path):
    path, arrays = small_dataset
    torch.manual_seed(0)
    model = build_model("gcn", 64, 16, 4, num_layers=2)
    ckpt = save_checkpoint(tmp_path / "ckpt", 1, model)
    return path, arrays, model.eval(), ckpt


def test_cli_writes_layers_report_and_predictions(run, tmp_path):
    path, a, model, ckpt = run
    out, rep = tmp_path / "emb.zarr", tmp_path / "r.json"
    owner = (np.arange(500) % 3).astype(np.int64)
    np.save(tmp_path / "owner.npy", owner)
    rc = main(["--data", str(path), "--checkpoint", str(ckpt), "--out", str(out),
               "--memory-budget", "4GiB", "--report", str(rep), "--chunk-rows", "64",
               "--partition", str(tmp_path / "owner.npy"), "--no-progress"])
    assert rc == 0
    r = json.loads(rep.read_text())
    assert r["order"] == "pds" and r["num_chunks"] == 8 and r["within_budget"]
    assert r["peak_rss_bytes"] <= 4 << 30
    dst = np.repeat(np.arange(500), np.diff(a["indptr"]))
    ei = torch.from_numpy(np.stack([a["indices"], dst]))
    with torch.no_grad():
        ref = model(torch.from_numpy(a["features"]), ei).numpy()
    assert np.abs(read_embeddings(out, "h2") - ref).max() < 1e-4
    pred = ref.argmax(1)
    assert r["test_accuracy"] == pytest.approx(float((pred[a["test_idx"]] ==
                                                      a["labels"][a["test_idx"]]).mean()))
    np.testing.assert_array_equal(read_embeddings(out, "pred"), pred)
    # same command again: resumed, nothing recomputed
    rc = main(["--data", str(path), "--checkpoint", str(ckpt), "--out", str(out),
               "--memory-budget", "4GiB", "--report", str(rep), "--chunk-rows", "64",
               "--partition", str(tmp_path / "owner.npy"), "--no-progress"])
    assert rc == 0 and json.loads(rep.read_text())["resumed_chunks"] == 16


def test_cli_bad_input_is_one_line(run, tmp_path):
    path, _, _, ckpt = run
    base = [sys.executable, "-m", "ooc.infer", "--out", str(tmp_path / "o.zarr")]
    for extra, msg in (
        (["--data", str(tmp_path / "nope"), "--checkpoint", str(ckpt)], "not a dataset"),
        (["--data", str(path), "--checkpoint", str(tmp_path / "x.pt")], "not found"),
        (["--data", str(path), "--checkpoint", str(ckpt), "--memory-budget", "16MiB"], "too small"),
        (["--data", str(path), "--checkpoint", str(ckpt), "--order", "pds"], "partitioning"),
    ):
        p = subprocess.run(base + extra, capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        assert_one_line_error(p.stderr, msg)
