"""OGB node-property raw folders to dataset format v1, streamed.

Layout read (as downloaded by ``ogb`` for e.g. ``ogbn-arxiv``)::

    ROOT/raw/edge.csv.gz             src,dst per line (the ogbn graphs are directed)
    ROOT/raw/node-feat.csv.gz        N lines of D comma-separated floats
    ROOT/raw/node-label.csv.gz       N lines, one label (nan: unlabeled)
    ROOT/raw/num-node-list.csv.gz    optional: N
    ROOT/split/<name>/{train,valid,test}.csv.gz   node ids, one per line

The gzipped CSVs are decompressed in blocks: edges go through the edge-list
count/scatter passes, features through a block parser into page-aligned
chunks of ``features.bin``.
"""
from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from ..writer import DatasetWriter
from . import _kernels as K
from ..dataset import MAX_CLASSES
from . import limits as L
from .edgelist import (DEFAULT_BUFFER, FeatureSink, TextEdges, _err, _progress, check_input,
                       check_not_empty, check_out, count_pass, scatter_passes)


def _line_blocks(path: Path, block: int = 8 << 20) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines of a (gzipped) text file, with the 0-based number
    of the block's first line."""
    line0 = 0
    carry = b""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            while True:
                data = f.read(block)
                buf = carry + data if carry else data
                if not data:
                    if buf:
                        yield buf, line0
                    return
                cut = buf.rfind(b"\n")
                if cut < 0:
                    carry = buf
                    continue
                body, carry = buf[:cut + 1], buf[cut + 1:]
                yield body, line0
                line0 += body.count(b"\n")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise _err(path, f"not a valid or a truncated gzip file ({e})") from None


def _parse_rows(path: Path, body: bytes, line0: int, ncols: int) -> np.ndarray:
    arr = np.frombuffer(body, dtype=np.uint8)
    out = np.empty((body.count(b"\n") + 1, ncols), dtype=np.float64)
    rows, status, bad = K.parse_floats_rows(arr, out, ncols)
    if status:
        raise _err(path, f"line {line0 + bad + 1}: malformed (expected {ncols} comma-separated numbers)")
    return out[:rows]


def _read_column(path: Path) -> np.ndarray:
    parts = [_parse_rows(path, body, l0, 1)[:, 0] for body, l0 in _line_blocks(path)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _read_ids(path: Path, n: int) -> np.ndarray:
    a = _read_column(path)
    if np.any(np.isnan(a)) or np.any(a != np.round(a)):
        raise _err(path, "node ids must be integers")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= n):
        v = int(a.min()) if a.min() < 0 else int(a.max())
        raise _err(path, f"node id {v} out of range [0, {n})")
    return a


def _feature_dim(path: Path) -> int:
    for body, _ in _line_blocks(path, 1 << 16):
        first = body.split(b"\n", 1)[0].strip()
        if first:
            return first.count(b",") + 1
    raise _err(path, "is empty")


def ingest_ogb(root, out, split: str | None = None, undirected: bool = False, dedup: bool = False,
               remove_self_loops: bool = False, feature_dtype: str = "float32", name: str = "",
               buffer_bytes: int = DEFAULT_BUFFER, overwrite: bool = False, progress: bool = True,
               stats: dict | None = None, allow_nonfinite: bool = False) -> Path:
    """Convert an OGB node-property dataset folder ``root`` (holding ``raw/``
    and ``split/``) to a dataset folder ``out`` and return its path.

    Refused like :func:`~.edgelist.ingest_edgelist`: no edges, a node in two
    splits, NaN/inf features unless ``allow_nonfinite``."""
    t0 = time.perf_counter()
    root = Path(root)
    out = check_out(out, overwrite, (root,))
    if not root.is_dir():
        raise _err(root, "not found (expected an OGB dataset folder with raw/ and split/)")
    raw = root / "raw"
    edge_path = check_input(raw / "edge.csv.gz")
    feat_path = raw / "node-feat.csv.gz"
    label_path = raw / "node-label.csv.gz"
    nn_path = raw / "num-node-list.csv.gz"
    split_dir = root / "split"
    split_files = None
    if split_dir.is_dir():
        names = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
        if split is None:
            if len(names) > 1:
                raise _err(split_dir, f"holds several splits {names}; pick one with --split")
            split = names[0] if names else None
        if split is not None:
            split_files = [check_input(split_dir / split / f"{k}.csv.gz") for k in ("train", "valid", "test")]
    elif split is not None:
        raise _err(split_dir, "not found")

    labels = _read_column(check_input(label_path)) if label_path.exists() else None
    if nn_path.exists():
        nn = _read_column(nn_path)
        if nn.size != 1:
            raise _err(nn_path, f"holds {nn.size} graphs; only single-graph node datasets are supported")
        if nn[0] != round(nn[0]) or nn[0] < 1:
            raise _err(nn_path, f"node count {nn[0]} is not a positive integer")
        n = int(nn[0])
        L.check_node_count(n, f"{nn_path} ({n} nodes)")
    elif labels is not None:
        n = labels.shape[0]
    else:
        n = -1
    source = TextEdges(edge_path)
    counts = count_pass(source, n, undirected, remove_self_loops, buffer_bytes, progress)
    n = counts.shape[0]
    check_not_empty(source, counts)
    if labels is not None:
        if labels.ndim != 1 or labels.shape[0] != n:
            raise _err(label_path, f"has {labels.shape[0]} rows, the graph has {n} nodes")
        bad = ~np.isnan(labels) & ((labels != np.round(labels)) | (labels < 0)
                                    | (labels >= MAX_CLASSES))
        if bad.any():
            raise _err(label_path, f"line {int(np.argmax(bad)) + 1}: label {labels[bad][0]} is not a class id")
        y = np.where(np.isnan(labels), -1, labels).astype(np.int64)
    splits = ([_read_ids(p, n) for p in split_files] if split_files
              else [np.zeros(0, np.int64)] * 3)
    dim = _feature_dim(check_input(feat_path)) if feat_path.exists() else 1
    meta_src = {"kind": "ogb", "root": str(root), "split": split, "undirected_added": undirected,
                "dedup": dedup, "self_loops_removed": remove_self_loops}
    with DatasetWriter(out, n, dim, feature_dtype, name=name or root.name, directed=not undirected,
                       overwrite=overwrite, source=meta_src, allow_nonfinite=allow_nonfinite,
                       features_name=str(feat_path)) as w:
        st = scatter_passes(w, source, counts, undirected, dedup, remove_self_loops, buffer_bytes, progress)
        sink = FeatureSink(w)
        if feat_path.exists():
            _stream_features(feat_path, sink, n, dim, buffer_bytes, progress)
        else:
            for a in range(0, n, sink.chunk_rows(16 << 20)):
                b = min(n, a + sink.chunk_rows(16 << 20))
                sink.write(a, np.ones((b - a, 1), np.float32))
        sink.sync()
        if labels is not None:
            w.write_labels(y, int(y.max()) + 1 if y.size else 0)
        w.write_splits(*splits, names=tuple(str(p) for p in split_files) if split_files
                       else ("train", "valid", "test"))
        st.update(num_nodes=n, num_edges=w.num_edges)
    if stats is not None:
        stats.update(st, time_s=time.perf_counter() - t0)
    return out


def _stream_features(path: Path, sink: FeatureSink, n: int, dim: int, buffer_bytes: int,
                     progress: bool) -> None:
    step = sink.chunk_rows(max(1 << 20, buffer_bytes // 16))
    pending: list[np.ndarray] = []
    have = 0
    written = 0
    block = int(min(64 << 20, max(1 << 20, buffer_bytes // 16)))
    with _progress(n, "features", progress, unit="rows") as bar:
        for body, line0 in _line_blocks(path, block):
            rows = _parse_rows(path, body, line0, dim).astype(np.float32)
            if written + have + rows.shape[0] > n:
                raise _err(path, f"has more than {n} rows (the graph has {n} nodes)")
            pending.append(rows)
            have += rows.shape[0]
            if have >= step:
                allr = np.concatenate(pending)
                k = (have // step) * step
                sink.write(written, allr[:k])
                written += k
                pending, have = [allr[k:]], have - k
                bar.update(k)
        if have:
            sink.write(written, np.concatenate(pending))
            written += have
            bar.update(have)
    if written != n:
        raise _err(path, f"has {written} rows, the graph has {n} nodes")
