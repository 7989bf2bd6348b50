"""The memory a partitioning run plans for, from the sizes of what it allocates.

:func:`planned_peak` gives, per phase of :func:`ooc.partition.partition_dataset`,
the peak resident bytes *above the process's RSS once the dataset is opened*
(the imports, numba and the opened dataset's small arrays are in that baseline),
and their maximum. It needs only the shape (``N`` nodes, ``E`` stored edges, the
feature row) and the options, so it can be evaluated without data::

    python -m ooc.partition.memory_plan --nodes 111059956 --edges 3231371744 --dim 128 --parts 8

Per node (and per chunk of edges), with ``s`` = SPRING's state itemsize (4: int32
below 2^31 nodes and degrees, see :func:`~ooc.partition._spring_kernels.state_dtype`;
else 8), ``x`` = the dataset's index itemsize (4 below 2^31 nodes, else 8), ``W`` =
``ceil(p / 64)``, ``C`` = ``min(chunk_edges, E)``, ``c`` = live clusters after the
stream, ``q`` = nodes of the largest partition with its halo, ``o`` = its owned nodes:

==============  ==========================================================================
phase           what is resident (bytes)
==============  ==========================================================================
(every phase)   the pages of ``indptr.npy`` one chunk of the edge stream spans (a memmap;
                the stream drops them after each chunk): ``8 (C + 2^17)`` at most
degrees         int64 in- and out-degrees (their sum reuses the in-degrees' buffer), one
                chunk of edges  ->  **16 N + x C**
clustering      the packed state ``st`` [N, 4] (``4 s``), int64 cluster volumes (8), the
                chunk and its destinations  ->  **(8 + 4 s) N + 2 x C** (24 N in int32)
merge           ``st``, priority and member link (``s`` each), the destinations' buffer;
                per cluster: size, representative, head, tail, parent (``5 s``), then
                the vote's counters (``2 s``) and the heap (16 B an entry, 1/8 over:
                18) while merging, or int64 roots and order (``20 + 2 s``) and the int32
                owner (4 a node) at the assignment  ->  **(4 + 6 s) N + (7 s + 20) c +
                x C** (28 N + 48 c in int32)
refine          int32 owner (4) and ``np.bincount``'s int64 copy of it (8)  ->  **12 N**
metrics         owner, the replica bitmap (uint64 [N, W]: ``8 W``), the bincount copy
                ->  **(12 + 8 W) N** (20 N for p <= 64)
split           owner, bitmap, the global-to-local scratch: ``(4 + 8 W + x) N`` (16 N),
                plus the largest per-partition moment. Its id lists (owned, replicas,
                the ids in local order) are in the index dtype (``x`` a node); entries
                of the source (its offsets, its row map, its labels) are read by page
                :data:`~ooc.storage.entries.IDS_PER_READ` ids (1M) at a time, each piece
                holding the ids' int64 copy and sort order and the reader's buffer
                (16 MiB or the file if smaller, :class:`~ooc.storage.entries.EntryReader`,
                :func:`entry_read`). The moments:
                ``owner == q`` and its positions (``N + (8 + x) o``); the halo (``2 x
                q``); the local ``indptr``, int64, summed in place (``x o + (x + 8) q``);
                the edge copy (``x o + (x + 8) q + 2 x C``); sorting the feature rows by
                source row (``r`` = the row map's itemsize, 4; ``y`` = the partition's,
                4): the source rows, the int32 order and its radix scratch, then the
                sorted rows and the order's inverse (``x o + x q + (r + 2 y) q``: ``4 o
                + 16 q``); the labels (a chunk of 1M with the owned nodes' among them,
                beside the written row map); the feature copy: ``x o + (x + r + y) q`` +
                one chunk of rows (64 MiB), the page buffer it was read into (up to 64
                MiB; none for rows of whole pages) and the larger of the written chunk's
                mapped pages and the NaN check's two masks (192 MiB for 512-byte rows);
                ``global_ids.npy``'s int64 copy (``x o + (x + 8 + y) q``). Linked
                features (``features="link"``) sort and copy nothing: the source rows
                read by piece are the row map written (``x o + (x + r) q`` + a piece)
==============  ==========================================================================

The edge partitioners (``hash``, ``dbh``, ``greedy``, ``hdrf``) replace clustering and
merge by one phase, ``assign``: int64 degrees (8; none resident for ``hash``, which
never writes them), remaining degrees (8, greedy), the vertex-cut bitmap (``8 W``), the
int32 majority votes (16) and last edges (4, ``ownership="last"``), then the owner (4)
and ``bits.any(axis=1)``'s masks (``1 + W``):
**(37 + 9 W) N** for ``dbh``/``hdrf`` (``greedy`` + 8, ``hash`` - 8) + ``x C``; their
bitmap is still held during ``refine``.

No phase keeps what an earlier one freed: :func:`~ooc.partition.partition_dataset` fixes
glibc's mmap threshold (:func:`ooc.core.memory.tune_malloc`), so an array of 256 KiB or more
goes back to the OS when it is freed. Left to raise its threshold to the largest array it
had freed, glibc would keep up to twice that of SPRING's per-cluster arrays in its heap
after the merge.

What the plan does not know without running, it bounds or assumes: ``q`` defaults to
``N`` (a partition never holds more), ``o`` to SPRING's node cap
``max(floor(beta N / p), ceil(N / p))`` (``q`` for the edge partitioners), ``c`` to
``N / 8``, the degrees to fit int32. Pass the counts to plan for a known partition.
How the plan compares with measured peaks is in docs/benchmarks.md (Partitioning).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ooc.cli import main_wrapper
from ooc.core.errors import InvalidValue
from ooc.partition._spring_kernels import state_dtype
from ooc.partition.base import ALGORITHMS as ALGOS
from ooc.partition.edges import DEFAULT_CHUNK_EDGES
from ooc.partition.split import FEATURE_CHUNK_BYTES, ID_PIECE, LABEL_CHUNK
from ooc.storage import Dataset
from ooc.storage.direct import DEFAULT_MAX_BUFFER_PAGES as MAX_BUFFER_PAGES
from ooc.storage.entries import PIECE_ENTRIES
from ooc.storage.layout import PAGE, index_dtype
from ooc.storage.writer import CHECK_ROWS

#: The label reader's page buffer at its largest (:class:`~ooc.storage.entries.EntryReader`).
ENTRY_BUFFER = PIECE_ENTRIES * PAGE
#: Live clusters after SPRING's stream assumed per node when the count is not given.
CLUSTER_FRACTION = 0.125
#: Bytes per heap entry of the merge (a numba list of (int64, int64), 1/8 over-allocated).
HEAP_ENTRY_BYTES = 18
def entry_read(ids: int, file_bytes: int) -> int:
    """Bytes one :meth:`~ooc.storage.Dataset.entries` request of ``ids`` ids holds beside
    its result: their int64 copy and sort order (16 bytes an id, :data:`ID_PIECE` ids at a
    time) and the reader's page buffer (:data:`ENTRY_BUFFER`, at most the file's pages)."""
    pages = -(-int(file_bytes) // PAGE)
    return 16 * min(ID_PIECE, int(ids)) + min(ENTRY_BUFFER, pages * PAGE)


def state_itemsize(num_nodes: int, max_degree: int | None = None) -> int:
    """SPRING's state itemsize (:func:`~ooc.partition._spring_kernels.state_dtype`): 4 when
    ``num_nodes + 1`` and the largest total degree are below 2^31, else 8. ``max_degree``
    None: assumed below 2^31."""
    return state_dtype(int(num_nodes), int(max_degree or 0)).itemsize


#: Bytes per row of a feature chunk that the reader's index arrays take (int64 each):
#: the target rows, and when the chunk's pages are read in pieces (more pages than the
#: buffer holds) its sort order, sorted ids, page of each, piece marks and numbers and
#: the piece's targets; then each piece's sort keys and buffer slots.
READ_INDEX_BYTES, READ_PIECES_INDEX_BYTES = 24, 72
#: Bytes per page read: its id and its run (offset, length, place in the buffer).
READ_PAGE_BYTES = 32


def _feature_copy_bytes(rows: int, dim: int, itemsize: int, source_rows: int) -> int:
    """Peak bytes of the split's feature copy for a partition of ``rows`` rows, besides
    its id lists: a chunk of rows (:data:`FEATURE_CHUNK_BYTES`), the page buffer it was
    read into (none for rows of whole pages, read in place), and the largest of the
    reader's index arrays (:data:`READ_PIECES_INDEX_BYTES` a row: 9 MiB for 131072
    512-byte rows, 288 MiB for 4M 16-byte rows), the NaN check's two boolean masks and
    the written chunk's mapped pages."""
    row_bytes = dim * itemsize
    chunk_rows = min(rows, max(1, FEATURE_CHUNK_BYTES // max(1, row_bytes)))
    if chunk_rows <= 0:
        return 0
    out = chunk_rows * row_bytes
    per_page = PAGE // row_bytes if row_bytes <= PAGE else 0
    pages_per_row = 1 if row_bytes <= PAGE else -(-row_bytes // PAGE)
    source_pages = -(-source_rows // per_page) if per_page else source_rows * pages_per_row
    pages = min(chunk_rows * pages_per_row, source_pages)
    if row_bytes % PAGE == 0:
        buf = 0
        written = chunk_rows * pages_per_row * PAGE
        index = chunk_rows * READ_INDEX_BYTES + pages * READ_PAGE_BYTES
    else:
        buf = min(MAX_BUFFER_PAGES, pages) * PAGE
        written = (-(-chunk_rows // per_page) + 1) * PAGE if per_page \
            else chunk_rows * pages_per_row * PAGE
        pieced = chunk_rows * pages_per_row > MAX_BUFFER_PAGES
        index = (chunk_rows * (READ_PIECES_INDEX_BYTES if pieced else READ_INDEX_BYTES)
                 + min(MAX_BUFFER_PAGES, pages) * READ_PAGE_BYTES)
    masks = 2 * min(chunk_rows, CHECK_ROWS) * dim
    return out + buf + max(written, masks, index)


@dataclass(frozen=True)
class Sizes:
    """The sizes every phase's terms are made of (bytes, or counts where named so)."""

    #: nodes ``N``, stored edges ``E``, partitions ``p`` (counts)
    n: int
    e: int
    p: int
    #: the dataset's index itemsize ``x``
    x: int
    #: uint64 words of a node's replica bits, ``ceil(p / 64)`` (a count)
    words: int
    #: one chunk of the edge stream's ids (``x C``)
    chunk: int
    #: the pages of ``indptr.npy`` one chunk spans
    indptr: int
    #: nodes of the largest partition with its halo ``q``, and its owned nodes ``o`` (counts)
    q: int
    o: int

    @property
    def owner(self) -> int:
        """The int32 owner of every node."""
        return 4 * self.n

    @property
    def bits(self) -> int:
        """The replica bitmap (uint64 [N, W])."""
        return 8 * self.words * self.n

    @property
    def bincount(self) -> int:
        """``np.bincount(owner)``'s int64 copy of the owner."""
        return 8 * self.n

    @property
    def degrees(self) -> int:
        """The ``degrees`` phase: int64 in- and out-degrees (their sum reuses the
        in-degrees' buffer: numpy elides the temporary), one chunk."""
        return self.indptr + 2 * 8 * self.n + self.chunk


def sizes_of(n: int, e: int, p: int, x: int, chunk_edges: int, algo: str, beta: float,
             part_nodes: int | None, part_owned: int | None) -> Sizes:
    """The :class:`Sizes` of a run; ``q`` defaults to ``N``, ``o`` to SPRING's node cap
    (``q`` for the edge partitioners)."""
    # the pages of indptr.npy one chunk spans (a chunk's edges' worth of entries and 1 MiB:
    # nodes without in-edges widen it): the stream drops them after each chunk
    indptr = 8 * min(n + 1, min(max(1, int(chunk_edges)), max(e, 1)) + (1 << 17))
    q = n if part_nodes is None else min(n, int(part_nodes))
    cap = max(math.floor(beta * n / p), -(-n // p))
    if part_owned is not None:
        o = min(q, int(part_owned))
    else:
        o = min(q, cap) if algo == "spring" else q
    return Sizes(n=n, e=e, p=p, x=x, words=-(-p // 64),
                 chunk=min(max(1, int(chunk_edges)), e) * x, indptr=indptr, q=q, o=o)


def spring_phases(t: Sizes, s: int, c: int, merge: str, tie_break: str) -> dict[str, int]:
    """SPRING's ``degrees``, ``clustering`` and ``merge`` (``s``: its state itemsize,
    ``c``: live clusters after the stream)."""
    n = t.n
    held = t.indptr + 4 * s * n + s * n + t.chunk     # st, prio, the destinations' buffer
    prio_tmp = s * n if tie_break == "id" else 8 * n   # -arange / a permutation
    vote = 2 * s * c if merge == "vote" else 0
    return {
        "degrees": t.degrees,
        # new_state (deg beside st), then the stream (st, int64 volumes, chunk + dst)
        "clustering": t.indptr + 4 * s * n + max(8 * n, 8 * (n + 1) + 2 * t.chunk),
        "merge": held + max(
            prio_tmp,
            s * (n + 1),                                                   # renumbering
            s * n + (5 * s + HEAP_ENTRY_BYTES) * c + vote,                 # merging
            s * n + 5 * s * c + (20 + 2 * s) * c + t.owner),               # assignment
    }


def edge_phases(t: Sizes, algo: str, ownership: str) -> dict[str, int]:
    """An edge partitioner's ``degrees`` (``dbh``, ``greedy``) and ``assign``."""
    n = t.n
    # int64 degrees (hash never writes its zeros: no page of them is resident), the
    # remaining degrees (greedy), the bitmap, int32 votes (4 arrays), the last edge
    assign = (t.indptr + (0 if algo == "hash" else 8 * n) + (8 * n if algo == "greedy" else 0)
              + t.bits + 16 * n + (4 * n if ownership == "last" else 0))
    out = {"degrees": t.degrees} if algo in ("dbh", "greedy") else {}
    out["assign"] = assign + max(t.chunk, t.owner + (1 + t.words) * n)
    return out


def refine_phase(t: Sizes, vertex_cut: int) -> int:
    """``refine``: the owner, an edge partitioner's bitmap, the bincount or a chunk."""
    return t.indptr + t.owner + vertex_cut + max(t.bincount, t.chunk)


def metrics_phase(t: Sizes) -> int:
    """``metrics``: the owner, the replica bitmap, the bincount or a chunk."""
    return t.indptr + t.owner + t.bits + max(t.bincount, t.chunk)


def split_moments(t: Sizes, *, halo_hops: int, row_map: bool, row_map_itemsize: int,
                  feature_dim: int, feature_itemsize: int, link: bool) -> dict[str, int]:
    """The split's moments for the largest partition, besides what the split holds
    throughout (see the module docstring)."""
    n, x, q, o, chunk = t.n, t.x, t.q, t.o, t.chunk
    r = int(row_map_itemsize) if row_map else 0
    y = np.dtype(index_dtype(q)).itemsize       # the partition's sort order, its row map
    # the row map the writer holds: the partition's (sorted rows) or the source rows
    w = (r or x) if link else (y if row_map else 0)
    inner = o if halo_hops == 1 else q                  # nodes with full in-lists
    if row_map and not link:  # the source rows read by piece; the int32 order (and its
        # scratch), the sorted source rows, the order's inverse
        sort = x * o + x * q + max(r * q + (r + 8) * min(ID_PIECE, q)
                                   + entry_read(q, r * n), (r + 2 * y) * q, (2 * r + y) * q)
    else:         # rows in node order or linked: nothing sorted
        sort = x * o + x * q
    return {
        # owner == q and its int64 positions, then owned, replicas and the ids
        "owned": n + (8 + x) * o,
        "halo": 2 * x * q + (chunk if halo_hops > 1 else 0),
        # owned, ids, the int64 local offsets; a piece's source offsets [P, 2] read
        "indptr": x * o + (x + 8) * q + 16 * min(ID_PIECE, inner)
        + entry_read(inner, 8 * (n + 1)),
        "edges": x * o + (x + 8) * q + 2 * chunk,
        "sort": sort,
        # a chunk of labels, the owned nodes' labels in it read by page
        "labels": x * o + (x + w) * q + 8 * min(q, LABEL_CHUNK)
        + entry_read(min(o, LABEL_CHUNK), 8 * n),
        "features": (x * o + (x + w) * q + (r + 8) * min(ID_PIECE, q)
                     + entry_read(q, (r or x) * n)
                     if link else x * o + (x + r + w) * q
                     + _feature_copy_bytes(q, feature_dim, feature_itemsize, n)),
        # global_ids.npy's int64 copy
        "ids": x * o + (x + 8 + w) * q,
    }


def split_phase(t: Sizes, moments: dict[str, int] | None) -> int:
    """``split``: the owner, the bitmap and the global-to-local scratch beside the
    largest moment (``moments`` None: no split, only ``owner.npy``'s int32 copy)."""
    held = t.indptr + t.owner + t.bits
    if moments is None:
        return held + t.owner
    return held + t.x * t.n + max(moments.values())


def _check(n: int, e: int, p: int, feature_dim: int, halo_hops: int, algo: str,
           feature_dtype) -> np.dtype:
    """Refuse a shape or options no run has; the feature dtype."""
    if algo not in ALGOS:
        raise InvalidValue(f"unknown algorithm {algo!r} (choose from {', '.join(ALGOS)})")
    if n < 1 or e < 0 or p < 1 or feature_dim < 1 or halo_hops < 1:
        raise InvalidValue(f"need nodes >= 1, edges >= 0, parts >= 1, dim >= 1 and halo hops "
                           f">= 1, got {n}, {e}, {p}, {feature_dim}, {halo_hops}")
    try:
        return np.dtype(feature_dtype)
    except TypeError:
        raise InvalidValue(f"unknown feature dtype {feature_dtype!r}") from None


def planned_peak(num_nodes: int, num_edges: int, *, parts: int, index_itemsize: int = 4,
                 feature_dim: int = 128, feature_dtype: str | np.dtype = "float32",
                 chunk_edges: int = DEFAULT_CHUNK_EDGES, split: bool = True,
                 halo_hops: int = 1, algo: str = "spring", refine_passes: int = 1,
                 beta: float = 1.05, merge: str = "vote", tie_break: str = "id",
                 ownership: str = "majority", row_map: bool = True,
                 row_map_itemsize: int = 4, max_degree: int | None = None,
                 clusters: int | None = None, part_nodes: int | None = None,
                 part_owned: int | None = None, features: str = "copy") -> dict:
    """Peak bytes above the RSS after opening the dataset, per phase of
    :func:`ooc.partition.partition_dataset` (see the module docstring for each term).

    Args:
        num_nodes, num_edges: ``N`` and the stored (directed) edges ``E``.
        parts: ``p``. index_itemsize: the dataset's index dtype (4 or 8).
        feature_dim, feature_dtype: a feature row (128 float32 = 512 bytes).
        chunk_edges, split, halo_hops, algo, refine_passes, beta, merge, tie_break,
            ownership: the run's options (as for ``partition_dataset``).
        row_map: the dataset stores its rows in a locality order (``feature_rows.npy``,
            of ``row_map_itemsize`` bytes a node); the split then sorts each partition's rows.
        max_degree: the largest total degree (None: below 2^31), for SPRING's dtype.
        clusters: live clusters after SPRING's stream (None: ``N / 8``).
        part_nodes: nodes of the largest partition with its halo (None: ``N``).
        part_owned: owned nodes of the partition planned (None: SPRING's cap, or
            ``part_nodes`` for the edge partitioners).
        features: ``copy`` or ``link`` (``ooc.partition --features``).

    Returns:
        ``{"phases": {phase: bytes}, "peak_phase": name, "peak_bytes": max,
        "per_node": {phase: bytes / N}, "assumed": {...}}`` (ints; phases in run order).
    """
    n, e, p = int(num_nodes), int(num_edges), int(parts)
    fdt = _check(n, e, p, feature_dim, halo_hops, algo, feature_dtype)
    t = sizes_of(n, e, p, int(index_itemsize), chunk_edges, algo, beta, part_nodes, part_owned)
    assumed: dict = {"part_nodes": t.q, "part_owned": t.o}
    if algo == "spring":
        s = state_itemsize(n, max_degree)
        c = max(1, int(n * CLUSTER_FRACTION) if clusters is None else int(clusters))
        assumed.update(state_itemsize=s, clusters=c)
        phases = spring_phases(t, s, c, merge, tie_break)
        vertex_cut = 0
    else:
        phases = edge_phases(t, algo, ownership)
        vertex_cut = t.bits   # an edge partitioner's bitmap is still held while refining
    if refine_passes:
        phases["refine"] = refine_phase(t, vertex_cut)
    phases["metrics"] = metrics_phase(t)
    moments = split_moments(t, halo_hops=halo_hops, row_map=row_map,
                            row_map_itemsize=row_map_itemsize, feature_dim=feature_dim,
                            feature_itemsize=fdt.itemsize, link=features == "link") \
        if split else None
    phases["split"] = split_phase(t, moments)
    if moments is not None:
        assumed["split_moment"] = max(moments, key=lambda k: moments[k])
    peak_phase = max(phases, key=lambda k: phases[k])
    return {"phases": {k: int(v) for k, v in phases.items()}, "peak_phase": peak_phase,
            "peak_bytes": int(phases[peak_phase]),
            "per_node": {k: round(v / n, 2) if n else 0.0 for k, v in phases.items()},
            "assumed": assumed}


def plan_for(dataset: Dataset, parts: int, **options) -> dict:
    """:func:`planned_peak` for an opened :class:`~ooc.storage.Dataset` (its shape,
    index dtype, feature row and row map); ``options`` as for :func:`planned_peak`."""
    row_of = getattr(dataset, "row_of", None)
    return planned_peak(dataset.num_nodes, dataset.num_edges, parts=parts,
                        index_itemsize=np.dtype(dataset.index_dtype).itemsize,
                        feature_dim=dataset.feature_dim, feature_dtype=dataset.layout.dtype,
                        row_map=row_of is not None,
                        row_map_itemsize=4 if row_of is None else row_of.dtype.itemsize,
                        **options)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m ooc.partition.memory_plan``."""
    ap = argparse.ArgumentParser(
        prog="python -m ooc.partition.memory_plan",
        description="Planned peak memory of python -m ooc.partition for a graph's shape "
                    "(bytes above the RSS once the dataset is opened).")
    ap.add_argument("--nodes", type=int, required=True, help="number of nodes N")
    ap.add_argument("--edges", type=int, required=True, help="stored (directed) edges E")
    ap.add_argument("--dim", type=int, default=128, help="feature dim (default 128)")
    ap.add_argument("--dtype", default="float32", help="feature dtype (default float32)")
    ap.add_argument("--parts", type=int, default=8, help="partitions (default 8)")
    ap.add_argument("--algo", default="spring", choices=ALGOS,
                    help="algorithm (default spring)")
    ap.add_argument("--halo-hops", type=int, default=1)
    ap.add_argument("--features", choices=("copy", "link"), default="copy",
                    help="partitions copy their feature rows or link the dataset's")
    ap.add_argument("--no-row-map", action="store_true",
                    help="the features are stored in node order (no feature_rows.npy)")
    ap.add_argument("--part-nodes", type=int, default=None,
                    help="nodes of the largest partition with its halo (default N)")
    ap.add_argument("--clusters", type=int, default=None,
                    help="SPRING's live clusters after the stream (default N/8)")
    ap.add_argument("--baseline", type=float, default=0.0,
                    help="RSS after opening the dataset, MiB, added to the total")
    return ap


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    """Print the planned peak of ``python -m ooc.partition`` for the shape in ``argv``; the
    exit status."""
    a = build_parser().parse_args(argv)
    plan = planned_peak(a.nodes, a.edges, parts=a.parts, algo=a.algo, feature_dim=a.dim,
                        feature_dtype=a.dtype, halo_hops=a.halo_hops, row_map=not a.no_row_map,
                        index_itemsize=index_dtype(a.nodes).itemsize,
                        part_nodes=a.part_nodes, clusters=a.clusters, features=a.features)
    mib = 1 << 20
    for k, v in plan["phases"].items():
        print(f"{k:11s} {v / mib:12.1f} MiB  {plan['per_node'][k]:7.2f} B/node")
    total = plan["peak_bytes"] + a.baseline * mib
    print(f"peak: {plan['peak_phase']} {plan['peak_bytes'] / mib:.1f} MiB"
          + (f" + baseline {a.baseline:.0f} MiB = {total / mib:.1f} MiB" if a.baseline else "")
          + f" ({total / (1 << 30):.2f} GiB); assumed {plan['assumed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
