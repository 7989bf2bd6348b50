"""Per-partition datasets (SDT-GNN §III-B "node-feature file partitioning").

Partition ``q`` is written as a dataset folder ``part_{q:03d}`` in the
format of :mod:`ooc.storage` with *local* ids. Its nodes form an
``H``-hop halo (``halo_hops``, default 1) around the owned nodes, in layers
of a BFS by in-edges:

* layer 0 = the owned nodes; layer ``h`` (1..H) = the in-neighbours of
  layer ``h-1`` nodes that are in none of the layers ``0..h-1`` (layer 1 =
  the replicas of the 1-hop split: in-neighbours of owned nodes owned
  elsewhere);
* local ids: the owned nodes in ascending global id, then layer 1 in
  ascending global id, then layer 2, ...; ``global_ids.npy`` (int64 [n_q])
  maps local to global ids (held in the dataset's index dtype while the partition is
  written: int32 below 2^31 nodes);
* the CSC holds the full in-neighbour list of every node of layers
  ``0..H-1`` (the source row, in the source's order, mapped to local ids)
  and an empty list for every layer-``H`` node: those are only inputs. So an
  ``H``-layer GNN sees every owned node's neighbourhood as in the whole
  graph;
* ``labels.npy`` keeps the labels of owned nodes; every other node gets -1;
* ``train/val/test_idx.npy`` are the source splits restricted to owned nodes,
  in local ids (source order kept);
* features (``features``): ``copy`` reads them from the source's feature file in chunks
  of rows, each page that holds a wanted row read once (O_DIRECT where the file system
  allows it); a source stored in a locality order lends it to the partition
  (``feature_rows.npy``, ``feature_order.kind = "inherited"``), so the copy reads the
  source and writes the partition front to back. ``link`` writes no feature file: the
  partition reads its rows from the source's (``feature_rows.npy`` maps each local node
  to its row there, ``features_link`` in ``meta.json`` says where it is; see
  :data:`~ooc.storage.dataset.FEATURE_LINK`), so partitions on the source's machine take
  4 bytes a node of feature storage instead of a copy of their rows (with their halos,
  several times the source's features in all);
* ``meta.json`` gets a ``partition`` entry: part, parts, algo, num_owned,
  num_replicas (all non-owned nodes), halo_hops, num_replicas_per_hop
  (list, layer sizes ``1..H``).

Memory: ``O(|V|)`` (owner, a global-to-local scratch array that also holds
the layers during the BFS, the id lists of one partition) plus one chunk of
edges and one chunk of feature rows. Per partition the edge stream is read
once to copy the edges (every edge whose destination is in layers
``0..H-1``, to its place in the local CSC row), plus one marking pass per
hop beyond the first (layer 1 comes from the replica bitmap), skipped once
a layer is empty. The split costs ``p * H`` sequential passes.
"""
from __future__ import annotations

import mmap as _mmap
from pathlib import Path

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.partition._kernels import halo_local_chunk, mark_halo_chunk, nodes_by_layer, radix_order, replicas_of
from ooc.partition.base import progress_bar
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.storage import Dataset, DatasetWriter
from ooc.storage.dataset import ROW_MAP_FILE
from ooc.storage.direct import DirectFeatures
from ooc.storage.entries import IDS_PER_READ
from ooc.storage.layout import index_dtype
from ooc.storage.reorder import rows_of

#: Bytes of feature rows copied per chunk.
FEATURE_CHUNK_BYTES = 64 << 20
#: Nodes whose source offsets are read by page at once (:data:`IDS_PER_READ`, the entry
#: reader's own piece): their [n, 2] offsets are held beside the local ``indptr``.
ID_PIECE = IDS_PER_READ


def part_name(q: int) -> str:
    """The folder name of partition ``q``: ``part_NNN``."""
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


def _halo_nodes(dataset: Dataset, owned: np.ndarray, reps: np.ndarray, layer: np.ndarray,
                hops: int, chunk_edges: int, progress: bool, name: str
                ) -> tuple[np.ndarray, list[int]]:
    """The nodes of an ``hops``-hop halo and the layer sizes.

    ``layer`` (int [N], all -1 on entry) is marked with each present node's
    layer; layer 1 is ``reps``, then one pass over the edge stream per hop
    from 2 on. Returns the
    global ids in local order ([n_q] in ``layer``'s dtype, see :func:`nodes_by_layer`) and
    the sizes of layers ``1..hops``. ``layer`` is left marked.
    """
    layer[owned] = 0
    layer[reps] = 1
    per_hop = [int(reps.size)]
    stream = EdgeStream(dataset, chunk_edges=chunk_edges)
    for h in range(2, hops + 1):
        marked = 0
        if per_hop[-1]:
            with progress_bar(dataset.num_edges, f"split {name}: hop {h}", progress) as bar:
                for ch in stream:
                    marked += mark_halo_chunk(stream.indptr, ch.a, ch.first_dst, ch.src, layer, h)
                    bar.update(ch.b - ch.a)
        per_hop.append(int(marked))
    return nodes_by_layer(layer, hops), per_hop


def write_partition(dataset: Dataset, owner: np.ndarray, bits: np.ndarray, q: int, parts: int,
                    out: Path, g2l: np.ndarray, algo: str = "",
                    chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: bool = False,
                    halo_hops: int = 1, features: str = "copy") -> dict:
    """Write partition ``q`` and its ``halo_hops``-hop halo to ``out`` (a new
    folder); returns its summary.

    ``owner``: int [N] owning partition of every node; ``bits``: the replica
    bitmap of :func:`ooc.partition.metrics.replica_bits`; ``g2l``: int [N]
    scratch, all -1 on entry and on return. ``features``: a key of :data:`FEATURES`.
    """
    if halo_hops < 1:
        raise InvalidValue(f"halo_hops must be >= 1, got {halo_hops}")
    write_features = feature_writer(features)
    name = part_name(q)
    owned = np.flatnonzero(owner == q).astype(g2l.dtype)
    reps = replicas_of(bits, q, g2l)
    n_own = owned.size
    gids, per_hop = _halo_nodes(dataset, owned, reps, g2l, halo_hops, chunk_edges, progress, name)
    del reps  # marked in g2l: each array of nodes the split holds costs 4 B a node (int32)
    nq = gids.size
    n_rep = nq - n_own
    n_inner = nq - per_hop[-1]  # layers 0..H-1: full in-neighbour lists
    g2l[gids] = np.arange(nq, dtype=g2l.dtype)
    indptr = _local_indptr(dataset, gids, n_inner)
    eq = int(indptr[-1])
    with _part_writer(dataset, out, nq, name) as w:
        w.extra_meta["partition"] = {"part": q, "parts": parts, "algo": algo,
                                     "num_owned": int(n_own), "num_replicas": int(n_rep),
                                     "halo_hops": int(halo_hops),
                                     "num_replicas_per_hop": per_hop}
        w.write_indptr(indptr)
        ind = w.indices()
        if eq:
            _copy_edges(dataset, g2l, n_inner, indptr, ind, chunk_edges, progress, name)
        del indptr, ind  # written: the feature copy's arrays take their place
        write_features(dataset, w, gids)
        w.write_labels_chunks(_local_labels(dataset, owned, nq), dataset.num_classes)
        splits = _local_splits(dataset, owner, q, g2l)
        w.write_splits(*splits)
        assert w.tmp is not None  # inside the writer's with block
        np.save(w.tmp / "global_ids.npy", gids.astype(np.int64))
        summary = {"part": q, "path": name, "owned": int(n_own), "replicas": int(n_rep),
                   "nodes": int(nq), "edges": eq, "halo_hops": int(halo_hops),
                   "num_replicas_per_hop": per_hop,
                   "train": int(splits[0].size), "val": int(splits[1].size),
                   "test": int(splits[2].size)}
    g2l[gids] = -1
    return summary


#: Labels written per chunk of a partition (8 bytes each).
LABEL_CHUNK = 1 << 20


def _local_labels(dataset: Dataset, owned: np.ndarray, nq: int):
    """The labels of a partition's ``nq`` local nodes in chunks of :data:`LABEL_CHUNK`
    (int64): its owned nodes' (``owned``, int [o], the first local ids), then -1 for the
    halo, which trains on none."""
    for a in range(0, nq, LABEL_CHUNK):
        b = min(nq, a + LABEL_CHUNK)
        part = np.full(b - a, -1, dtype=np.int64)
        k = max(0, min(b, owned.size) - a)
        if k:
            part[:k] = dataset.read_labels(owned[a:a + k])
        yield part


def _local_indptr(dataset: Dataset, gids: np.ndarray, n_inner: int) -> np.ndarray:
    """int64 [n_q + 1] CSC offsets of the partition whose nodes are ``gids`` (int [n_q],
    global ids in local order): the source in-degree for the first ``n_inner`` nodes
    (layers ``0..H-1``), 0 for the rest. The two source offsets of each of those nodes are
    read by page in one request per :data:`ID_PIECE` nodes
    (:meth:`~ooc.storage.Dataset.entries`): gathered through the memmap at random they
    would map up to all of ``indptr.npy`` (8 bytes a node). The degrees are summed in
    place."""
    indptr = np.zeros(gids.size + 1, dtype=np.int64)
    for a in range(0, n_inner, ID_PIECE):
        b = min(n_inner, a + ID_PIECE)
        ends = dataset.entries("indptr.npy", dataset.indptr, gids[a:b], width=2)  # [b - a, 2]
        np.subtract(ends[:, 1], ends[:, 0], out=indptr[a + 1:b + 1])
    np.cumsum(indptr, out=indptr)
    return indptr


def ascending_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` (``values``: non-negative ints) in the index
    dtype of its length: int32 [n] and one int32 scratch array where numpy's argsort
    returns int64 and holds another int64 array while it sorts."""
    n = values.shape[0]
    idt = index_dtype(n)
    return radix_order(values, np.empty(n, dtype=idt), np.empty(n, dtype=idt))


def _part_writer(dataset: Dataset, out: Path, nq: int, name: str) -> DatasetWriter:
    """The writer of partition ``name``'s dataset at ``out``: ``nq`` nodes with the
    source's feature dim and dtype; the source's name, direction and non-finite
    setting carried over."""
    src_meta = dataset.meta
    return DatasetWriter(out, nq, dataset.feature_dim, dataset.layout.dtype,
                         name=f"{src_meta.get('name', '')}-{name}",
                         directed=bool(src_meta.get("directed", True)),
                         source={"partition_of": str(dataset.path)},
                         # the source was ingested with --allow-nonfinite: its partitions keep them
                         allow_nonfinite=int(src_meta.get("nonfinite_features", 0) or 0) > 0)


def _copy_edges(dataset: Dataset, g2l: np.ndarray, n_inner: int, indptr: np.ndarray,
                ind: np.ndarray, chunk_edges: int, progress: bool, name: str) -> None:
    """One pass over the edge stream: every edge whose destination is among the first
    ``n_inner`` local nodes, its source mapped through ``g2l`` (int [N]), to its place
    in ``ind`` (the writer's indices memmap, [indptr[-1]]); ``indptr``: int64 [n_q + 1]
    local offsets. The memmap's pages are released after each chunk."""
    eq = int(indptr[-1])
    stream = EdgeStream(dataset, chunk_edges=chunk_edges)
    pos = 0
    with progress_bar(dataset.num_edges, f"split {name}: edges", progress) as bar:
        for ch in stream:
            pos += halo_local_chunk(stream.indptr, ch.a, ch.first_dst, ch.src, g2l,
                                    n_inner, indptr, ind)
            _release(ind)
            bar.update(ch.b - ch.a)
    if pos != eq:
        raise RuntimeError(f"{name}: wrote {pos} edges, expected {eq}")


def _copy_features(dataset: Dataset, w: DatasetWriter, gids: np.ndarray) -> None:
    """Rows ``gids`` (int [n_q], global ids in local order) of the source's features to
    the writer's feature file, :data:`FEATURE_CHUNK_BYTES` of rows at a time, read by a
    :class:`~ooc.storage.direct.DirectFeatures` (O_DIRECT where the file system allows it:
    each page holding a row of the chunk is read once, and none stays in the page cache or
    in this process). Reading through the page cache instead (readahead off) took as long
    where the cache holds the source once for all partitions, and longer where it does
    not fit (``docs/benchmarks.md``, partitioning).

    A source stored in a locality order (``feature_rows.npy``) lends it to the partition:
    the partition's rows are stored in the order of their source rows, so the copy reads
    the source front to back and writes the partition front to back, and neighbours keep
    sharing pages. A source in node order is copied in local order (each halo layer is in
    ascending global id: again front to back)."""
    nq = gids.size
    lay = dataset.file_layout
    if dataset.row_of is not None:
        # the row map's entries read by page (gathered through its memmap they would map
        # up to all of it), in its own dtype: int32 below 2^31 nodes
        src_rows = dataset.entries(ROW_MAP_FILE, dataset.row_of, gids)
        order = ascending_order(src_rows)
        src_rows = src_rows[order]
        w.store_rows_in(rows_of(order, index_dtype(nq)), "inherited")
        del order
    else:
        src_rows = gids
    dst_view = w.features()
    rows = max(1, FEATURE_CHUNK_BYTES // max(1, lay.row_bytes))
    with DirectFeatures(dataset.features_file, lay) as source:
        for a in range(0, nq, rows):
            b = min(nq, a + rows)
            chunk = source.read(src_rows[a:b])
            w.check_features(a, chunk)
            dst_view[a:b] = chunk
            _release(w._features)


def _link_features(dataset: Dataset, w: DatasetWriter, gids: np.ndarray) -> None:
    """The partition reads rows ``gids`` (int [n_q], global ids in local order) from the
    source's feature file (its own, or the one it links in turn) instead of a copy."""
    rows = (dataset.entries(ROW_MAP_FILE, dataset.row_of, gids) if dataset.row_of is not None
            else gids)
    w.link_features(dataset.features_file, dataset.file_layout.num_rows,
                    dataset.meta["files"]["features.bin"], rows,
                    nonfinite=int(dataset.meta.get("nonfinite_features", 0) or 0))


#: How a partition gets its feature rows (``ooc.partition --features``).
FEATURES = {"copy": _copy_features, "link": _link_features}


def feature_writer(name: str):
    """The :data:`FEATURES` entry ``name``, or one line naming the choices."""
    if name not in FEATURES:
        raise InvalidValue(f"--features must be one of {', '.join(FEATURES)}, got {name!r}")
    return FEATURES[name]


def _local_splits(dataset: Dataset, owner: np.ndarray, q: int, g2l: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The source's train/val/test ids owned by partition ``q``, in local ids (int64,
    source order kept); ``owner``: int [N], ``g2l``: int [N] global-to-local map."""
    splits = []
    for ids in (dataset.train_idx, dataset.val_idx, dataset.test_idx):
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[owner[ids] == q]
        splits.append(g2l[ids].astype(np.int64))
    return splits[0], splits[1], splits[2]
