"""OGB raw-folder ingest on a tiny fixture written in OGB's layout."""
import gzip

import numpy as np
import pytest

from ooc.storage import OocError, csc_from_edges, open_dataset
from ooc.storage.ingest import ingest_ogb

N, D = 120, 7


def _gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


@pytest.fixture
def ogb(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "ogbn_tiny"
    s, d = rng.integers(0, N - 5, 900), rng.integers(0, N - 5, 900)   # last nodes isolated
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = rng.integers(0, 3, N).astype(float)
    y[:4] = np.nan
    _gz(root / "raw" / "edge.csv.gz", [f"{a},{b}" for a, b in zip(s, d, strict=True)])
    _gz(root / "raw" / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in x])
    _gz(root / "raw" / "node-label.csv.gz", ["nan" if np.isnan(v) else str(int(v)) for v in y])
    _gz(root / "raw" / "num-node-list.csv.gz", [str(N)])
    perm = rng.permutation(N)
    parts = {"train": perm[:60], "valid": perm[60:90], "test": perm[90:]}
    for k, ids in parts.items():
        _gz(root / "split" / "time" / f"{k}.csv.gz", [str(i) for i in ids])
    return root, dict(s=s, d=d, x=x, y=y, parts=parts)


@pytest.mark.parametrize("undirected", [False, True])
def test_round_trip(tmp_path, ogb, undirected):
    root, a = ogb
    out = ingest_ogb(root, tmp_path / "ds", undirected=undirected, progress=False,
                     buffer_bytes=8192)
    ds = open_dataset(out, verify=True)
    assert ds.num_nodes == N and ds.feature_dim == D
    s, d = a["s"], a["d"]
    if undirected:
        nl = s != d
        s, d = np.concatenate([s, d[nl]]), np.concatenate([d, s[nl]])
    ip, ind = csc_from_edges(s, d, N)
    np.testing.assert_array_equal(ds.indptr, ip)
    np.testing.assert_array_equal(np.asarray(ds.indices), ind)
    np.testing.assert_array_equal(ds.features.read(np.arange(N)), a["x"])
    y = np.where(np.isnan(a["y"]), -1, a["y"]).astype(np.int64)
    np.testing.assert_array_equal(ds.labels, y)
    np.testing.assert_array_equal(ds.train_idx, a["parts"]["train"])
    np.testing.assert_array_equal(ds.val_idx, a["parts"]["valid"])
    np.testing.assert_array_equal(ds.test_idx, a["parts"]["test"])
    assert ds.meta["directed"] is (not undirected)


def _fails(tmp_path, root, match):
    with pytest.raises(OocError, match=match) as ei:
        ingest_ogb(root, tmp_path / "ds", progress=False)
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "ds").exists()


def test_bad_inputs(tmp_path, ogb):
    root, a = ogb
    _fails(tmp_path, tmp_path / "nowhere", "nowhere: not found")
    raw = root / "raw"
    good_feat = (raw / "node-feat.csv.gz").read_bytes()
    (raw / "node-feat.csv.gz").write_bytes(good_feat[: len(good_feat) // 2])
    _fails(tmp_path, root, "node-feat.csv.gz: not a valid or a truncated gzip")
    _gz(raw / "node-feat.csv.gz", ["1,2,3,4,5,6,7"] * (N - 1))
    _fails(tmp_path, root, "node-feat.csv.gz: has 119 rows, the graph has 120 nodes")
    _gz(raw / "node-feat.csv.gz", ["1,2,3,4,5,6,7"] * 5 + ["1,2,3"])
    _fails(tmp_path, root, "node-feat.csv.gz: line 6: malformed")
    (raw / "node-feat.csv.gz").write_bytes(good_feat)
    _gz(raw / "edge.csv.gz", ["0,1", "3,500"])
    _fails(tmp_path, root, r"edge.csv.gz: line 2: node id out of range 500")
    _gz(raw / "edge.csv.gz", ["0,1", "3;4"])
    _fails(tmp_path, root, r"edge.csv.gz: line 2: malformed")
    _gz(raw / "edge.csv.gz", ["0,1"])
    _gz(root / "split" / "time" / "valid.csv.gz", ["1", "120"])
    _fails(tmp_path, root, r"valid.csv.gz: node id 120 out of range")
    _gz(root / "split" / "time" / "valid.csv.gz", ["1"])
    _gz(raw / "node-label.csv.gz", ["1"] * (N + 1))
    _fails(tmp_path, root, r"node-label.csv.gz: has 121 rows")
    (raw / "edge.csv.gz").unlink()
    _fails(tmp_path, root, "edge.csv.gz: not found")
