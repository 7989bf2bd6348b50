"""IGB's .npy files (node_feat [N, D], edge_index [E, 2], node_label_19 [N]) ingest through
the chunked edge-list path; the labelled nodes are split at random with a seed."""
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, assert_one_line_error

from ooc.storage import OocError, csc_from_edges, open_dataset
from ooc.storage.ingest import ingest_igb

N, D, E = 300, 5, 2000


@pytest.fixture
def igb(tmp_path):
    rng = np.random.default_rng(2)
    root = tmp_path / "igb" / "small" / "processed"
    (root / "paper").mkdir(parents=True)
    (root / "paper__cites__paper").mkdir()
    x = rng.standard_normal((N, D)).astype(np.float32)
    ei = np.stack([rng.integers(0, N, E), rng.integers(0, N, E)], axis=1)   # [E, 2]
    y = rng.integers(0, 19, N).astype(np.float32)
    y[:30] = np.nan
    np.save(root / "paper" / "node_feat.npy", x)
    np.save(root / "paper__cites__paper" / "edge_index.npy", ei)
    np.save(root / "paper" / "node_label_19.npy", y)
    return tmp_path / "igb", x, ei, y


def test_equals_the_arrays(igb, tmp_path):
    root, x, ei, y = igb
    ds = open_dataset(ingest_igb(root, tmp_path / "ds", progress=False, buffer_bytes=4096),
                      verify=True)
    indptr, indices = csc_from_edges(ei[:, 0], ei[:, 1], N)
    np.testing.assert_array_equal(ds.indptr, indptr)
    np.testing.assert_array_equal(np.asarray(ds.indices), indices)
    np.testing.assert_array_equal(ds.features.read(np.arange(N)), x)
    np.testing.assert_array_equal(ds.labels, np.where(np.isnan(y), -1, y).astype(np.int64))
    parts = [ds.train_idx, ds.val_idx, ds.test_idx]
    allp = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(allp), np.flatnonzero(~np.isnan(y)))   # labelled only
    assert [len(p) for p in parts] == [162, 54, 54]                              # 60/20/20 of 270
    again = open_dataset(ingest_igb(root, tmp_path / "ds2", progress=False))
    np.testing.assert_array_equal(again.train_idx, ds.train_idx)                 # seeded


def test_cli_and_bad_inputs(igb, tmp_path):
    root, *_ = igb
    r = subprocess.run([sys.executable, "-m", "ooc.prepare", "igb", "--root", str(root), "--out",
                        str(tmp_path / "ds"), "--label", "2K"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "node_label_2K.npy")
    assert not (tmp_path / "ds").exists()
    (root / "small" / "processed" / "paper" / "node_feat.npy").write_bytes(b"\x93NUMPY trunc")
    with pytest.raises(OocError, match="node_feat.npy"):
        ingest_igb(root, tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()


def test_a_label_that_is_no_class_id_is_refused(igb, tmp_path):
    """IGB's float labels: NaN is unlabeled, an infinity or a fraction is named with its
    node; nothing is written."""
    from ooc.core.errors import InvalidValue

    root, *_ = igb
    path = root / "small" / "processed" / "paper" / "node_label_19.npy"
    y = np.load(path)
    y[40] = np.inf
    np.save(path, y)
    with pytest.raises(InvalidValue, match=r"node_label_19.npy: node 40: label inf is not a "
                                           r"class id in \[0, 1048576\) nor -1 \(unlabeled\)"):
        ingest_igb(root, tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
