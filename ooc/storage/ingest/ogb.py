"""OGB node-property raw folders to dataset format v1, streamed.

Layouts read (as downloaded by ``ogb`` for e.g. ``ogbn-arxiv``, or binary as
``ogbn-papers100M`` ships)::

    ROOT/raw/edge.csv.gz             src,dst per line (the ogbn graphs are directed)
    ROOT/raw/node-feat.csv.gz        N lines of D comma-separated floats
    ROOT/raw/node-label.csv.gz       N lines, one label (nan: unlabeled)
    ROOT/raw/num-node-list.csv.gz    optional: N
  or
    ROOT/raw/data.npz                edge_index [2, E], node_feat [N, D], num_nodes_list [1]
    ROOT/raw/node-label.npz          node_label [N, 1] (nan: unlabeled)
  and
    ROOT/split/<name>/{train,valid,test}.csv.gz   node ids, one per line

The binary members are read in place when stored, or inflated once into a scratch
folder beside the output when deflated (:mod:`.npz`); never loaded whole.

The gzipped CSVs are decompressed in blocks: edges go through the edge-list
count/scatter passes, features through a block parser into page-aligned
chunks of ``features.bin``.
"""
from __future__ import annotations

import gzip
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ooc.storage.ingest import _kernels as K
from ooc.storage.ingest import limits as L
from ooc.storage.ingest import npz
from ooc.storage.ingest.ogb_link import is_link_split, ogb_link_split
from ooc.storage.link_split import LinkSplitSpec
from ooc.storage.ingest.edgelist import (
    DEFAULT_BUFFER,
    EdgeSource,
    FeatureSink,
    NpyEdges,
    NpyReader,
    TextEdges,
    check_input,
    check_not_empty,
    check_out,
    count_pass,
    input_error,
    open_features,
    progress_bar,
    scatter_passes,
    write_constant_features,
    write_features_npy,
)
from ooc.storage.writer import DatasetWriter, class_ids

#: Labels read at a time (float64 and int64 copies of them).
LABEL_CHUNK = 1 << 22


@dataclass
class _Labels:
    """Node labels read in chunks, in node order: a parsed column (CSV) or a streamed
    ``.npy`` member (npz); NaN is unlabeled. Memory: one chunk."""

    path: Path
    length: int
    array: np.ndarray | None = None     # the CSV column
    reader: NpyReader | None = None     # the npz member ([N] or [N, 1])

    def chunks(self, step: int | None = None) -> Iterator[np.ndarray]:
        """Pieces of the labels in their stored dtype (``step`` of them, default
        :data:`LABEL_CHUNK`)."""
        step = step or LABEL_CHUNK
        for a in range(0, self.length, step):
            b = min(self.length, a + step)
            if self.array is not None:
                yield self.array[a:b]
            else:
                assert self.reader is not None
                yield self.reader.read_flat(a, b - a)

    def class_ids(self, step: int | None = None) -> Iterator[np.ndarray]:
        """int64 pieces, -1 where unlabeled (NaN); a label that is not a class id is an
        error naming its line (:func:`~ooc.storage.writer.class_ids`, in the stored dtype:
        a uint64 ``2**64 - 1`` is not -1)."""
        at = 0
        for part in self.chunks(step):
            yield class_ids(part, str(self.path), first=at + 1, row="line")
            at += part.shape[0]


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
        raise input_error(path, f"not a valid or a truncated gzip file ({e})") from None


def parse_rows(path: Path, body: bytes, line0: int, ncols: int) -> np.ndarray:
    """Rows of ``ncols`` comma-separated numbers in ``body`` (lines of ``path`` from line
    ``line0``, 0-based) as float64 [rows, ncols]; a malformed line is a one-line input error."""
    arr = np.frombuffer(body, dtype=np.uint8)
    out = np.empty((body.count(b"\n") + 1, ncols), dtype=np.float64)
    rows, status, bad = K.parse_floats_rows(arr, out, ncols)
    if status:
        raise input_error(path, f"line {line0 + bad + 1}: malformed "
                                f"(expected {ncols} comma-separated numbers)")
    return out[:rows]


def _read_column(path: Path) -> np.ndarray:
    parts = [parse_rows(path, body, l0, 1)[:, 0] for body, l0 in _line_blocks(path)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _read_ids(path: Path, n: int) -> np.ndarray:
    a = _read_column(path)
    if np.any(np.isnan(a)) or np.any(a != np.round(a)):
        raise input_error(path, "node ids must be integers")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= n):
        v = int(a.min()) if a.min() < 0 else int(a.max())
        raise input_error(path, f"node id {v} out of range [0, {n})")
    return a


def _feature_dim(path: Path) -> int:
    for body, _ in _line_blocks(path, 1 << 16):
        first = body.split(b"\n", 1)[0].strip()
        if first:
            return first.count(b",") + 1
    raise input_error(path, "is empty")


def ingest_ogb(root, out, split: str | None = None, undirected: bool = False, dedup: bool = False,
               remove_self_loops: bool = False, feature_dtype: str = "float32", name: str = "",
               buffer_bytes: int = DEFAULT_BUFFER, overwrite: bool = False, progress: bool = True,
               stats: dict | None = None, allow_nonfinite: bool = False,
               reorder: str = "auto", link_split: LinkSplitSpec | None = None) -> Path:
    """Convert an OGB node-property or link-property dataset folder ``root`` (holding ``raw/``
    and ``split/``) to a dataset folder ``out`` and return its path.

    ``raw/`` is read in either layout OGB ships: gzipped CSVs (``edge.csv.gz``,
    ``node-feat.csv.gz``, ...) or binary ``.npz`` (``data.npz`` with ``edge_index``
    [2, E] and ``node_feat`` [N, D], ``node-label.npz``), as papers100M comes.
    Refused like :func:`~.edgelist.ingest_edgelist`: no edges, a node in two
    splits, NaN/inf features unless ``allow_nonfinite``. A link-property split
    (``split/<name>/{valid,test}.pt``, :mod:`.ogb_link`) becomes the dataset's link
    split; ``link_split`` (fractions or given pairs) is the alternative."""
    t0 = time.perf_counter()
    root = Path(root)
    out = check_out(out, overwrite, (root,))
    if not root.is_dir():
        raise input_error(root, "not found (expected an OGB dataset folder with raw/ and split/)")
    if root.name == "raw" and not (root / "raw").is_dir():
        raise input_error(root, f"is the raw/ folder itself: pass its parent ({root.parent}), which "
                         f"holds raw/ and split/")
    split, split_files = _split_files(root, split)
    if split_files is None and split is not None:  # a link-property split
        given = ogb_link_split(root / "split" / split, link_split)
        link_split = given
    scratch = out.parent / f".{out.name}.inflate-{os.getpid()}"
    try:
        src = (_binary_inputs(root / "raw", scratch) if (root / "raw" / "data.npz").exists()
               else _csv_inputs(root / "raw"))
        return _ingest(root, out, src, split, split_files, undirected, dedup, remove_self_loops,
                       feature_dtype, name, buffer_bytes, overwrite, progress, stats,
                       allow_nonfinite, t0, reorder, link_split)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _split_files(root: Path, split: str | None) -> tuple[str | None, list[Path] | None]:
    """The split's name and its three id files under ``root/split/``."""
    split_dir = root / "split"
    if not split_dir.is_dir():
        if split is not None:
            raise input_error(split_dir, "not found")
        return None, None
    names = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if split is None:
        if len(names) > 1:
            raise input_error(split_dir, f"holds several splits {names}; pick one with --split")
        split = names[0] if names else None
    if split is None:
        return None, None
    if is_link_split(split_dir / split):
        return split, None
    return split, [check_input(split_dir / split / f"{k}.csv.gz") for k in ("train", "valid", "test")]


@dataclass
class _Inputs:
    """One raw layout's pieces: the edge stream, the node count (-1: from the edges),
    the labels (read in chunks; None: none), the feature dim and writer."""

    source: EdgeSource
    n: int
    labels: _Labels | None
    dim: int
    feature_path: Path
    write_features: Callable[[DatasetWriter, int, int, bool], None]


def _csv_inputs(raw: Path) -> _Inputs:
    edge_path = check_input(raw / "edge.csv.gz")
    feat_path = raw / "node-feat.csv.gz"
    label_path = raw / "node-label.csv.gz"
    nn_path = raw / "num-node-list.csv.gz"
    labels = (_Labels(label_path, 0, array=_read_column(check_input(label_path)))
              if label_path.exists() else None)
    if labels is not None:
        assert labels.array is not None
        labels.length = labels.array.shape[0]
    if nn_path.exists():
        nn = _read_column(nn_path)
        if nn.size != 1:
            raise input_error(nn_path, f"holds {nn.size} graphs; "
                                       "only single-graph node datasets are supported")
        if nn[0] != round(nn[0]) or nn[0] < 1:
            raise input_error(nn_path, f"node count {nn[0]} is not a positive integer")
        n = int(nn[0])
        L.check_node_count(n, f"{nn_path} ({n} nodes)")
    elif labels is not None:
        n = labels.length
    else:
        n = -1
    dim = _feature_dim(check_input(feat_path)) if feat_path.exists() else 1

    def write(w: DatasetWriter, n: int, buffer_bytes: int, progress: bool) -> None:
        sink = FeatureSink(w)
        if feat_path.exists():
            _stream_features(feat_path, sink, n, dim, buffer_bytes, progress)
        else:
            for a in range(0, n, sink.chunk_rows(16 << 20)):
                b = min(n, a + sink.chunk_rows(16 << 20))
                sink.write(a, np.ones((b - a, 1), np.float32))
        sink.sync()

    return _Inputs(TextEdges(edge_path), n, labels, dim, feat_path, write)


def _binary_inputs(raw: Path, scratch: Path) -> _Inputs:
    """``raw/data.npz`` (``edge_index`` [2, E], ``node_feat`` [N, D], optional
    ``num_nodes_list`` [1]) and ``raw/node-label.npz`` (``node_label`` [N] or [N, 1]),
    each member streamed (see :mod:`.npz`)."""
    data = raw / "data.npz"
    have = npz.members(data)
    source = NpyEdges(data, reader=npz.npz_member(data, "edge_index", scratch))
    n = -1
    if "num_nodes_list" in have:
        r = npz.npz_member(data, "num_nodes_list", scratch)
        nn = r.read_all().reshape(-1)
        if nn.size != 1 or r.dtype.kind not in "iu" or nn[0] < 1:
            raise input_error(r.path, f"holds {nn.tolist()[:4]}; expected one positive node count (only "
                               f"single-graph node datasets are supported)")
        n = int(nn[0])
        L.check_node_count(n, f"{r.path} ({n} nodes)")
    feat = None
    if "node_feat" in have:
        feat = open_features(None, None, reader=npz.npz_member(data, "node_feat", scratch))
        if n < 0:
            n = feat.shape[0]
        elif feat.shape[0] != n:
            raise input_error(feat.path, f"features have {feat.shape[0]} rows, num_nodes_list says {n}")
    labels, label_path = None, raw / "node-label.npz"
    if label_path.exists():
        r = npz.npz_member(label_path, "node_label", scratch)
        shape = r.shape
        if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)) \
                or (n >= 0 and shape[0] != n):
            raise input_error(r.path, f"labels have shape {r.shape}; expected [{n if n >= 0 else 'N'}] "
                               f"or [N, 1]")
        if r.dtype.kind not in "fiub":
            raise input_error(r.path, f"labels have dtype {r.dtype}; expected numbers")
        labels = _Labels(r.path, int(shape[0]), reader=r)
        n = labels.length if n < 0 else n

    def write(w: DatasetWriter, n: int, buffer_bytes: int, progress: bool) -> None:
        if feat is None:
            write_constant_features(w)
        else:
            write_features_npy(w, feat, buffer_bytes, progress)

    return _Inputs(source, n, labels, feat.shape[1] if feat is not None else 1,
                   feat.path if feat is not None else data, write)


def _ingest(root: Path, out: Path, src: _Inputs, split, split_files, undirected: bool,
            dedup: bool, remove_self_loops: bool, feature_dtype: str, name: str,
            buffer_bytes: int, overwrite: bool, progress: bool, stats: dict | None,
            allow_nonfinite: bool, t0: float, reorder: str,
            link_split: LinkSplitSpec | None = None) -> Path:
    counts = count_pass(src.source, src.n, undirected, remove_self_loops, buffer_bytes, progress)
    n = counts.shape[0]
    check_not_empty(src.source, counts)
    labels = src.labels
    if labels is not None:
        if labels.length != n:
            raise input_error(labels.path, f"has {labels.length} rows, the graph has {n} nodes")
        top = -1
        for part in labels.class_ids():  # checked before the passes, written after them
            top = max(top, int(part.max()) if part.size else -1)
    splits = ([_read_ids(p, n) for p in split_files] if split_files
              else [np.zeros(0, np.int64)] * 3)
    meta_src = {"kind": "ogb", "root": str(root), "split": split, "undirected_added": undirected,
                "dedup": dedup, "self_loops_removed": remove_self_loops,
                "layout": "npz" if isinstance(src.source, NpyEdges) else "csv"}
    with DatasetWriter(out, n, src.dim, feature_dtype, name=name or root.name,
                       directed=not undirected, overwrite=overwrite, source=meta_src,
                       allow_nonfinite=allow_nonfinite, features_name=str(src.feature_path),
                       reorder=reorder, buffer_bytes=buffer_bytes, link_split=link_split) as w:
        st = scatter_passes(w, src.source, counts, undirected, dedup, remove_self_loops,
                            buffer_bytes, progress)
        src.write_features(w, n, buffer_bytes, progress)
        if labels is not None:
            w.write_labels_chunks(labels.class_ids(), top + 1)
        train, val, test = splits  # the split's three id files, or three empty arrays
        a, b, c = (str(p) for p in split_files) if split_files else ("train", "valid", "test")
        w.write_splits(train, val, test, names=(a, b, c))
        assert w.num_edges is not None  # set by write_indptr in scatter_passes
        # labels_held: OGB's labels are written in pieces, never held whole (see limits)
        st.update(num_nodes=n, num_edges=w.num_edges, labels_held=False)
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
    with progress_bar(n, "features", progress, unit="rows") as bar:
        for body, line0 in _line_blocks(path, block):
            rows = parse_rows(path, body, line0, dim).astype(np.float32)
            if written + have + rows.shape[0] > n:
                raise input_error(path, f"has more than {n} rows (the graph has {n} nodes)")
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
        raise input_error(path, f"has {written} rows, the graph has {n} nodes")
