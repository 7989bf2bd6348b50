"""Planetoid ingest equals torch_geometric.datasets.Planetoid on the same raw files."""
import shutil
from pathlib import Path

import numpy as np
import pytest

from ooc.storage import OocError, open_dataset
from ooc.storage.ingest import ingest_planetoid

SHARED = Path(__file__).resolve().parents[2] / "shared"
PLANETOID = SHARED / "data" / "planetoid"
CORA_RAW = PLANETOID / "Cora" / "raw"

# fails with a clear message (conftest.require_cora) when ../shared is absent
needs_cora = pytest.mark.usefixtures("cora_raw")


@needs_cora
def test_cora_identical_to_pyg(tmp_path):
    from torch_geometric.datasets import Planetoid

    copy = tmp_path / "pyg"
    shutil.copytree(CORA_RAW, copy / "Cora" / "raw")
    ref = Planetoid(root=str(copy), name="Cora")[0]

    out = ingest_planetoid(PLANETOID, "Cora", tmp_path / "cora", progress=False)
    ds = open_dataset(out, verify=True)
    n = ref.num_nodes
    assert ds.num_nodes == n == 2708 and ds.num_edges == ref.num_edges
    # same edge set, as CSC in-neighbour lists
    ei = ref.edge_index.numpy()
    for v in range(0, n, 7):
        mine = np.sort(np.asarray(ds.indices[ds.indptr[v]:ds.indptr[v + 1]]))
        theirs = np.sort(ei[0][ei[1] == v])
        np.testing.assert_array_equal(mine, theirs)
    dst = np.repeat(np.arange(n), ds.in_degrees())
    mine = set(zip(np.asarray(ds.indices).tolist(), dst.tolist(), strict=True))
    assert mine == set(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    assert ds.meta["directed"] is False
    x = ds.features.read(np.arange(n))
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, ref.x.numpy())
    np.testing.assert_array_equal(ds.labels, ref.y.numpy())
    assert ds.num_classes == 7
    for mine, mask in ((ds.train_idx, ref.train_mask), (ds.val_idx, ref.val_mask),
                       (ds.test_idx, ref.test_mask)):
        np.testing.assert_array_equal(mine, np.flatnonzero(mask.numpy()))
    assert len(ds.train_idx) == 140 and len(ds.val_idx) == 500 and len(ds.test_idx) == 1000


@needs_cora
def test_truncated_raw_file(tmp_path):
    raw = tmp_path / "P" / "Cora" / "raw"
    shutil.copytree(CORA_RAW, raw)
    data = (raw / "ind.cora.allx").read_bytes()
    (raw / "ind.cora.allx").write_bytes(data[: len(data) // 2])
    with pytest.raises(OocError, match="cannot read Planetoid raw files") as ei:
        ingest_planetoid(tmp_path / "P", "Cora", tmp_path / "out", progress=False)
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_missing_raw_files(tmp_path):
    (tmp_path / "Cora" / "raw").mkdir(parents=True)
    with pytest.raises(OocError, match=r"ind.cora.x: not found"):
        ingest_planetoid(tmp_path, "Cora", tmp_path / "out", progress=False)
    with pytest.raises(OocError, match="unknown Planetoid dataset"):
        ingest_planetoid(tmp_path, "Karate", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
