"""Synthetic power-law graphs with community structure, written straight to
dataset format v1 in chunks.

Model (all deterministic for a seed, independent of chunking and threads):

- internal ids ``r`` in ``[0, N)``; community ``r % communities`` (by default
  one community per class; ``community_size`` makes many small ones, as real
  graphs have), label ``community % classes``; output ids are a seeded random
  permutation of the internal ids, so node id says nothing about degree,
  community or class;
- edges come from R-MAT (Graph500-like skew, quadrant probabilities
  ``a, b, c, d``); with probability ``p_in`` the target is moved into the
  source's community, keeping its R-MAT rank (so the degree skew survives);
  the first N edges start at node g so no node is isolated; self loops are
  redrawn and duplicate edges removed;
- undirected by default: each generated pair is stored in both directions
  and ``avg_degree`` is the mean in-degree of the result (before dedup);
- features ``centroid[class] + noise * N(0, 1)``: a weak per-node class
  signal that neighbour aggregation makes strong (an MLP on features alone
  is clearly worse than a GNN);
- every node is labelled; splits are drawn per node from seeded uniforms.

The edge stream is regenerated for each pass (count, then scatter windows)
instead of being stored: memory is O(N) plus the ingest buffer.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ooc.core.errors import InvalidValue, IOFailure, setting
from ooc.core.sizes import format_size
from ooc.storage.dataset import MAX_CLASSES, MAX_FEATURE_DIM
from ooc.storage.ingest import _kernels as K
from ooc.storage.ingest import limits as L
from ooc.storage.ingest.edgelist import (
    DEFAULT_BUFFER,
    EdgeSource,
    FeatureSink,
    check_out,
    count_pass,
    progress_bar,
    scatter_passes,
)
from ooc.storage.layout import FEATURE_DTYPES, FeatureLayout, index_dtype, padded_bytes
from ooc.storage.reserve import free_bytes
from ooc.storage.link_split import LinkSplitSpec
from ooc.storage.writer import DatasetWriter

#: Nodes per chunk when the labels and the splits are made.
LABEL_STEP = 1 << 22
#: R-MAT quadrant probabilities (a, b, c; d = 1 - a - b - c).
RMAT = (0.45, 0.22, 0.22)


class SyntheticEdges(EdgeSource):
    """The generated edge stream, re-creatable chunk by chunk."""

    unit = "edges"

    def __init__(self, nodes: int, num_edges: int, classes: int, p_in: float, seed: int,
                 rmat=RMAT, communities: int | None = None):
        self.path = "<synthetic>"
        self.n, self.num_edges, self.classes, self.p_in, self.seed = nodes, num_edges, classes, p_in, seed
        self.communities = classes if communities is None else int(communities)
        self.levels = max(1, math.ceil(math.log2(max(nodes, 2))))
        a, b, c = rmat
        self.pa, self.pab, self.pabc = a, a + b, a + b + c
        # Generator.permutation(n) shuffles an int64 arange: the same shuffle of an arange of
        # node-id width is the same permutation in half the bytes (int32 below 2^31 nodes)
        self.perm = np.arange(nodes, dtype=index_dtype(nodes))
        np.random.default_rng([seed, 0]).shuffle(self.perm)
        self.nbytes = num_edges

    def chunks(self, chunk_edges, num_nodes):
        chunk_edges = max(1, min(chunk_edges, 1 << 22))
        for a in range(0, self.num_edges, chunk_edges):
            cnt = min(chunk_edges, self.num_edges - a)
            src = np.empty(cnt, dtype=np.int64)
            dst = np.empty(cnt, dtype=np.int64)
            K.rmat_edges(self.seed, a, self.n, self.levels, self.pa, self.pab, self.pabc,
                         self.communities, self.p_in, self.n, self.perm, src, dst)
            yield src, dst, a, cnt

    def labels(self) -> np.ndarray:
        """int32 [N]: the label of every output id (its community modulo the classes), made
        a chunk of internal ids at a time."""
        y = np.empty(self.n, dtype=np.int32)
        for a in range(0, self.n, LABEL_STEP):
            b = min(self.n, a + LABEL_STEP)
            y[self.perm[a:b]] = np.arange(a, b, dtype=np.int64) % self.communities % self.classes
        return y

    @property
    def held_bytes(self) -> int:
        """Bytes the generator holds besides what an ingest plans per node: the id
        permutation. Its int32 labels, made once the adjacency is written, take less than
        the labels' share of :data:`~ooc.storage.ingest.limits.BYTES_PER_NODE` (an edge
        list's labels, loaded whole as int64)."""
        return int(self.perm.nbytes)


def communities_of(nodes: int, classes: int, community_size: int | None) -> int:
    """How many communities the generator makes: one per class, or ``ceil(nodes /
    community_size)`` (at least ``classes``) when a community size is given."""
    if community_size is None:
        return classes
    if not 1 <= community_size <= nodes:
        raise InvalidValue(f"{setting('--community-size')} must be in [1, nodes], got {community_size}")
    return max(classes, -(-nodes // community_size))


def split_ids(n: int, seed: int, fractions) -> list[np.ndarray]:
    """The node ids of each split (int64), from one seeded uniform per node, drawn a chunk
    of nodes at a time."""
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for a in range(0, n, LABEL_STEP):
        u = np.empty(min(n, a + LABEL_STEP) - a, dtype=np.float64)
        K.node_uniforms(seed, 3, a, u)
        lo = 0.0
        for k, f in enumerate(fractions):
            parts[k].append(np.flatnonzero((u >= lo) & (u < lo + f)).astype(np.int64) + a)
            lo += f
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]


def _check_settings(nodes: int, avg_degree: float, feature_dim: int, classes: int, dtype: str,
                    train_fraction: float, val_fraction: float, test_fraction: float | None,
                    seed: int, p_in: float, signal: float, noise: float | None
                    ) -> tuple[float, float, float]:
    """Refuse any setting of :func:`generate_synthetic` out of its range; return the
    split fractions ``(train, val, test)`` (``test_fraction=None``: the rest)."""
    for flag, v in (("--avg-degree", avg_degree), ("--train-fraction", train_fraction),
                    ("--val-fraction", val_fraction), ("--test-fraction", test_fraction),
                    ("--p-in", p_in), ("--noise", noise), ("signal", signal)):
        if v is not None and not math.isfinite(v):
            raise InvalidValue(f"{setting(flag)} must be a finite number, got {v}")
    if nodes < 2:
        raise InvalidValue(f"{setting('--nodes')} must be at least 2, got {nodes}")
    L.check_node_count(nodes, f"{setting('--nodes')} {nodes}")
    if classes < 1 or classes > min(nodes, MAX_CLASSES):
        raise InvalidValue(f"{setting('--classes')} must be in [1, min(nodes, {MAX_CLASSES})], got {classes}")
    if not 0 < avg_degree <= nodes - 1:  # no self loops nor duplicates: N - 1 in-neighbours
        raise InvalidValue(f"{setting('--avg-degree')} must be in (0, nodes - 1] (a simple "
                           f"graph of {nodes:,} nodes has at most {nodes - 1:,} in-neighbours a "
                           f"node), got {avg_degree:g}")
    if nodes * avg_degree >= 2 ** 62:  # edge positions are int64 (indptr.npy)
        raise InvalidValue(f"{setting('--nodes')} {nodes:,} x {setting('--avg-degree')} "
                           f"{avg_degree:g}: {nodes * avg_degree:.3g} edges, past the 2^62 "
                           "edges the format's int64 positions hold")
    if not 1 <= feature_dim <= MAX_FEATURE_DIM:
        raise InvalidValue(f"{setting('--feature-dim')} must be in [1, {MAX_FEATURE_DIM}], got {feature_dim}")
    if dtype not in FEATURE_DTYPES:
        raise InvalidValue(f"{setting('--dtype')} must be one of {FEATURE_DTYPES}, got {dtype!r}")
    if not 0 <= seed < 2**63:
        raise InvalidValue(f"{setting('--seed')} must be in [0, 2**63), got {seed}")
    if noise is not None and noise < 0:
        raise InvalidValue(f"{setting('--noise')} must be >= 0, got {noise}")
    if signal < 0:
        raise InvalidValue(f"signal must be >= 0, got {signal}")
    if test_fraction is None:
        test_fraction = max(0.0, 1.0 - train_fraction - val_fraction)
    fr = (train_fraction, val_fraction, test_fraction)
    if min(fr) < 0 or sum(fr) > 1 + 1e-9:
        raise InvalidValue(f"split fractions must be >= 0 and sum to at most 1, got {fr}")
    if not 0 <= p_in <= 1:
        raise InvalidValue(f"{setting('--p-in')} must be in [0, 1], got {p_in}")
    return fr


def least_bytes(nodes: int, feature_dim: int, dtype: str) -> int:
    """Bytes a synthetic dataset of ``nodes`` nodes takes at least, whatever its edges:
    ``features.bin``, ``indptr.npy``, ``labels.npy``, the splits (every node in one at
    most) and ``indices.bin`` with one in-edge a node (no node is isolated)."""
    rows = FeatureLayout(nodes, feature_dim, dtype).file_bytes
    return rows + 8 * (nodes + 1) + 8 * nodes + 8 * nodes + padded_bytes(
        nodes * index_dtype(nodes).itemsize)


def check_room(out: Path, nodes: int, feature_dim: int, dtype: str) -> None:
    """Refuse, before the first pass, an output whose disk cannot hold even
    :func:`least_bytes`."""

    need, free = least_bytes(nodes, feature_dim, dtype), free_bytes(out)
    if free is not None and need > free:
        raise IOFailure(f"{out.parent}: a synthetic dataset of {nodes:,} nodes and "
                        f"{setting('--feature-dim')} {feature_dim} needs at least "
                        f"{format_size(need)} of disk, {format_size(free)} is free")


def _centroids(classes: int, feature_dim: int, signal: float, seed: int) -> np.ndarray:
    """float64 [classes, feature_dim]: a seeded random centroid of norm ``signal`` per class."""
    rng = np.random.default_rng([seed, 1])
    centroids = rng.standard_normal((classes, feature_dim))
    centroids *= signal / np.linalg.norm(centroids, axis=1, keepdims=True)
    return centroids


def _write_features(w: DatasetWriter, labels: np.ndarray, centroids: np.ndarray, noise: float,
                    seed: int, buffer_bytes: int, progress: bool) -> None:
    """Write ``features.bin`` of ``w``: row ``v`` is ``centroids[labels[v]] + noise * N(0, 1)``
    (``labels`` int [N], ``centroids`` float64 [classes, dim]), made and written in
    page-aligned float32 chunks of at most a quarter of ``buffer_bytes`` (1 to 64 MiB)."""
    nodes, feature_dim = labels.shape[0], centroids.shape[1]
    sink = FeatureSink(w)
    step = sink.chunk_rows(max(1 << 20, min(64 << 20, buffer_bytes // 4)))
    with progress_bar(nodes, "features", progress, unit="rows") as bar:
        for a in range(0, nodes, step):
            b = min(nodes, a + step)
            x = np.empty((b - a, feature_dim), dtype=np.float32)
            K.noisy_features(seed, a, labels[a:b], centroids.astype(np.float32),
                             np.float32(noise), x)
            sink.write(a, x)
            bar.update(b - a)
    sink.sync()


def generate_synthetic(out, nodes: int = 100_000, avg_degree: float = 10, feature_dim: int = 64,
                       classes: int = 8, dtype: str = "float32", train_fraction: float = 0.1,
                       val_fraction: float = 0.05, test_fraction: float | None = None, seed: int = 0,
                       undirected: bool = True, overwrite: bool = False, progress: bool = True,
                       p_in: float = 0.85, signal: float = 1.0, noise: float | None = None,
                       buffer_bytes: int = DEFAULT_BUFFER, stats: dict | None = None,
                       allow_nonfinite: bool = False, community_size: int | None = None,
                       reorder: str = "auto", link_split: LinkSplitSpec | None = None) -> Path:
    """Generate a synthetic dataset folder at ``out`` and return its path.

    ``test_fraction=None`` puts every node outside train/val into test.
    ``signal`` is the centroid norm, ``noise`` the per-coordinate standard
    deviation (default chosen so features alone give roughly 50% accuracy
    with 8 classes and 64 dims). ``community_size`` splits the graph into
    ``ceil(nodes / community_size)`` communities (labels: community modulo
    ``classes``) instead of one per class. ``link_split`` holds edges out for link
    prediction (:mod:`ooc.storage.link_split`).
    """
    t0 = time.perf_counter()
    fr = _check_settings(nodes, avg_degree, feature_dim, classes, dtype, train_fraction,
                         val_fraction, test_fraction, seed, p_in, signal, noise)
    communities = communities_of(nodes, classes, community_size)
    out = check_out(out, overwrite)
    check_room(out, nodes, feature_dim, dtype)
    if noise is None:
        noise = 0.7 * signal
    num_gen = int(round(nodes * avg_degree / (2 if undirected else 1)))
    source = SyntheticEdges(nodes, num_gen, classes, p_in, seed, communities=communities)
    counts = count_pass(source, nodes, undirected, True, buffer_bytes, progress)
    centroids = _centroids(classes, feature_dim, signal, seed)
    params = {"kind": "synthetic", "nodes": nodes, "avg_degree": avg_degree, "feature_dim": feature_dim,
              "classes": classes, "dtype": dtype, "seed": seed, "undirected": undirected,
              "p_in": p_in, "communities": communities, "rmat": list(RMAT), "signal": signal, "noise": noise,
              "fractions": list(fr), "generated_pairs": num_gen}
    with DatasetWriter(out, nodes, feature_dim, dtype, name=Path(out).name, directed=not undirected,
                       overwrite=overwrite, source=params, allow_nonfinite=allow_nonfinite,
                       features_name="synthetic features", reorder=reorder,
                       buffer_bytes=buffer_bytes, link_split=link_split) as w:
        st = scatter_passes(w, source, counts, undirected, True, True, buffer_bytes, progress)
        labels = source.labels()
        _write_features(w, labels, centroids, noise, seed, buffer_bytes, progress)
        w.write_labels_chunks((labels[a:a + LABEL_STEP] for a in range(0, nodes, LABEL_STEP)),
                              classes)
        del labels
        train, val, test = split_ids(nodes, seed, fr)  # one array per fraction of fr
        w.write_splits(train, val, test)
        assert w.num_edges is not None  # set by write_indptr in scatter_passes
        st.update(num_nodes=nodes, num_edges=w.num_edges, source_bytes=source.held_bytes)
    if stats is not None:
        stats.update(st, time_s=time.perf_counter() - t0, labels_held=True)
    return out
