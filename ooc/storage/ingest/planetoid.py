"""PyG Planetoid raw files (``ind.<name>.x`` ...) to dataset format v1.

The raw files are read with PyG's own reader
(:func:`torch_geometric.io.planetoid.read_planetoid_data`), the same code
``torch_geometric.datasets.Planetoid`` runs, so node ids, the edge set,
features, labels and the public split are identical to it. The graph is
undirected (both directions present). The graphs are small (PubMed: 20k
nodes), so this converts in memory.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ooc.core.errors import InvalidValue, NotFound, OocError
from ooc.storage.ingest.edgelist import DEFAULT_BUFFER, check_out
from ooc.storage.link_split import LinkSplitSpec
from ooc.storage.writer import DatasetWriter, csc_from_edges

NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def raw_dir(root, name: str) -> Path:
    """``root/<name>/raw`` (PyG's layout); ``root`` itself if it holds the files."""
    root = Path(root)
    for cand in (root / name / "raw", root / NAMES.get(name.lower(), name) / "raw", root / "raw", root):
        if (cand / f"ind.{name.lower()}.x").exists():
            return cand
    return root / name / "raw"


def ingest_planetoid(root, name: str, out, overwrite: bool = False, progress: bool = True,
                     buffer_bytes: int | None = None, stats: dict | None = None,
                     allow_nonfinite: bool = False, reorder: str = "auto",
                     link_split: LinkSplitSpec | None = None) -> Path:
    """Convert Planetoid ``name`` (Cora, CiteSeer, PubMed) under ``root`` to ``out``
    (``link_split``: edges held out for link prediction, :mod:`ooc.storage.link_split`)."""
    t0 = time.perf_counter()
    out = check_out(out, overwrite, (root,))
    if name.lower() not in NAMES:
        raise InvalidValue(f"unknown Planetoid dataset {name!r} (one of Cora, CiteSeer, PubMed)")
    folder = raw_dir(root, name)
    prefix = name.lower()
    for suf in SUFFIXES:
        p = folder / f"ind.{prefix}.{suf}"
        if not p.is_file():
            raise NotFound(f"{p}: not found (expected PyG Planetoid raw files in {folder})")
    try:
        from torch_geometric.io.planetoid import read_planetoid_data

        data = read_planetoid_data(str(folder), prefix)
    except OocError:
        raise
    except Exception as e:  # pickle/numpy errors from truncated or foreign files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InvalidValue(f"{folder}/ind.{prefix}.*: cannot read Planetoid raw files "
                       f"({type(e).__name__}: {msg})") from None
    x = data.x.numpy().astype(np.float32, copy=False)
    y = data.y.numpy().astype(np.int64)
    n = x.shape[0]
    ei = data.edge_index.numpy()
    indptr, indices = csc_from_edges(ei[0], ei[1], n)
    train, val, test = (np.flatnonzero(m.numpy()).astype(np.int64)
                        for m in (data.train_mask, data.val_mask, data.test_mask))
    src = {"kind": "planetoid", "name": NAMES[prefix], "raw_dir": str(folder),
           "reader": "torch_geometric.io.planetoid.read_planetoid_data", "split": "public"}
    with DatasetWriter(out, n, x.shape[1], "float32", name=NAMES[prefix], directed=False,
                       overwrite=overwrite, source=src, allow_nonfinite=allow_nonfinite,
                       features_name=f"{folder}/ind.{prefix}.allx", reorder=reorder,
                       buffer_bytes=buffer_bytes or DEFAULT_BUFFER, link_split=link_split) as w:
        w.write_indptr(indptr)
        w.indices()[:] = indices
        w.check_features(0, x)
        w.features()[0:n] = x
        w.write_labels(y, int(y.max()) + 1)
        w.write_splits(train, val, test)
    if stats is not None:
        stats.update(num_nodes=n, num_edges=int(indptr[-1]), passes=1, windows=1,
                     time_s=time.perf_counter() - t0)
    return out
