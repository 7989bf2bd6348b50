"""OGB's binary raw layout (``raw/data.npz``, ``raw/node-label.npz``) as papers100M ships it:
stored and deflated members streamed, the result equal to the same arrays ingested in
memory; bad members refused in one line with nothing left behind."""
import gzip
import zipfile

import numpy as np
import pytest

from ooc.storage import OocError, csc_from_edges, open_dataset
from ooc.storage.ingest import ingest_ogb

N, D, E = 150, 6, 1200


def _gz(path, ids):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{i}\n" for i in ids))


def _write(root, compressed: bool, **override):
    rng = np.random.default_rng(1)
    a = dict(edge_index=np.stack([rng.integers(0, N - 4, E), rng.integers(0, N - 4, E)]),
             node_feat=rng.standard_normal((N, D)).astype(np.float32),
             num_nodes_list=np.array([N], dtype=np.int64))
    y = rng.integers(0, 4, N).astype(np.float64).reshape(N, 1)
    y[:10] = np.nan
    a.update({k: v for k, v in override.items() if k != "node_label"})
    save = np.savez_compressed if compressed else np.savez
    (root / "raw").mkdir(parents=True)
    save(root / "raw" / "data.npz", **{k: v for k, v in a.items() if v is not None})
    save(root / "raw" / "node-label.npz", node_label=override.get("node_label", y))
    perm = rng.permutation(N)
    parts = {"train": perm[:80], "valid": perm[80:110], "test": perm[110:]}
    for k, ids in parts.items():
        _gz(root / "split" / "time" / f"{k}.csv.gz", ids)
    return a, y[:, 0], parts


@pytest.mark.parametrize("compressed", [False, True])
def test_equals_the_arrays_in_memory(tmp_path, compressed):
    root = tmp_path / "papers"
    a, y, parts = _write(root, compressed)
    out = ingest_ogb(root, tmp_path / "ds", undirected=True, progress=False, buffer_bytes=4096)
    ds = open_dataset(out, verify=True)
    s, d = a["edge_index"]
    keep = s != d
    ip, ind = csc_from_edges(np.concatenate([s, d[keep]]), np.concatenate([d, s[keep]]), N)
    np.testing.assert_array_equal(ds.indptr, ip)
    np.testing.assert_array_equal(np.asarray(ds.indices), ind)
    np.testing.assert_array_equal(ds.features.read(np.arange(N)), a["node_feat"])
    np.testing.assert_array_equal(ds.labels, np.where(np.isnan(y), -1, y).astype(np.int64))
    np.testing.assert_array_equal(ds.train_idx, parts["train"])
    np.testing.assert_array_equal(ds.test_idx, parts["test"])
    assert ds.meta["source"]["layout"] == "npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "papers"]   # no scratch left


def test_labels_in_pieces_equal_labels_whole(tmp_path, monkeypatch):
    """Labels streamed a few at a time: the same dataset, and a bad label in a later piece
    named by its line."""
    from ooc.storage.ingest import ogb

    root = tmp_path / "papers"
    _, y, _ = _write(root, False)
    monkeypatch.setattr(ogb, "LABEL_CHUNK", 7)
    ds = open_dataset(ingest_ogb(root, tmp_path / "ds", progress=False))
    np.testing.assert_array_equal(ds.labels, np.where(np.isnan(y), -1, y).astype(np.int64))
    assert ds.num_classes == int(np.nanmax(y)) + 1
    bad = tmp_path / "bad"
    _write(bad, False, node_label=np.where(np.arange(N) == 100, -3.0, np.nan))
    with pytest.raises(OocError, match="line 101: label -3.0 is not a class id"):
        ingest_ogb(bad, tmp_path / "ds2", progress=False)


def test_memory_over_n_is_the_degree_counts_only(tmp_path, monkeypatch):
    """Python-side allocations (tracemalloc: numpy's) of an ingest of 2M nodes peak near
    the count pass's int64 degrees (16 MB): indptr and labels go to their files in pieces
    (whole, they were another 48 MB)."""
    import tracemalloc

    from ooc.storage.ingest import ogb

    n = 2_000_000
    root = tmp_path / "big"
    (root / "raw").mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(root / "raw" / "data.npz", edge_index=rng.integers(0, n, (2, 5000)),
             node_feat=np.ones((n, 1), np.float32), num_nodes_list=np.array([n]))
    np.savez(root / "raw" / "node-label.npz", node_label=rng.integers(0, 9, (n, 1)) * 1.0)
    monkeypatch.setattr(ogb, "LABEL_CHUNK", 1 << 16)
    tracemalloc.start()
    try:
        # the locality order's own 12 B/node: tests/test_reorder.py
        ingest_ogb(root, tmp_path / "ds", progress=False, buffer_bytes=4 << 20, reorder="none")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 16e6 <= peak < 32e6, peak / 1e6
    ds = open_dataset(tmp_path / "ds")
    assert ds.num_nodes == n and int(ds.indptr[-1]) == ds.num_edges


def test_stored_members_are_not_loaded_whole(tmp_path, monkeypatch):
    root = tmp_path / "papers"
    _write(root, False)

    load = np.load

    def refuse(path, *args, **kw):
        assert not str(path).endswith(".npz"), "np.load of an .npz"
        return load(path, *args, **kw)
    monkeypatch.setattr(np, "load", refuse)
    ingest_ogb(root, tmp_path / "ds", progress=False)


def _truncate_member(path, member):
    """Cut ``path`` (a stored .npz) inside ``member``'s data."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    raw = path.read_bytes()
    path.write_bytes(raw[:info.header_offset + 200])


@pytest.mark.parametrize("case,needle", [
    ("truncated", "truncated"),
    ("wrong_shape", "expected [2, E] or [E, 2]"),
    ("wrong_dtype", "expected integers"),
    ("no_edges_member", "has no array 'edge_index'"),
    ("feature_rows", "features have 140 rows"),
    ("missing_split", "valid.csv.gz"),
    ("bad_zip", "not a zip"),
    ("corrupt_deflate", "corrupt"),
    ("bad_label", "line 131: label 2.5 is not a class id"),
    ("label_shape", "labels have shape (150, 2)"),
    ("uint64_label", "line 18: label 18446744073709551615 is not a class id"),
    ("minus_two_label", "line 4: label -2 is not a class id"),
])
def test_bad_inputs_one_line_nothing_written(tmp_path, case, needle):
    root = tmp_path / "papers"
    over = {"wrong_shape": dict(edge_index=np.zeros((3, 10), np.int64)),
            "wrong_dtype": dict(edge_index=np.zeros((2, 10), np.float32)),
            "no_edges_member": dict(edge_index=None),
            "feature_rows": dict(node_feat=np.zeros((140, D), np.float32)),
            "bad_label": dict(node_label=np.where(np.arange(N) == 130, 2.5, 1.0)),
            "label_shape": dict(node_label=np.zeros((N, 2))),
            "uint64_label": dict(node_label=np.where(np.arange(N) == 17, np.uint64(2**64 - 1),
                                                     np.uint64(1))),
            "minus_two_label": dict(node_label=np.where(np.arange(N) == 3, -2, -1))
            }.get(case, {})
    _write(root, case == "corrupt_deflate", **over)
    data = root / "raw" / "data.npz"
    if case == "truncated":
        with zipfile.ZipFile(data) as zf:
            info = zf.getinfo("node_feat.npy")
        data.write_bytes(data.read_bytes()[:info.header_offset + 300])
    elif case == "missing_split":
        (root / "split" / "time" / "valid.csv.gz").unlink()
    elif case == "bad_zip":
        data.write_bytes(b"not a zip at all")
    elif case == "corrupt_deflate":
        with zipfile.ZipFile(data) as zf:
            info = zf.getinfo("node_feat.npy")
        raw = bytearray(data.read_bytes())
        mid = info.header_offset + 60 + info.compress_size // 2
        raw[mid:mid + 64] = bytes(64)
        data.write_bytes(bytes(raw))
    with pytest.raises(OocError) as e:
        ingest_ogb(root, tmp_path / "ds", progress=False)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["papers"]


def test_raw_folder_given_instead_of_its_parent(tmp_path):
    root = tmp_path / "papers"
    _write(root, False)
    with pytest.raises(OocError, match="pass its parent"):
        ingest_ogb(root / "raw", tmp_path / "ds", progress=False)
