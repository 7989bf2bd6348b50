"""``python -m ooc.infer`` end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_one_line_error

from ooc.executor.inference.layerwise import read_embeddings
from ooc.executor.training.checkpoint import save_checkpoint
from ooc.executor.training.models import build_model
from ooc.infer import main


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


def test_corrupted_indices_is_one_line_not_a_signal(tmp_path):
    """An id out of range in a page of indices.bin the sampled checksum does not cover:
    the dataset opens, and ooc.infer ends with one line naming the file and position."""
    from ooc.storage import csc_from_edges, write_dataset
    from ooc.storage.dataset import sampled_pages

    rng = np.random.default_rng(0)
    n = 2000
    indptr, indices = csc_from_edges(rng.integers(0, n, 150_000), rng.integers(0, n, 150_000), n)
    path = write_dataset(tmp_path / "d", indptr, indices,
                         rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 3, n),
                         np.arange(100), np.arange(100, 200), np.arange(200, 300), num_classes=3)
    f = path / "indices.bin"
    sampled = set(sampled_pages(f.stat().st_size).tolist())
    page = next(p for p in range(1, f.stat().st_size // 4096) if p not in sampled)
    raw = np.fromfile(f, dtype=np.int32)
    pos = page * 1024 + 7
    raw[pos] = 2**31 - 1
    raw.tofile(f)
    ckpt = tmp_path / "m.pt"
    save_checkpoint(ckpt.parent / "ck", 1, build_model("sage", 8, 16, 3, 2))
    r = subprocess.run([sys.executable, "-m", "ooc.infer", "--data", str(path), "--checkpoint",
                        str(ckpt.parent / "ck"), "--out", str(tmp_path / "e.zarr"),
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert_one_line_error(r.stderr, "indices.bin", f"position {pos}")
    assert not (tmp_path / "e.zarr").exists()


def test_cli_layer_dtype_and_keep_layers(run, tmp_path):
    """``--layer-dtype float16 --keep-layers``: h1 kept as float16, the output float32;
    without ``--keep-layers`` h1 is gone and reading it says how to keep it."""
    path, a, model, ckpt = run
    base = ["--data", str(path), "--checkpoint", str(ckpt), "--memory-budget", "4GiB",
            "--chunk-rows", "64", "--no-progress", "--layer-dtype", "float16"]
    assert main(base + ["--out", str(tmp_path / "k.zarr"), "--keep-layers"]) == 0
    assert main(base + ["--out", str(tmp_path / "d.zarr")]) == 0
    assert read_embeddings(tmp_path / "k.zarr", "h1").dtype == np.float16
    h2 = read_embeddings(tmp_path / "d.zarr", "h2")
    assert h2.dtype == np.float32
    np.testing.assert_array_equal(h2, read_embeddings(tmp_path / "k.zarr", "h2"))
    with pytest.raises(ValueError, match="h1 was not kept"):
        read_embeddings(tmp_path / "d.zarr", "h1")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """A 300-node dataset, a SAGE checkpoint over it and ``ooc.infer``'s default output
    (every layer kept, blocks of 64 targets, so layer 2 reads layer 1's rows from its
    chunk files through the I/O backend)."""
    from conftest import random_graph

    from ooc.storage import csc_from_edges, write_dataset

    tmp = tmp_path_factory.mktemp("readers")
    n, d = 300, 24
    indptr, indices = csc_from_edges(*random_graph(n, 2400, seed=3), n)
    rng = np.random.default_rng(4)
    path = write_dataset(tmp / "d", indptr, indices, rng.standard_normal((n, d)).astype(np.float32),
                         rng.integers(0, 3, n), np.arange(100), np.arange(100, 200),
                         np.arange(200, 300), num_classes=3)
    torch.manual_seed(1)
    ckpt = save_checkpoint(tmp / "ck", 1, build_model("sage", d, 16, 3, num_layers=2))
    base = ["--data", str(path), "--checkpoint", str(ckpt), "--memory-budget", "4GiB",
            "--chunk-rows", "32", "--block-rows", "64", "--keep-layers", "--no-progress",
            "--aggregate", "blocks"]
    assert main(base + ["--out", str(tmp / "default.zarr")]) == 0
    return tmp, base


@pytest.mark.parametrize("option", [("--features", "direct"), ("--features", "mmap"),
                                    ("--io-backend", "io_uring"), ("--io-backend", "liburing"),
                                    ("--io-backend", "preadv"), ("--io-backend", "mmap"),
                                    ("--features", "mmap", "--aggregate", "streamed")])
def test_every_reader_choice_gives_the_default_embeddings(default_run, tmp_path, option):
    """Each ``--features`` / ``--io-backend`` choice runs end to end (``--features mmap``
    and ``--io-backend mmap`` crashed on the reader's counters) and writes the default
    path's embeddings bit for bit, counting the feature bytes it read."""
    from conftest import backend_or_skip

    tmp, base = default_run
    if option[0] == "--io-backend":
        backend_or_skip(option[1], tmp / "d" / "features.bin")
    out, rep = tmp_path / "o.zarr", tmp_path / "r.json"
    argv = base + ["--out", str(out), "--report", str(rep)] + list(option)
    if "streamed" in option:
        argv.remove("blocks")
        argv.remove("--aggregate")
    assert main(argv) == 0
    r = json.loads(rep.read_text())
    want = "mmap" if option[1] == "mmap" else "direct"
    assert r["feature_reader"].startswith(want), r["feature_reader"]
    assert r["layers"][0]["bytes_read"] >= 300 * 24 * 4
    for name in ("h1", "h2", "pred"):
        np.testing.assert_array_equal(read_embeddings(out, name),
                                      read_embeddings(tmp / "default.zarr", name))


def _main_fails(capsys, argv: list) -> str:
    """``main(argv)`` in this process: exit 2 and the one-line error, which it returns."""
    with pytest.raises(SystemExit) as ei:
        main([str(a) for a in argv])
    assert ei.value.code == 2
    return capsys.readouterr().err


def test_a_checkpoint_of_another_dataset_is_one_line(default_run, capsys):
    """A checkpoint of another feature width or class count, or reader options that
    contradict each other: one line naming both sides, before anything is written."""
    tmp, base = default_run
    data = tmp / "d"
    other = {"width": save_checkpoint(tmp / "ck16", 1, build_model("sage", 16, 16, 3, 2)),
             "classes": save_checkpoint(tmp / "ck7", 1, build_model("sage", 24, 16, 7, 2))}
    out = tmp / "bad.zarr"
    common = ["--data", data, "--out", out, "--no-progress"]
    for argv, needles in (
        (["--checkpoint", other["width"]], ("ck16", "model expects 16-dim features",
                                            "has 24")),
        (["--checkpoint", other["classes"]], ("ck7", "model predicts 7 classes", "has 3")),
        (base[2:4] + ["--features", "direct", "--io-backend", "mmap"],
         ("--io-backend mmap", "--features direct")),
        (base[2:4] + ["--features", "mmap", "--io-backend", "preadv"],
         ("--io-backend preadv", "--features mmap")),
        (base[2:4] + ["--layer-dtype", "garbage"], ("--layer-dtype", "garbage")),
        (base[2:4] + ["--memory-budget", "64MiB"], ("too small", "--memory-budget")),
        (base[2:4] + ["--order", "pds", "--partition", data / "train_idx.npy"],
         ("partition assignment has",)),
    ):
        assert_one_line_error(_main_fails(capsys, common + argv), *needles)
        assert not out.exists() and not (tmp / ".bad.zarr.partial").exists()


def test_aggregate_streamed_over_a_gcn_is_refused_before_a_pass(run, tmp_path, capsys,
                                                               monkeypatch):
    """``--aggregate streamed`` with a model whose layers cannot stream (GCN): one line
    before the pass over ``indices.bin`` (it used to come from the first layer)."""
    from ooc.storage.dataset import Dataset

    path, _, _, ckpt = run

    def no_pass(self):
        raise AssertionError("a pass over the graph before the options were checked")

    monkeypatch.setattr(Dataset, "check_indices", no_pass)
    err = _main_fails(capsys, ["--data", path, "--checkpoint", ckpt, "--out", tmp_path / "o.zarr",
                               "--aggregate", "streamed", "--no-progress"])
    assert_one_line_error(err, "--aggregate streamed: layer 1 cannot stream", "--aggregate auto")
