"""open_dataset: round trip and every bad-input case names the file."""
import json
import os
import shutil

import numpy as np
import pytest
from conftest import mapped_kib

from ooc.storage import DatasetError, DatasetWriter, OocError, csc_from_edges, open_dataset, write_dataset
from ooc.storage import writer as writer_mod
from ooc.storage.dataset import meta_checksum


def test_round_trip(small_dataset):
    path, a = small_dataset
    ds = open_dataset(path, verify=True)
    assert ds.num_nodes == 500 and ds.num_edges == len(a["indices"])
    np.testing.assert_array_equal(ds.indptr, a["indptr"])
    np.testing.assert_array_equal(ds.indices, a["indices"])
    ids = np.random.default_rng(0).integers(0, 500, 200)
    np.testing.assert_array_equal(ds.features.read(ids), a["features"][ids])
    np.testing.assert_array_equal(ds.labels, a["labels"])
    np.testing.assert_array_equal(ds.val_idx, a["val_idx"])
    assert ds.indices.dtype == np.int32 and ds.num_classes == 4
    np.testing.assert_array_equal(ds.in_degrees(), np.diff(a["indptr"]))
    np.testing.assert_array_equal(ds.out_degrees(), np.bincount(a["indices"], minlength=500))


def _corrupt(path, name, fn):
    p = path / name
    fn(p)
    with pytest.raises(DatasetError) as ei:
        open_dataset(path, verify=True)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_missing_folder(tmp_path):
    with pytest.raises(DatasetError, match="not a dataset folder"):
        open_dataset(tmp_path / "nope")


def test_missing_meta(small_dataset):
    path, _ = small_dataset
    msg = _corrupt(path, "meta.json", os.unlink)
    assert "meta.json" in msg and "missing" in msg


@pytest.mark.parametrize("name", ["indptr.npy", "indices.bin", "features.bin", "labels.npy",
                                  "train_idx.npy"])
def test_missing_file(small_dataset, name):
    path, _ = small_dataset
    msg = _corrupt(path, name, os.unlink)
    assert name in msg and "missing" in msg


@pytest.mark.parametrize("name", ["features.bin", "indices.bin", "indptr.npy", "labels.npy"])
def test_truncated_file(small_dataset, name):
    path, _ = small_dataset

    def trunc(p):
        with open(p, "r+b") as f:
            f.truncate(p.stat().st_size - 100)

    msg = _corrupt(path, name, trunc)
    assert name in msg and "truncated" in msg


def _edit_meta(path, **changes):
    mp = path / "meta.json"
    meta = json.loads(mp.read_text())
    meta.update(changes)
    mp.write_text(json.dumps(meta))


def test_unknown_version(small_dataset):
    path, _ = small_dataset
    _edit_meta(path, version=99)
    with pytest.raises(DatasetError, match="unknown format version 99"):
        open_dataset(path)


def test_foreign_meta(small_dataset):
    path, _ = small_dataset
    (path / "meta.json").write_text("<html>not json</html>")
    with pytest.raises(DatasetError, match="meta.json: not valid JSON"):
        open_dataset(path)
    (path / "meta.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(DatasetError, match="not an ooc dataset"):
        open_dataset(path)


def test_wrong_feature_dim(small_dataset):
    path, _ = small_dataset
    _edit_meta(path, feature_dim=65)
    with pytest.raises(DatasetError, match="meta.json: field 'row_bytes' is 256, but"):
        open_dataset(path)
    meta = json.loads((path / "meta.json").read_text())
    for key in ("row_bytes", "rows_per_page", "pages_per_row"):
        del meta[key]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="meta.json: lists features.bin with 131072 bytes"):
        open_dataset(path)


def _rewrite_npy(path, name, arr):
    """Replace a .npy and update its recorded size and checksum (a consistent
    but semantically wrong file)."""
    from ooc.storage.dataset import sha256_file

    np.save(path / name, arr)
    mp = path / "meta.json"
    meta = json.loads(mp.read_text())
    meta["files"][name] = {"bytes": (path / name).stat().st_size, "sha256": sha256_file(path / name)}
    mp.write_text(json.dumps(meta))


def test_non_monotone_indptr(small_dataset):
    path, a = small_dataset
    bad = a["indptr"].copy()
    bad[10], bad[11] = bad[11] + 1, bad[10]
    _rewrite_npy(path, "indptr.npy", bad)
    with pytest.raises(DatasetError, match="indptr.npy: not monotone"):
        open_dataset(path)


def test_indptr_end(small_dataset):
    path, a = small_dataset
    bad = a["indptr"].copy()
    bad[-1] -= 1
    _rewrite_npy(path, "indptr.npy", bad)
    with pytest.raises(DatasetError, match="indptr.npy: must start at 0 and end at num_edges"):
        open_dataset(path)


def test_edge_ids_out_of_range(small_dataset):
    path, _ = small_dataset
    mm = np.memmap(path / "indices.bin", dtype=np.int32, mode="r+")
    mm[7] = 500
    mm.flush()
    del mm
    with pytest.raises(DatasetError, match="indices.bin: checksum of sampled pages"):
        open_dataset(path)
    meta = json.loads((path / "meta.json").read_text())
    for key in ("sampled_sha256", "block_crc32"):
        del meta["files"]["indices.bin"][key]  # as written by an ooc without these checksums
    meta["checksum"] = meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    open_dataset(path)  # the recorded id range is trusted without a checksum
    with pytest.raises(DatasetError, match="indices.bin: node id 500 at position 7 is out of range"):
        open_dataset(path, verify=True)
    del meta["index_range"]
    meta["checksum"] = meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="indices.bin: node id 500 at position 7 is out of range"):
        open_dataset(path)  # written before ids were recorded: small files are scanned


def test_label_size_and_range(small_dataset):
    path, a = small_dataset
    _rewrite_npy(path, "labels.npy", a["labels"][:-1])
    with pytest.raises(DatasetError, match=r"labels.npy: shape is \(499,\)"):
        open_dataset(path)
    bad = a["labels"].copy()
    bad[0] = 4
    _rewrite_npy(path, "labels.npy", bad)
    with pytest.raises(DatasetError, match="labels.npy: label out of range"):
        open_dataset(path)


def test_split_out_of_range(small_dataset):
    path, a = small_dataset
    _rewrite_npy(path, "test_idx.npy", np.array([1, 2, 500]))
    with pytest.raises(DatasetError, match="test_idx.npy: node id out of range"):
        open_dataset(path)


def test_meta_without_its_checksum_is_refused(tmp_path):
    """A meta.json without its own checksum is refused: with it gone, an edit of any field
    goes unseen (here ``feature_order`` dropped: every node but one would read another
    node's row)."""
    from conftest import random_graph

    n = 3000
    src, dst = random_graph(n, 20 * n)
    x = np.arange(n * 8, dtype=np.float32).reshape(n, 8)
    path = write_dataset(tmp_path / "g", *csc_from_edges(src, dst, n), x, reorder="locality")
    assert not np.array_equal(open_dataset(path).row_of, np.arange(n))
    meta = json.loads((path / "meta.json").read_text())
    assert "feature_order" in meta  # rows stored in a locality order
    del meta["checksum"], meta["feature_order"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError) as ei:
        open_dataset(path)
    assert str(ei.value) == (f"{path}/meta.json: has no 'checksum' field (written by hand or "
                             f"by an older ooc, or edited); write the dataset again with "
                             f"ooc.prepare")
    assert isinstance(ei.value, ValueError)


def test_checksum_mismatch(small_dataset):
    path, a = small_dataset
    arr = np.load(path / "val_idx.npy")
    arr[0] = (arr[0] + 1) % 500
    np.save(path / "val_idx.npy", arr)  # same size, different bytes
    with pytest.raises(DatasetError, match="val_idx.npy: checksum"):
        open_dataset(path)


def test_writer_failure_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "ds"

    def full_disk(fd, off, n):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_mod.os, "posix_fallocate", full_disk)
    with pytest.raises(OocError, match="disk full"):
        write_dataset(out, np.array([0, 1, 1]), np.array([1]), np.zeros((2, 4), np.float32))
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_writer_exception_leaves_nothing(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with DatasetWriter(out, 3, 4) as w:
            w.write_indptr(np.array([0, 0, 0, 0]))
            raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_writer_refuses_existing(small_dataset):
    path, a = small_dataset
    with pytest.raises(OocError, match="already exists"):
        write_dataset(path, **a)
    write_dataset(path, overwrite=True, num_classes=4, **a)
    open_dataset(path, verify=True)


def test_float16_and_wide_rows(tmp_path):
    rng = np.random.default_rng(3)
    for dim, dt in ((5, np.float16), (2000, np.float32)):
        x = rng.standard_normal((50, dim)).astype(dt)
        p = write_dataset(tmp_path / f"d{dim}", np.zeros(51, np.int64), np.zeros(0, np.int64), x)
        ds = open_dataset(p, verify=True)
        assert ds.feature_dtype == dt
        np.testing.assert_array_equal(ds.features.read(np.arange(50)[::-1]), x[::-1])
        shutil.rmtree(p)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("dim,dtype", [(3, "float32"), (5, "float16"), (2000, "float32")])
@pytest.mark.parametrize("streamed", [0, 333, 1000])
def test_nonfinite_features_counted(tmp_path, dim, dtype, streamed):
    """NaN/inf counted as stored (float16 overflow included), whether the rows
    were passed to check_features while writing or read back at the end;
    against numpy's count on the stored dtype."""
    n = 1000
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[rng.integers(0, n, 7), rng.integers(0, dim, 7)] = np.nan
    x[999, 0] = np.inf
    x[400, dim - 1] = 1e6                      # finite in float32, inf in float16
    with np.errstate(over="ignore"):
        stored = x.astype(dtype)
    bad = ~np.isfinite(stored)
    with pytest.raises(OocError) as ei:
        with DatasetWriter(tmp_path / "d", n, dim, dtype) as w:
            w.write_indptr(np.zeros(n + 1, np.int64))
            w.check_features(0, x[:streamed])
            w.features()[0:n] = x
    first = int(np.argmax(bad.any(axis=1)))
    assert str(ei.value) == (f"features: {int(bad.sum())} feature values are NaN or infinite as "
                             f"{dtype} (first at node {first}); pass --allow-nonfinite to keep them")
    assert not (tmp_path / "d").exists() and list(tmp_path.iterdir()) == []
    with DatasetWriter(tmp_path / "d", n, dim, dtype, allow_nonfinite=True) as w:
        w.write_indptr(np.zeros(n + 1, np.int64))
        w.features()[0:n] = x
    assert open_dataset(tmp_path / "d").meta["nonfinite_features"] == int(bad.sum())


def test_atomic_dir_replace_rules(tmp_path):
    """overwrite replaces only what ``replaceable`` allows, leaves no temp
    behind, removes temps of dead processes and keeps those of live ones."""
    import subprocess
    import sys

    from ooc.storage.atomic import atomic_dir
    from ooc.storage.dataset import replace_problem

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "thesis.tex").write_text("x")
    with pytest.raises(FileExistsError, match="not an ooc dataset folder"):
        with atomic_dir(tmp_path / "user", overwrite=True, replaceable=replace_problem):
            pass
    (tmp_path / "f.txt").write_text("y")
    with pytest.raises(FileExistsError, match="not an ooc dataset folder"):
        with atomic_dir(tmp_path / "f.txt", overwrite=True, replaceable=replace_problem):
            pass
    assert (tmp_path / "user" / "thesis.tex").read_text() == "x"
    assert (tmp_path / "f.txt").read_text() == "y"
    from ooc.storage.ownership import mark

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (tmp_path / f".ds.tmp-{p.pid}-dead").mkdir()
    mark(tmp_path / f".ds.tmp-{p.pid}-dead", "output")          # a killed run's: removed
    (tmp_path / f".ds.tmp-{p.pid}-user").mkdir()                # no marker: a user's, kept
    (tmp_path / f".ds.tmp-{os.getpid()}-live").mkdir()
    for k in range(2):
        with atomic_dir(tmp_path / "ds", overwrite=True, replaceable=replace_problem) as t:
            (t / "meta.json").write_text(json.dumps({"format": "ooc-dataset", "k": k}))
        assert json.loads((tmp_path / "ds" / "meta.json").read_text())["k"] == k
    from ooc.storage.atomic import _umask

    assert (tmp_path / "ds").stat().st_mode & 0o777 == 0o777 & ~_umask()   # not mkdtemp's 0700
    assert sorted(q.name for q in tmp_path.iterdir()) == sorted([
        f".ds.tmp-{p.pid}-user", f".ds.tmp-{os.getpid()}-live", "ds", "f.txt", "user"])


def test_split_overlap_against_brute_force():
    """split_overlap reports an id in an earlier split, else a repeat in the same
    split, else None; against a plain-Python walk of the same rule."""
    from ooc.storage.dataset import split_overlap

    def brute(splits):
        seen: dict[int, int] = {}
        for i, s in enumerate(splits):
            for v in s.tolist():
                if v in seen:
                    return seen[v], i, v
            repeats = sorted(v for v in set(s.tolist()) if s.tolist().count(v) > 1)
            if repeats:
                return i, i, repeats[0]
            seen.update((v, i) for v in s.tolist())
        return None

    rng = np.random.default_rng(0)
    found = 0
    for _ in range(1000):
        splits = [rng.choice(20, rng.integers(0, 6)).astype(np.int64) for _ in range(3)]
        got = split_overlap(splits, 20)                  # the owner table
        assert got == brute(splits), splits
        assert split_overlap(splits, 10**6) == got, splits  # sorted ids (splits << N)
        found += got is not None
    assert 100 < found < 1000


def test_opening_a_dataset_keeps_its_node_arrays_out_of_memory(tmp_path):
    """indptr and labels stay on disk (memory-mapped, checked with plain reads): opening a
    4M-node dataset adds far less than their 64 MB to the process (a fresh one)."""
    import subprocess
    import sys

    n = 4_000_000
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, 100_000)
    indptr, indices = csc_from_edges(src, (src + 1) % n, n)
    ids = rng.permutation(n)[:40_000]
    path = write_dataset(tmp_path / "wide", indptr, indices, np.zeros((n, 1), np.float32),
                         rng.integers(0, 5, n), ids[:30_000], ids[30_000:35_000], ids[35_000:],
                         num_classes=5)
    code = ("import psutil, ooc; p = psutil.Process(); r = p.memory_info().rss; "
            f"ds = ooc.open_dataset({str(path)!r}); "
            "print((p.memory_info().rss - r) / 2**20)")
    grown = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout)
    assert grown < 16, f"opening took {grown:.0f} MiB"


def test_a_raw_dataset_folder_gets_the_command_that_converts_it(tmp_path):
    from pathlib import Path

    cora = Path(__file__).resolve().parents[2] / "shared/data/planetoid/Cora"
    cases = {"ogb_csv": ["raw/edge.csv.gz"], "ogb_npz": ["raw/data.npz", "split/time/train.csv.gz"],
             "igb": ["processed/paper/node_feat.npy"], "plain": ["notes.txt"]}
    for name, files in cases.items():
        for f in files:
            (tmp_path / name / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f).write_bytes(b"")
    hint = {"ogb_csv": f"raw OGB dataset: convert it with ooc.prepare ogb --root {tmp_path}/ogb_csv",
            "ogb_npz": f"raw OGB dataset: convert it with ooc.prepare ogb --root {tmp_path}/ogb_npz",
            "igb": f"IGB dataset: convert it with ooc.prepare igb --root {tmp_path}/igb"}
    for name in cases:
        with pytest.raises(DatasetError) as e:
            open_dataset(tmp_path / name)
        msg = str(e.value)
        assert msg.startswith(f"{tmp_path / name}/meta.json: missing (not an ooc dataset folder)")
        assert (hint[name] in msg) if name in hint else msg.endswith("folder)"), msg
    if cora.is_dir():  # the shared Planetoid files, as the README's quick start names them
        for where in (cora, cora / "raw"):
            with pytest.raises(DatasetError, match=f"ooc.prepare planetoid --root {cora.parent} "
                                                   f"--name Cora --out Cora-ooc"):
                open_dataset(where)


def test_read_labels_leaves_no_label_pages_resident(tmp_path):
    """Labels of random ids (an epoch's seeds, a batch's nodes) are numpy's, read by
    page (an EntryReader) without mapping the label file into the process."""
    n = 1 << 20  # 8 MiB of labels
    rng = np.random.default_rng(0)
    y = rng.integers(-1, 40, n)
    indptr, indices = csc_from_edges(np.arange(n), (np.arange(n) + 1) % n, n)
    path = write_dataset(tmp_path / "d", indptr, indices, np.zeros((n, 1), np.float32),
                         labels=y, num_classes=40, train_idx=np.arange(n // 2))
    ds = open_dataset(path)
    labels_file = os.path.realpath(path / "labels.npy")
    ids = rng.choice(n, 200_000, replace=False)
    np.testing.assert_array_equal(ds.read_labels(ids), y[ids])
    assert type(ds._entry_readers["labels.npy"]).__name__ == "EntryReader"
    assert mapped_kib(labels_file) == 0
    np.asarray(ds.labels[ids])  # the same read through the map stays resident
    assert mapped_kib(labels_file) > 4096


@pytest.mark.parametrize("labels,problem", [
    (np.array([0, 1, 2**64 - 1], np.uint64), "node 2: label 18446744073709551615 is not"),
    (np.array([0, -2, 1]), "node 1: label -2 is not"),
    (np.array([0.0, 1.5, 1.0]), "node 1: label 1.5 is not"),
    (np.array([0, 1, 1 << 20]), "node 2: label 1048576 is not"),
])
def test_labels_are_checked_in_their_own_dtype(tmp_path, labels, problem):
    """A uint64 2**64 - 1 once became -1 (unlabeled) in the cast to int64; every writer of
    labels (write_dataset, each ingest) checks them before it."""
    from ooc.core.errors import InvalidValue
    from ooc.storage import write_dataset

    indptr, indices = csc_from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)
    with pytest.raises(InvalidValue, match=rf"^labels: {problem} a class id in \[0, 1048576\) "
                                           r"nor -1 \(unlabeled\)$"):
        write_dataset(tmp_path / "ds", indptr, indices, np.zeros((3, 2), np.float32), labels)
    assert not (tmp_path / "ds").exists()
    ok = write_dataset(tmp_path / "ok", indptr, indices, np.zeros((3, 2), np.float32),
                       np.array([np.nan, 1.0, -1.0]))
    np.testing.assert_array_equal(open_dataset(ok).labels, [-1, 1, -1])
