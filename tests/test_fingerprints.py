"""Fingerprints of datasets and of what is derived from them: a corrupted page of
``indices.bin`` that the sampled checksum misses, a ``meta.json`` edited consistently,
and derived outputs (inference, partitions) of a dataset that changed since."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error

from ooc.core.errors import DatasetError
from ooc.storage import open_dataset
from ooc.storage.dataset import INDEX_BLOCK, sampled_pages
from ooc.storage.layout import PAGE

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["--fanouts", "4,4", "--batch-size", "64", "--hidden", "8", "--epochs", "1",
         "--no-progress", "--no-eval", "--device", "cpu"]


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def big_graph(tmp_path_factory) -> Path:
    """A graph whose indices.bin spans two checksum blocks and many unsampled pages."""
    from ooc.storage import csc_from_edges, write_dataset

    n, e = 20_000, 1_500_000
    rng = np.random.default_rng(3)
    indptr, indices = csc_from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    ids = rng.permutation(n)
    return write_dataset(tmp_path_factory.mktemp("fp") / "g", indptr, indices,
                         rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 3, n),
                         ids[:256], ids[256:320], ids[320:400], num_classes=3)


def _zero_unsampled_page(ds: Path) -> int:
    """Zero a page of indices.bin in the second checksum block that the sampled
    checksum does not read; returns its first id's position."""
    f = ds / "indices.bin"
    sampled = set(sampled_pages(f.stat().st_size).tolist())
    page = next(p for p in range(INDEX_BLOCK // PAGE + 1, f.stat().st_size // PAGE)
                if p not in sampled)
    raw = np.fromfile(f, dtype=np.int32)
    assert raw[page * PAGE // 4:(page + 1) * PAGE // 4].any()
    raw[page * PAGE // 4:(page + 1) * PAGE // 4] = 0  # ids 0: in range, wrong
    raw.tofile(f)
    return page * PAGE // 4


def test_zeroed_page_of_indices_stops_training_with_one_line(big_graph, tmp_path):
    ds = tmp_path / "g"
    subprocess.run(["cp", "-r", str(big_graph), str(ds)], check=True)
    meta = json.loads((ds / "meta.json").read_text())
    assert len(meta["files"]["indices.bin"]["block_crc32"]) >= 2
    _zero_unsampled_page(ds)
    open_dataset(ds)  # the cheap checks cannot see it
    with pytest.raises(DatasetError, match=r"indices.bin: ids 1048576\.\.\d+ \(bytes from 4194304\) "
                                           r"do not match their checksum"):
        open_dataset(ds, verify=True)
    for mode in ("ooc", "baseline"):
        p = _cli("ooc.train", "--data", str(ds), "--mode", mode, *TRAIN)
        assert p.returncode == 2, p.stdout + p.stderr
        assert_one_line_error(p.stderr, f"{ds}/indices.bin: ids 1048576..",
                              "do not match their checksum in meta.json")


def test_library_loader_refuses_a_zeroed_page(big_graph, tmp_path):
    import ooc

    ds = tmp_path / "g"
    subprocess.run(["cp", "-r", str(big_graph), str(ds)], check=True)
    _zero_unsampled_page(ds)
    with pytest.raises(DatasetError, match="do not match their checksum"):
        ooc.NodeLoader(ooc.open_dataset(ds), [4, 4], batch_size=64)


def test_meta_edited_consistently_is_refused(big_graph, tmp_path):
    ds = tmp_path / "g"
    subprocess.run(["cp", "-r", str(big_graph), str(ds)], check=True)
    mp = ds / "meta.json"
    meta = json.loads(mp.read_text())
    meta["num_classes"] += 3  # every field still consistent with the files
    mp.write_text(json.dumps(meta, indent=2))
    with pytest.raises(DatasetError, match=r"meta.json: was edited after the dataset was written"):
        open_dataset(ds)
    p = _cli("ooc.train", "--data", str(ds), *TRAIN)
    assert p.returncode == 2
    assert_one_line_error(p.stderr, f"{mp}: was edited after the dataset was written")


def test_partitions_of_an_older_dataset_are_made_again(tmp_path):
    from conftest import community_graph

    from ooc.executor.distributed import ensure_partitions

    data = community_graph(tmp_path / "g", n=300, seed=0)
    logs: list[str] = []
    parts = ensure_partitions(data, 2, None, log=logs.append)
    first = np.load(parts / "owner.npy")
    assert ensure_partitions(data, 2, None, log=logs.append) == parts and len(logs) == 2
    # the same path now holds another graph of the same shape
    community_graph(tmp_path / "other", n=300, seed=5)
    import shutil

    shutil.rmtree(data)
    shutil.move(tmp_path / "other", data)
    logs.clear()
    assert ensure_partitions(data, 2, None, log=logs.append) == parts
    assert "changed since" in logs[0], logs
    rec = json.loads((parts / "partition.json").read_text())
    assert rec["source_fingerprint"] == open_dataset(data).fingerprint()
    assert first.shape == np.load(parts / "owner.npy").shape


def test_damaged_partitions_are_made_again(tmp_path):
    """A partition folder is reused only when intact: partition.json matching its checksum,
    owner.npy its sha256, every partition opening; else it is partitioned again, the log
    line saying why."""
    from conftest import community_graph

    from ooc.executor.distributed import ensure_partitions

    data = community_graph(tmp_path / "g", n=300, seed=0)
    logs: list[str] = []
    parts = ensure_partitions(data, 2, None, log=logs.append)
    rec = json.loads((parts / "partition.json").read_text())
    assert len(rec["checksum"]) == 64 and len(rec["owner_sha256"]) == 64
    owner = np.load(parts / "owner.npy")

    def edit_owner():
        o = owner.copy()
        o[:2] = o[:2][::-1] if o[0] != o[1] else 1 - o[:2]  # another partition, in range
        np.save(parts / "owner.npy", o)

    def edit_record():
        r = json.loads((parts / "partition.json").read_text())
        r["p"], r["parts"] = 2, r["parts"][::-1]
        (parts / "partition.json").write_text(json.dumps(r))

    def edit_part():
        ids = np.load(parts / "part_001" / "val_idx.npy")
        np.save(parts / "part_001" / "val_idx.npy", ids[::-1].copy())

    for edit, why in ((edit_owner, f"{parts}/owner.npy does not match its checksum"),
                      (edit_record, f"{parts}/partition.json does not match its checksum"),
                      (edit_part, f"{parts}/part_001/val_idx.npy: checksum does not match")):
        edit()
        logs.clear()
        assert ensure_partitions(data, 2, None, log=logs.append) == parts
        assert logs[0].startswith(f"ooc.train: {why}"), logs
        np.testing.assert_array_equal(np.load(parts / "owner.npy"), owner)
        logs.clear()
        ensure_partitions(data, 2, None, log=logs.append)
        assert logs == []  # intact again: reused


def test_inference_output_of_changed_features_is_not_served(tmp_path):
    import torch
    from conftest import community_graph

    from ooc.executor.training.checkpoint import save_checkpoint
    from ooc.executor.training.models import build_model

    data = community_graph(tmp_path / "g", n=20_000)  # 157 pages of features
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 8, 16, 3, 2))
    out = tmp_path / "emb.zarr"
    args = ["--data", str(data), "--checkpoint", str(ck), "--out", str(out), "--no-progress"]
    assert _cli("ooc.infer", *args).returncode == 0
    import zarr

    before = np.asarray(zarr.open_group(str(out), mode="r")["h2"][:])
    assert _cli("ooc.infer", *args).returncode == 0  # the same run: the output is kept
    # a page of features the sampled checksum does not read is rewritten in place
    f = data / "features.bin"
    page = next(p for p in range(f.stat().st_size // PAGE)
                if p not in set(sampled_pages(f.stat().st_size).tolist()))
    x = np.memmap(f, dtype=np.float32, mode="r+")
    x[page * PAGE // 4:(page + 1) * PAGE // 4] *= -1
    x.flush()
    del x
    open_dataset(data)  # the cheap checks cannot see it
    p = _cli("ooc.infer", *args)
    assert p.returncode == 2
    assert_one_line_error(p.stderr, f"{out}: already exists and is not a finished run")
    p = _cli("ooc.infer", *args, "--overwrite")
    assert p.returncode == 0, p.stderr
    after = np.asarray(zarr.open_group(str(out), mode="r")["h2"][:])
    assert not np.allclose(before, after)


def _unsampled_page(f: Path) -> int:
    """A page of ``f`` that its sampled checksum does not read."""
    sampled = set(sampled_pages(f.stat().st_size).tolist())
    return next(p for p in range(f.stat().st_size // PAGE) if p not in sampled)


def test_fingerprint_sees_a_same_size_rewrite_with_its_mtime_restored(tmp_path):
    """The fingerprint leans on the inode change time, which no call can restore: a
    same-size rewrite of features.bin with its mtime put back still changes it."""
    import os

    from conftest import community_graph

    data = community_graph(tmp_path / "g", n=20_000)
    before = open_dataset(data).fingerprint()
    f = data / "features.bin"
    st = f.stat()
    page = _unsampled_page(f)
    x = np.memmap(f, dtype=np.float32, mode="r+")
    x[page * PAGE // 4:(page + 1) * PAGE // 4] += 1.0
    x.flush()
    del x
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    assert open_dataset(data).fingerprint() != before
    assert open_dataset(data).fingerprint() == open_dataset(data).fingerprint()


@pytest.mark.slow
def test_inference_output_is_not_reused_after_a_rewrite_with_the_mtime_restored(tmp_path):
    """ooc.infer's finished output is reused only for the same data: a same-size rewrite
    of the features with their mtime restored makes the next run refuse to call it
    finished (the output is made again with --overwrite, reading the features)."""
    import os

    import torch
    from conftest import community_graph

    from ooc.executor.training.checkpoint import save_checkpoint
    from ooc.executor.training.models import build_model

    data = community_graph(tmp_path / "g", n=20_000)
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 8, 16, 3, 2))
    out = tmp_path / "emb.zarr"
    args = ["--data", str(data), "--checkpoint", str(ck), "--out", str(out), "--no-progress"]
    assert _cli("ooc.infer", *args).returncode == 0
    f = data / "features.bin"
    st = f.stat()
    raw = bytearray(f.read_bytes())
    page = _unsampled_page(f)
    raw[page * PAGE:(page + 1) * PAGE] = np.full(PAGE // 4, 3.0, np.float32).tobytes()
    with open(f, "r+b") as fh:  # the same size, rewritten in place
        fh.write(bytes(raw))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    p = _cli("ooc.infer", *args)
    assert p.returncode == 2, p.stdout
    assert_one_line_error(p.stderr, f"{out}: already exists and is not a finished run")
