"""A graph of papers100M's shape scaled by S, written in OGB's binary raw layout.

``write_ogb_binary(folder, shape)`` writes, streaming (memory O(N) for the labels and the id
permutation, plus one chunk)::

    folder/raw/data.npz          edge_index int64 [2, E], node_feat float32 [N, D],
                                 num_nodes_list int64 [1], num_edges_list int64 [1]
    folder/raw/node-label.npz    node_label float64 [N, 1], NaN where unlabeled
    folder/split/time/{train,valid,test}.csv.gz   node ids, one per line

as papers100M is distributed (``np.savez``'s layout: one ``.npy`` member per array; members
are stored, or deflated with ``compress=True``). The graph comes from the synthetic
generator's kernels (``ooc.storage.ingest``): R-MAT power-law degrees, many small communities
(``community_size``) hidden by a random permutation of the ids, a share ``p_in`` of the edges
inside a community, labels = community modulo the classes, features = the label's centroid
plus Gaussian noise (``noise`` per coordinate), so a GNN aggregating neighbours separates
classes that the features alone do not. Only the train/valid/test nodes are labelled, as in
papers100M (1.09% / 0.11% / 0.19% of the nodes).
"""
from __future__ import annotations

import gzip
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ooc.storage.ingest import _kernels as K
from ooc.storage.ingest.synthetic import SyntheticEdges, communities_of
from ooc.storage.ingest.synthetic import split_ids as synthetic_split_ids

PAPERS100M_NODES = 111_059_956
PAPERS100M_EDGES = 1_615_685_872


@dataclass(frozen=True)
class Shape:
    """The generated graph's parameters (sizes from papers100M's times ``scale``)."""

    scale: float
    nodes: int
    edges: int                      # directed edges in ``edge_index``; ingest stores both ways
    feature_dim: int = 128
    classes: int = 172
    fractions: tuple[float, float, float] = (0.0109, 0.0011, 0.0019)
    community_size: int = 128
    p_in: float = 0.7
    noise: float = 0.5
    seed: int = 0

    @classmethod
    def of(cls, scale: float, **kw) -> "Shape":
        return cls(scale=scale, nodes=max(1000, round(PAPERS100M_NODES * scale)),
                   edges=max(2000, round(PAPERS100M_EDGES * scale)), **kw)

    def raw_bytes(self) -> int:
        """Bytes the raw layout takes (stored members; labels and splits included)."""
        return 16 * self.edges + 4 * self.nodes * self.feature_dim + 8 * self.nodes + (1 << 20)


def _npy_member(zf: zipfile.ZipFile, name: str, shape: tuple[int, ...], dtype) -> BinaryIO:
    """An open zip member ``name.npy`` with its header written; the caller writes the data."""
    f = zf.open(name + ".npy", "w", force_zip64=True)
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})
    return f  # type: ignore[return-value]


def split_ids(shape: Shape) -> list[np.ndarray]:
    """int64 ids of the train, valid and test nodes: the synthetic generator's splits
    (a node's seeded uniform number falls in its split's share)."""
    return synthetic_split_ids(shape.nodes, shape.seed, shape.fractions)


def write_ogb_binary(folder: Path, shape: Shape, compress: bool = False,
                     chunk_edges: int = 1 << 22, chunk_rows: int = 1 << 16,
                     log=print) -> dict:
    """Write the graph under ``folder`` (``raw/``, ``split/time/``); returns facts about it
    (``features_only_acc``: validation accuracy of the nearest true centroid on the features
    alone, an upper bound for a model that ignores the edges)."""
    raw, split = folder / "raw", folder / "split" / "time"
    raw.mkdir(parents=True, exist_ok=True)
    split.mkdir(parents=True, exist_ok=True)
    n, e, d = shape.nodes, shape.edges, shape.feature_dim
    ncomm = communities_of(n, shape.classes, shape.community_size)
    source = SyntheticEdges(n, e, shape.classes, shape.p_in, shape.seed, communities=ncomm)
    labels = source.labels()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    rng = np.random.default_rng([shape.seed, 1])
    centroids = rng.standard_normal((shape.classes, d))
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    centroids = centroids.astype(np.float32)
    train, valid, test = split_ids(shape)
    is_val = np.zeros(n, dtype=bool)
    is_val[valid] = True
    correct = 0
    with zipfile.ZipFile(raw / "data.npz", "w", compression=method, compresslevel=1,
                         allowZip64=True) as zf:
        with _npy_member(zf, "edge_index", (2, e), np.int64) as f:
            for row in (0, 1):                      # all sources, then all targets (C order)
                log(f"edge_index row {row}: {e:,} edges")
                for src, dst, _, _ in source.chunks(chunk_edges, n):
                    f.write(memoryview(src if row == 0 else dst))
        log(f"node_feat: {n:,} x {d}")
        with _npy_member(zf, "node_feat", (n, d), np.float32) as f:
            for a in range(0, n, chunk_rows):
                b = min(n, a + chunk_rows)
                x = np.empty((b - a, d), dtype=np.float32)
                K.noisy_features(shape.seed, a, labels[a:b], centroids, np.float32(shape.noise), x)
                f.write(memoryview(x))
                v = is_val[a:b]
                if v.any():
                    guess = np.argmax(x[v] @ centroids.T, axis=1)
                    correct += int((guess == labels[a:b][v]).sum())
        for name, value in (("num_nodes_list", n), ("num_edges_list", e)):
            with _npy_member(zf, name, (1,), np.int64) as f:
                f.write(np.array([value], dtype=np.int64).tobytes())
    y = np.full((n, 1), np.nan, dtype=np.float64)
    for ids in (train, valid, test):
        y[ids, 0] = labels[ids]
    with zipfile.ZipFile(raw / "node-label.npz", "w", compression=method, allowZip64=True) as zf:
        with _npy_member(zf, "node_label", (n, 1), np.float64) as f:
            f.write(memoryview(y))
    for name, ids in (("train", train), ("valid", valid), ("test", test)):
        with gzip.open(split / f"{name}.csv.gz", "wb", compresslevel=1) as g:
            g.write(("\n".join(map(str, ids.tolist())) + "\n").encode())
    facts = {"shape": asdict(shape), "communities": ncomm, "compressed": compress,
             "splits": {"train": len(train), "valid": len(valid), "test": len(test)},
             "features_only_acc": round(correct / max(1, len(valid)), 4)}
    (folder / "bench_scale_graph.json").write_text(json.dumps(facts, indent=1))
    return facts


def written(folder: Path, shape: Shape, compress: bool) -> dict | None:
    """The facts of a graph already written under ``folder`` with these parameters, else None."""
    try:
        facts = json.loads((folder / "bench_scale_graph.json").read_text())
    except (OSError, ValueError):
        return None
    want = json.loads(json.dumps(asdict(shape)))
    if facts.get("shape") != want or facts.get("compressed") != compress:
        return None
    return facts
