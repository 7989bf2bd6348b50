"""Edge-list ingest: every input format, the options, and every bad input."""
import errno
import os

import numpy as np
import pytest

from ooc.storage import OocError, csc_from_edges, open_dataset
from ooc.storage import reserve as reserve_mod
from ooc.storage.ingest import edge_buckets, ingest_edgelist
from ooc.storage.ingest.edge_buckets import MIN_WINDOWS
from ooc.storage.ingest.edgelist import NpyEdges

N = 300


def _edges(seed=0, n=N, e=2500):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, e), rng.integers(0, n, e)
    s[:20], d[:20] = s[20:40], d[20:40]  # duplicates
    s[40:45] = d[40:45]                  # self loops
    return s, d


def _reference(s, d, n, undirected=False, dedup=False, drop_self=False):
    if drop_self:
        keep = s != d
        s, d = s[keep], d[keep]
    if undirected:
        nl = s != d
        s, d = np.concatenate([s, d[nl]]), np.concatenate([d, s[nl]])
    if dedup:
        pairs = np.unique(np.stack([d, s], 1), axis=0)
        d, s = pairs[:, 0], pairs[:, 1]
    return csc_from_edges(s, d, n)


def _assert_csc(path, ref):
    ds = open_dataset(path, verify=True)
    np.testing.assert_array_equal(ds.indptr, ref[0])
    np.testing.assert_array_equal(np.asarray(ds.indices), ref[1])
    return ds


def _write_text(p, s, d, sep=" ", comment=True):
    with open(p, "w") as f:
        if comment:
            f.write("# an edge list\n\n")
        for a, b in zip(s, d, strict=True):
            f.write(f"{a}{sep}{b}\n")


@pytest.mark.parametrize("kind", ["text", "csv", "npy2E", "npyE2", "npyF", "bin32", "bin64", "gz"])
def test_formats_round_trip(tmp_path, kind):
    s, d = _edges()
    fmt = "auto"
    if kind == "text":
        p = tmp_path / "e.txt"
        _write_text(p, s, d, sep="\t")
    elif kind == "csv":
        p = tmp_path / "e.csv"
        _write_text(p, s, d, sep=",", comment=False)
    elif kind == "gz":
        import gzip
        p = tmp_path / "e.csv.gz"
        with gzip.open(p, "wt") as f:
            f.write("".join(f"{a},{b}\n" for a, b in zip(s, d, strict=True)))
    elif kind == "npy2E":
        p = tmp_path / "e.npy"
        np.save(p, np.stack([s, d]))
    elif kind == "npyE2":
        p = tmp_path / "e.npy"
        np.save(p, np.stack([s, d], 1).astype(np.int32))
    elif kind == "npyF":
        p = tmp_path / "e.npy"
        np.save(p, np.asfortranarray(np.stack([s, d])))
    else:
        dt = np.int32 if kind == "bin32" else np.int64
        p = tmp_path / "e.bin"
        np.stack([s, d], 1).astype(dt).tofile(p)
        fmt = kind
    out = ingest_edgelist(p, tmp_path / "ds", fmt=fmt, num_nodes=N, progress=False)
    ds = _assert_csc(out, _reference(s, d, N))
    assert ds.num_nodes == N and ds.feature_dim == 1
    assert np.all(ds.features.read(np.arange(N)) == 1)


@pytest.mark.parametrize("undirected,dedup,drop_self", [(True, False, False), (False, True, False),
                                                        (False, False, True), (True, True, True)])
# one window; two (the input scanned once a window); many (entries routed to a file each)
@pytest.mark.parametrize("buffer", [1 << 30, 24000, 2048])
def test_options_and_windows(tmp_path, undirected, dedup, drop_self, buffer):
    s, d = _edges(1)
    p = tmp_path / "e.npy"
    np.save(p, np.stack([s, d]))
    st = {}
    out = ingest_edgelist(p, tmp_path / "ds", undirected=undirected, dedup=dedup,
                          remove_self_loops=drop_self, buffer_bytes=buffer, progress=False, stats=st)
    n = int(max(s.max(), d.max())) + 1
    ds = _assert_csc(out, _reference(s, d, n, undirected, dedup, drop_self))
    assert ds.meta["directed"] is (not undirected)
    assert st["routed"] is (st["windows"] >= MIN_WINDOWS)
    assert st["passes"] == (2 if st["routed"] else 1 + st["windows"])
    if buffer == 2048:
        assert st["windows"] > 10 and st["routed"]
    if buffer == 24000 and undirected:
        assert st["windows"] == 2
    assert not list(out.glob(".edges-*"))


@pytest.mark.parametrize("undirected,dedup", [(True, False), (False, True)])
def test_routed_ranges_within_windows(tmp_path, monkeypatch, undirected, dedup):
    """Routing to many small target ranges per window gives the same dataset."""
    monkeypatch.setattr(edge_buckets, "RANGE_BYTES", 256)
    monkeypatch.setattr(edge_buckets, "RANGE_NODES", 7)
    s, d = _edges(4)
    p = tmp_path / "e.npy"
    np.save(p, np.stack([s, d]))
    st: dict = {}
    out = ingest_edgelist(p, tmp_path / "ds", num_nodes=N, undirected=undirected, dedup=dedup,
                          buffer_bytes=8192, progress=False, stats=st)
    assert st["routed"] and st["windows"] >= MIN_WINDOWS
    _assert_csc(out, _reference(s, d, N, undirected, dedup))


@pytest.mark.parametrize("routed", [False, True])
def test_source_changed_between_passes(tmp_path, monkeypatch, routed):
    """An input that changes after the count pass is refused by name, whether each window
    scans it or its entries are routed, and leaves no dataset and no bucket file."""
    s, d = _edges(3)
    p = tmp_path / "e.npy"
    np.save(p, np.stack([s, d]))
    chunks = NpyEdges.chunks
    calls = []

    def changing(self, chunk_edges, num_nodes):
        calls.append(1)
        for src, dst, first, nb in chunks(self, chunk_edges, num_nodes):
            if len(calls) > 1:  # after the count pass: one more edge into node 0
                dst = dst.copy()
                dst[0] = 0
            yield src, dst, first, nb
    monkeypatch.setattr(NpyEdges, "chunks", changing)
    with pytest.raises(OocError, match=r"e\.npy: changed between the count pass"):
        ingest_edgelist(p, tmp_path / "ds", num_nodes=N, buffer_bytes=2048 if routed else 24000,
                        progress=False)
    assert not (tmp_path / "ds").exists()
    assert not list(tmp_path.rglob(".edges-*"))


def test_features_labels_splits(tmp_path):
    s, d = _edges(2)
    np.save(tmp_path / "e.npy", np.stack([s, d]))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 50)).astype(np.float32)   # 50*4 bytes: rows share pages unevenly
    np.save(tmp_path / "x.npy", x)
    y = rng.integers(0, 5, N)
    y[:10] = -1
    np.save(tmp_path / "y.npy", y)
    mask = np.zeros(N, bool)
    mask[::3] = True
    np.save(tmp_path / "train.npy", mask)
    np.save(tmp_path / "val.npy", np.arange(1, 30, 3))
    np.save(tmp_path / "test.npy", np.arange(2, 30, 3).astype(np.int32))
    out = ingest_edgelist(tmp_path / "e.npy", tmp_path / "ds", features=tmp_path / "x.npy",
                          labels=tmp_path / "y.npy", train_idx=tmp_path / "train.npy",
                          val_idx=tmp_path / "val.npy", test_idx=tmp_path / "test.npy",
                          buffer_bytes=4096 * 16, progress=False)
    ds = open_dataset(out, verify=True)
    np.testing.assert_array_equal(ds.features.read(np.arange(N)), x)
    np.testing.assert_array_equal(ds.labels, y)
    assert ds.num_classes == 5
    np.testing.assert_array_equal(ds.train_idx, np.flatnonzero(mask))
    np.testing.assert_array_equal(ds.test_idx, np.arange(2, 30, 3))
    # float16 output and num_nodes taken from the features (isolated tail nodes kept)
    x2 = np.zeros((N + 7, 3), np.float16)
    np.save(tmp_path / "x2.npy", x2)
    ds2 = open_dataset(ingest_edgelist(tmp_path / "e.npy", tmp_path / "ds2", features=tmp_path / "x2.npy",
                                       progress=False))
    assert ds2.num_nodes == N + 7 and ds2.feature_dtype == np.float16


# -- bad input -------------------------------------------------------------------

def _fails(tmp_path, match, *args, **kwargs):
    kwargs.setdefault("progress", False)
    out = kwargs.pop("out", tmp_path / "ds")
    with pytest.raises(OocError, match=match) as ei:
        ingest_edgelist(*args, out=out, **kwargs)
    assert "\n" not in str(ei.value)
    assert not os.path.exists(out) or out == tmp_path / "exists"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds")]
    return str(ei.value)


def test_missing_file(tmp_path):
    msg = _fails(tmp_path, "not found", tmp_path / "nope.txt")
    assert "nope.txt" in msg


def test_malformed_text_names_line(tmp_path):
    p = tmp_path / "e.txt"
    p.write_text("0 1\n1 2\n# c\n2 x\n")
    assert "e.txt: line 4: malformed" in _fails(tmp_path, "malformed", p)
    p.write_text("0 1\n1 2 3\n")
    _fails(tmp_path, "line 2: malformed", p)
    p.write_text("0 1\n1.5 2\n")
    _fails(tmp_path, "line 2: malformed", p)


def test_negative_and_out_of_range(tmp_path):
    p = tmp_path / "e.txt"
    p.write_text("0 1\n-3 2\n")
    _fails(tmp_path, "line 2: negative node id -3", p)
    p.write_text("0 1\n1 2\n5 1\n")
    _fails(tmp_path, r"line 3: node id out of range 5", p, num_nodes=5)
    q = tmp_path / "e.npy"
    np.save(q, np.array([[0, 1, 9], [1, 2, 3]]))
    _fails(tmp_path, r"e.npy: edge 2: node id out of range \[0, 5\): 9", q, num_nodes=5)
    np.save(q, np.array([[0, -1], [1, 2]]))
    _fails(tmp_path, "e.npy: edge 1: negative node id", q)


def test_truncated_and_foreign_files(tmp_path):
    q = tmp_path / "e.npy"
    np.save(q, np.arange(2000).reshape(2, 1000))
    data = q.read_bytes()
    q.write_bytes(data[:-100])
    _fails(tmp_path, "e.npy: truncated", q)
    q.write_bytes(data[:50])
    _fails(tmp_path, "e.npy: not a .npy file", q)
    b = tmp_path / "e.bin"
    b.write_bytes(np.arange(7, dtype=np.int32).tobytes())
    _fails(tmp_path, "not a multiple of 8", b, fmt="bin32")
    png = tmp_path / "image.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    _fails(tmp_path, "image.png: looks binary", png)
    np.save(q, np.zeros((3, 4), np.int64))
    _fails(tmp_path, r"shape \(3, 4\)", q)
    np.save(q, np.zeros((2, 4), np.float32))
    _fails(tmp_path, "dtype float32", q)
    z = tmp_path / "e.gz"
    z.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    _fails(tmp_path, "e.gz: not a valid or a truncated gzip", z)


def test_wrong_shapes(tmp_path):
    s, d = _edges()
    np.save(tmp_path / "e.npy", np.stack([s, d]))
    np.save(tmp_path / "x.npy", np.zeros((N - 1, 4), np.float32))
    _fails(tmp_path, r"x.npy: features have 299 rows, the graph has 300 nodes", tmp_path / "e.npy",
           num_nodes=N, features=tmp_path / "x.npy")
    np.save(tmp_path / "x.npy", np.zeros(N, np.float32))
    _fails(tmp_path, "x.npy: features have shape", tmp_path / "e.npy", features=tmp_path / "x.npy")
    np.save(tmp_path / "y.npy", np.zeros(N + 1, np.int64))
    _fails(tmp_path, "y.npy: labels have 301 entries", tmp_path / "e.npy", num_nodes=N,
           labels=tmp_path / "y.npy")
    np.save(tmp_path / "y.npy", np.full(N, -2))
    _fails(tmp_path, "y.npy: node 0: label -2 is not a class id", tmp_path / "e.npy",
           num_nodes=N, labels=tmp_path / "y.npy")


def test_split_out_of_range(tmp_path):
    s, d = _edges()
    np.save(tmp_path / "e.npy", np.stack([s, d]))
    np.save(tmp_path / "t.npy", np.array([0, 5, N]))
    _fails(tmp_path, r"t.npy: node id 300 out of range \[0, 300\)", tmp_path / "e.npy", num_nodes=N,
           train_idx=tmp_path / "t.npy")
    np.save(tmp_path / "t.npy", np.zeros(N - 1, bool))
    _fails(tmp_path, "t.npy: boolean mask has shape", tmp_path / "e.npy", num_nodes=N,
           test_idx=tmp_path / "t.npy")


def test_existing_output_refused_unless_overwrite(tmp_path):
    s, d = _edges()
    np.save(tmp_path / "e.npy", np.stack([s, d]))
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "keep").write_text("x")
    _fails(tmp_path, "exists: already exists", tmp_path / "e.npy", out=tmp_path / "exists")
    _fails(tmp_path, "exists: exists and is not an ooc dataset folder", tmp_path / "e.npy",
           out=tmp_path / "exists", overwrite=True)
    assert (tmp_path / "exists" / "keep").read_text() == "x"
    ingest_edgelist(tmp_path / "e.npy", tmp_path / "ds", progress=False)
    ingest_edgelist(tmp_path / "e.npy", tmp_path / "ds", overwrite=True, undirected=True,
                    progress=False)
    assert open_dataset(tmp_path / "ds").num_edges == 2 * len(s) - int((s == d).sum())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "e.npy", "exists"]


@pytest.mark.parametrize("where", ["allocate", "pwrite"])
def test_full_disk(tmp_path, monkeypatch, where):
    s, d = _edges()
    np.save(tmp_path / "e.npy", np.stack([s, d]))

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "allocate":
        monkeypatch.setattr(reserve_mod.os, "posix_fallocate", enospc)
    else:
        from ooc.storage.ingest import edgelist
        monkeypatch.setattr(edgelist.os, "pwrite", enospc)
    msg = _fails(tmp_path, "disk full", tmp_path / "e.npy")
    assert "ds" in msg
