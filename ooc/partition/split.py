"""Per-partition datasets (SDT-GNN §III-B "node-feature file partitioning").

Partition ``q`` is written as a dataset folder ``part_{q:03d}`` in the
format of :mod:`ooc.storage` with *local* ids:

* local ids ``0 .. n_owned-1`` are the owned nodes in ascending global id,
  then ``n_owned .. n_owned+n_replicas-1`` the replicas in ascending global
  id; ``global_ids.npy`` (int64 [n_q]) maps local to global ids;
* the CSC holds the full in-neighbour list of every owned node (in the
  source's order) and an empty list for every replica: replicas are only
  inputs;
* ``labels.npy`` keeps the labels of owned nodes; replicas get -1;
* ``train/val/test_idx.npy`` are the source splits restricted to owned nodes,
  in local ids (source order kept);
* features are copied through a memory map of the source ``features.bin``
  in chunks of rows; mapped pages are released after each chunk so the
  resident set stays bounded;
* ``meta.json`` gets a ``partition`` entry: part, parts, algo, num_owned,
  num_replicas.

Memory: ``O(|V|)`` (owner, a global-to-local scratch array, the id lists of
one partition) plus one chunk of edges and one chunk of feature rows.
The edge stream is read once per partition (each pass keeps the edges whose
destination the partition owns), so the split costs ``p`` sequential passes.
"""
from __future__ import annotations

import mmap as _mmap
from pathlib import Path

import numpy as np

from ..storage import Dataset, DatasetWriter
from ._kernels import local_chunk, replicas_of
from .base import progress_bar
from .edges import DEFAULT_CHUNK_EDGES, EdgeStream

#: Bytes of feature rows copied per chunk.
FEATURE_CHUNK_BYTES = 64 << 20


def part_name(q: int) -> str:
    return f"part_{q:03d}"


def _release(arr) -> None:
    """Flush a memmap and drop its pages from this process's resident set."""
    if not isinstance(arr, np.memmap):
        return
    mm = getattr(arr, "_mmap", None)
    if mm is None:
        return
    arr.flush()
    try:
        mm.madvise(_mmap.MADV_DONTNEED)
    except (AttributeError, OSError, ValueError):
        pass


def write_partition(dataset: Dataset, owner: np.ndarray, bits: np.ndarray, q: int, parts: int,
                    out: Path, g2l: np.ndarray, algo: str = "",
                    chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: bool = False) -> dict:
    """Write partition ``q`` to ``out`` (a new folder); returns its summary."""
    owned = np.flatnonzero(owner == q).astype(np.int64)
    reps = replicas_of(bits, q)
    n_own, n_rep = owned.size, reps.size
    gids = np.concatenate([owned, reps])
    nq = gids.size
    g2l[gids] = np.arange(nq, dtype=g2l.dtype)
    indptr_src = dataset.indptr
    local_deg = np.zeros(nq, dtype=np.int64)
    local_deg[:n_own] = indptr_src[owned + 1] - indptr_src[owned]
    indptr = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(local_deg, out=indptr[1:])
    eq = int(indptr[-1])
    src_meta = dataset.meta
    with DatasetWriter(out, nq, dataset.feature_dim, dataset.layout.dtype,
                       name=f"{src_meta.get('name', '')}-{part_name(q)}",
                       directed=bool(src_meta.get("directed", True)),
                       source={"partition_of": str(dataset.path)}) as w:
        w.extra_meta["partition"] = {"part": q, "parts": parts, "algo": algo,
                                     "num_owned": int(n_own), "num_replicas": int(n_rep)}
        w.write_indptr(indptr)
        ind = w.indices()
        if eq:
            stream = EdgeStream(dataset, chunk_edges=chunk_edges)
            pos = 0
            with progress_bar(dataset.num_edges, f"split {part_name(q)}: edges", progress) as bar:
                for ch in stream:
                    pos = local_chunk(stream.indptr, ch.a, ch.first_dst, ch.src, owner, q, g2l,
                                      ind, pos)
                    _release(ind)
                    bar.update(ch.b - ch.a)
            if pos != eq:
                raise RuntimeError(f"{part_name(q)}: wrote {pos} edges, expected {eq}")
        # features through a memmap of the source file, in chunks of rows
        feats = dataset.features
        dst_view = w.features()
        rows = max(1, FEATURE_CHUNK_BYTES // max(1, dataset.layout.row_bytes))
        for a in range(0, nq, rows):
            b = min(nq, a + rows)
            dst_view[a:b] = feats.read(gids[a:b])
            _release(feats._mm)
            _release(w._features)
        labels = np.full(nq, -1, dtype=np.int64)
        labels[:n_own] = np.asarray(dataset.labels[owned])
        w.write_labels(labels, dataset.num_classes)
        splits = []
        for ids in (dataset.train_idx, dataset.val_idx, dataset.test_idx):
            ids = np.asarray(ids, dtype=np.int64)
            ids = ids[owner[ids] == q]
            splits.append(g2l[ids].astype(np.int64))
        w.write_splits(*splits)
        np.save(w.tmp / "global_ids.npy", gids)
        summary = {"part": q, "path": part_name(q), "owned": int(n_own), "replicas": int(n_rep),
                   "nodes": int(nq), "edges": eq,
                   "train": int(splits[0].size), "val": int(splits[1].size),
                   "test": int(splits[2].size)}
    g2l[gids] = -1
    return summary
