"""SPRING: streaming partitioning by richest neighbours (SDT-GNN §III-B, Alg. 1).

Three steps, then the replication pass shared with every partitioner
(:mod:`ooc.partition.metrics`, :mod:`ooc.partition.split`):

(a) **Streaming node clustering** (Alg. 1 lines 2-17, after Hollocou et al.).
    For each streamed edge ``(u, v)``: an unseen endpoint opens a new cluster
    with volume ``d(.)``; if the endpoints are in different clusters and both
    volumes are ``<= tau_vol``, the endpoint of the lower-volume cluster moves
    to the other one (``vol(c_u) <= vol(c_v)`` moves ``u``), volumes updated.
    Every node also keeps its *richest neighbour* ``n_v``, the highest-degree
    neighbour seen so far (strict ``<``: on a tie the first one seen stays).
(b) **Cluster merging** (lines 18-25). Clusters are visited smallest first
    (a min-heap on size); cluster ``i`` merges into a target cluster ``j != i``
    when ``|C_i| + |C_j| <= beta * |V| / p``; the grown cluster is re-queued
    at its new size ("placed at the correct rank"), so it is scanned again;
    every re-queue follows a merge, so the loop ends after at most twice the
    number of clusters steps. The target (``merge``):

    * ``"richest"`` -- Algorithm 1 as published: the representative ``r(i)``
      is the member whose richest neighbour has the highest degree, and
      ``j`` is the cluster of ``n_{r(i)}`` (the merged cluster keeps the
      better representative of the two);
    * ``"vote"`` (default, ours) -- every member ``v`` of ``i`` votes for the
      cluster of its own richest neighbour ``n_v``; ``j`` is the most voted
      cluster that fits under the cap (ties: the one reached first in
      member order). Same per-node information (``n_v``); a visit walks
      the cluster's members (a linked list), so merging costs
      ``O(sum of visited cluster sizes)`` instead of ``O(1)`` per visit.
      Why: with ``"richest"``
      one member adjacent to a global hub decides for the whole cluster, and
      on power-law graphs hubs bridge communities -- the top richest
      neighbour of a large cluster is then a hub of another community. With
      the plurality the cluster goes where most of its members' richest
      neighbours are: a lower replication factor than ``"richest"`` on Cora and
      the synthetic graph (``python -m bench partition``; ``docs/benchmarks.md``).
(c) **Assignment** (lines 26-30): clusters sorted by size, largest first,
    each to the currently least loaded partition (by owned nodes). A cluster
    that would take that partition past ``max(floor(beta * |V| / p),
    ceil(|V| / p))`` nodes is split at that size along its member order (the
    sub-clusters merged into it stay together) and the rest goes on to the
    next least loaded partition, so node balance never exceeds ``beta`` (up
    to rounding). Algorithm 1 does not split; without the split a few large
    merged clusters can leave a partition well over the cap;
    ``info["split_clusters"]`` counts splits.

Choices the paper leaves open (all parameters of :func:`spring`):

* ``d(v)`` is the total degree in the stored (directed) graph, in-degree +
  out-degree, from one extra streaming pass (the paper assumes degrees are
  known). An undirected graph stored as both directions gets ``2 * deg``.
* ``tau_vol`` defaults to ``tau_factor * |E| / p`` with ``tau_factor = 0.1``
  (``|E|`` = stored directed edges), the value used by the authors' public
  implementation; pass ``tau_vol`` to set it absolutely.
* The comparison with ``tau_vol`` is ``<=`` (Algorithm 1; the prose says
  "smaller than").
* Ties: representative candidates with equally rich neighbours are broken
  by ``tie_break="id"`` (lowest node id wins, deterministic) or ``"random"``
  (seeded random priority; the paper breaks ties randomly). Equal-size
  clusters are visited in creation order (merging) and sorted by creation
  order (assignment); equally loaded partitions: lowest index.
* ``stream_iters`` (default 1): number of passes of the clustering over the
  edge stream (restreaming, the ``stream_iters`` option of the authors'
  public code). Pass ``k > 1`` starts from the clusters, volumes and richest
  neighbours left by pass ``k - 1`` and re-applies lines 3-17 to every edge
  (chunk order re-shuffled per pass with seed ``[seed, k]``); nodes in
  clusters whose volume is still ``<= tau_vol`` can move again, clusters
  above it stay frozen. More passes barely change the replication factor
  (``python -m bench partition --spring-args '--stream-iters K'``;
  ``docs/benchmarks.md``) while each adds a full edge pass, so the default
  stays one pass as in Algorithm 1. Most of the first pass's
  volume ends in clusters above ``tau_vol``, which no later pass can change.
* Isolated nodes (never in the stream) are singleton clusters; they cannot
  merge and fill the least loaded partitions at the end of (c).
* The stream is the dataset's CSC in chunks whose order is a seeded shuffle
  (``shuffle=True``, default) -- see :mod:`ooc.partition.edges`. Both edge
  directions update clusters and richest neighbours (Alg. 1 treats edges as
  undirected).

Memory: ``O(|V|)``: a packed per-node record (degree, cluster, richest
neighbour and its degree: 16 bytes in int32, below 2^31 nodes and degrees, else
32), int64 cluster volumes while clustering; then a priority and a member link
per node and a few per-cluster arrays (4 bytes each in int32), plus one chunk of
edges (and its destinations). Time ``O(|E| + |V| log |V|)`` for Algorithm 1's rule; the
vote rule adds the member walks of (b).
"""
from __future__ import annotations

import time

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.core.sizes import check_range
from ooc.partition._kernels import expand_dst
from ooc.partition._spring_kernels import RICHEST, VOTE, cluster_edges, merge_and_assign, new_state
from ooc.partition.base import Assignment, progress_bar
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.storage import Dataset

#: Default ``tau_vol = TAU_FACTOR * |E| / p``.
TAU_FACTOR = 0.1

#: Merge rules (see (b) above).
MERGE_RULES = {"vote": VOTE, "richest": RICHEST}


def check_thresholds(tau_vol: float | None, tau_factor: float) -> None:
    """Refuse a volume threshold that is not a finite number > 0, naming the option as the
    caller wrote it: a threshold ``<= 0`` (or NaN) lets no node move, and SPRING would
    return singleton clusters."""
    check_range("--tau-factor", tau_factor, 0, lo_open=True)
    check_range("--tau-vol", tau_vol, 0, lo_open=True)


def spring(dataset: Dataset, parts: int, *, beta: float = 1.05,
           tau_vol: float | None = None, tau_factor: float = TAU_FACTOR,
           tie_break: str = "id", merge: str = "vote", shuffle: bool = True, seed: int = 0,
           stream_iters: int = 1, chunk_edges: int = DEFAULT_CHUNK_EDGES,
           progress: bool = False) -> Assignment:
    """Partition the nodes of ``dataset`` into ``parts`` with SPRING.

    Returns an :class:`Assignment` (``owner`` int32 [N]). See the module
    docstring for every parameter's meaning and default.
    """
    if tie_break not in ("id", "random"):
        raise InvalidValue(f"tie_break must be 'id' or 'random', got {tie_break!r}")
    if merge not in MERGE_RULES:
        raise InvalidValue(f"merge must be one of {', '.join(MERGE_RULES)}, got {merge!r}")
    if int(stream_iters) != stream_iters or stream_iters < 1:
        raise InvalidValue(f"stream_iters must be an integer >= 1, got {stream_iters!r}")
    check_range("--beta", beta, 1)
    check_thresholds(tau_vol, tau_factor)
    stream_iters = int(stream_iters)
    t0 = time.perf_counter()
    n, e = dataset.num_nodes, dataset.num_edges
    stream = EdgeStream(dataset, chunk_edges=chunk_edges, shuffle=shuffle, seed=seed)
    with progress_bar(e, "spring: degrees", progress) as bar:
        deg = stream.degrees(bar)
    tau = float(tau_vol) if tau_vol is not None else tau_factor * e / parts
    st = new_state(deg)
    del deg
    vol = np.zeros(n + 1, dtype=np.int64)
    k = np.ones(1, dtype=np.int64)
    dst = np.empty(min(chunk_edges, max(e, 1)), dtype=stream.dtype)
    with progress_bar(e * stream_iters, "spring: clustering", progress) as bar:
        for it in range(stream_iters):  # restreaming: pass it starts from pass it-1's state
            for ch in stream.chunks(epoch=it):
                d = dst[: ch.b - ch.a]
                expand_dst(stream.indptr, ch.a, ch.first_dst, d)
                cluster_edges(ch.src, d, st, vol, k, tau)
                bar.update(ch.b - ch.a)
    del vol
    if tie_break == "id":
        prio = -np.arange(n, dtype=st.dtype)
    else:
        prio = np.random.default_rng(seed).permutation(n).astype(st.dtype)
    cap = beta * n / parts
    owner, n_clusters, n_merged, n_split = merge_and_assign(st, int(k[0]), prio, cap, parts,
                                                            MERGE_RULES[merge])
    return Assignment(owner=owner, algo="spring", time_s=time.perf_counter() - t0,
                      params=dict(beta=beta, tau_vol=tau, tau_factor=tau_factor,
                                  tie_break=tie_break, merge=merge, shuffle=shuffle, seed=seed,
                                  stream_iters=stream_iters, chunk_edges=chunk_edges),
                      info=dict(clusters=int(n_clusters), merged_clusters=int(n_merged),
                                split_clusters=int(n_split)))
