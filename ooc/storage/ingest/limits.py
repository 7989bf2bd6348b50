"""How many nodes an ingest may allocate for, decided before it allocates.

Ingest memory is O(N): about :data:`BYTES_PER_NODE` bytes per node (the
count pass's in-degrees, int64; and an edge list's labels file, loaded whole;
``indptr`` and OGB's labels go to their files in pieces) plus the ingest
buffer. N comes from ``--num-nodes``, the features'
rows, or the largest id in the edges; one stray huge id must not make the
process allocate until the kernel kills it. So:

- a node count given or implied by an input file must fit in three quarters
  of the memory available now (``MemAvailable``, and the memory cgroup's
  limit minus its usage when this process runs in one);
- a count implied by the largest edge id must in addition be at most twice
  the number of edges the input can hold (every node an edge touches), or
  :data:`MIN_NODES_FROM_IDS` when that is more; an input whose edge count
  cannot be bounded from its size (gzip) has only the memory limit.
"""
from __future__ import annotations

import os
from pathlib import Path

from ooc.core.errors import InvalidValue
from ooc.storage.direct_files import READ_STAGING
from ooc.storage.ingest import _kernels as K
from ooc.storage.ingest.edge_buckets import MIN_WINDOWS
from ooc.storage.layout import FeatureLayout
from ooc.storage.read_ahead import CHUNKS_HELD
from ooc.storage.reorder import STAGING_BYTES, reorder_peak

BYTES_PER_NODE = 16
#: Of :data:`BYTES_PER_NODE`, an edge list's labels file, loaded whole (int64).
LABEL_BYTES_PER_NODE = 8
#: Largest ids up to this many nodes are always accepted without --num-nodes
#: (when memory allows).
MIN_NODES_FROM_IDS = 1 << 22


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_room() -> int | None:
    """Bytes this process's memory cgroup (v1 or v2) may still grow by; None
    without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if "memory" in ctrl.split(","):
            base = Path("/sys/fs/cgroup/memory") / rel
            limit, usage = (_read_int(base / "memory.limit_in_bytes"),
                            _read_int(base / "memory.usage_in_bytes"))
        elif ctrl == "":
            base = Path("/sys/fs/cgroup") / rel
            limit, usage = _read_int(base / "memory.max"), _read_int(base / "memory.current")
        else:
            continue
        if limit is not None and usage is not None and limit < (1 << 60):
            return max(0, limit - usage)
    return None


def available_memory() -> int:
    """Bytes of memory available to this process now (``MemAvailable``, or the
    cgroup's room when smaller)."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    room = cgroup_room()
    return avail if room is None else min(avail, room)


def _gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def memory_node_limit() -> int:
    """Most nodes whose ingest fits in three quarters of the available memory."""
    return int(available_memory() * 3 // 4) // BYTES_PER_NODE


def check_node_count(num_nodes: int, what: str) -> None:
    """Refuse a node count whose ingest would not fit in memory.

    ``what`` says where the count comes from (e.g. ``--num-nodes 3000000000``).
    """
    limit = memory_node_limit()
    if num_nodes > limit:
        raise InvalidValue(f"{what}: {num_nodes} nodes need about {_gib(num_nodes * BYTES_PER_NODE)} "
                       f"of memory to ingest, more than the {_gib(limit * BYTES_PER_NODE)} "
                       f"available (three quarters of free memory)")


def id_node_limit(max_edges: int | None) -> int:
    """Most nodes the largest edge id may imply without ``--num-nodes``, for an
    input that holds at most ``max_edges`` edges (None: unknown)."""
    mem = memory_node_limit()
    return mem if max_edges is None else min(mem, max(MIN_NODES_FROM_IDS, 2 * max_edges))


def load_kernels() -> None:
    """Load numba's runtime and the count pass's kernel (from numba's cache, or compiled
    here), as every ingest does in its first pass: an RSS measured after this is the base
    :func:`planned_peak` adds to (the first kernel loaded costs tens of MiB)."""
    import numpy as np


    ids = np.zeros(1, dtype=np.int64)
    K.count_in_degrees(ids, ids, np.zeros(1, dtype=np.int64), False, False)


def planned_peak(base: int, num_nodes: int, stored_edges: int, buffer_bytes: int,
                 index_itemsize: int = 4, row_bytes: int = 512,
                 reordered: FeatureLayout | None = None, longest: int | None = None,
                 routed: bool | None = None, labels_held: bool = True) -> int:
    """The peak RSS an ingest plans for, from what it wrote: ``base`` (the RSS before it,
    numba's runtime loaded: :func:`load_kernels`),
    :data:`BYTES_PER_NODE` per node (:data:`LABEL_BYTES_PER_NODE` fewer when no labels
    file was loaded whole: ``labels_held`` False), and the larger of its two phases' buffers:

    - a scatter window (its ids: 3/4 of the buffer at most, and no more than the
      stored edges; its nodes' pointers, cursors and degrees: 32 bytes a node, a
      quarter of the buffer at most) beside the edge chunks read ahead
      (:data:`~ooc.storage.read_ahead.CHUNKS_HELD` of them, int64 sources and targets
      and their copies: 32 bytes an edge, together a quarter of the buffer at most);
      with ``routed`` entries (:mod:`.edge_buckets`; None: guessed from the edge count,
      as routing starts at three windows) the window is beside the pieces of its
      entries read ahead (together an eighth of the buffer) instead, and the routing
      pass before it holds the chunks, one chunk's entries grouped by range (16 bytes
      an edge with int32 ids, 32 with int64), their ranges (8 bytes an edge) and a
      staging buffer;
    - a feature chunk (a quarter of the buffer) as read and converted to the stored
      dtype or laid out in pages (rows that fill pages exactly are written as read), or
      the :data:`~ooc.storage.read_ahead.CHUNKS_HELD` smaller chunks read ahead and one
      of them converted;
    - when the feature rows were stored in a locality order (``reordered``: their
      layout), the reorder (:func:`~ooc.storage.reorder.reorder_peak`; ``longest``: the
      longest in-neighbour list, when known);

    the last two with the buffer a chunk is read through with ``O_DIRECT``
    (:data:`~ooc.storage.direct_files.READ_STAGING`).
    """
    b = int(buffer_bytes)
    n, e = int(num_nodes), int(stored_edges)
    window = min(3 * b // 4, e * index_itemsize) + min(b // 4, 32 * n)
    one = min(b // (4 * CHUNKS_HELD), 32 * e)  # a chunk: 32 bytes an edge
    chunk = CHUNKS_HELD * one
    if routed is None:
        routed = e * index_itemsize > (MIN_WINDOWS - 1) * (3 * b // 4)
    if routed:
        edges = one // 32
        route = chunk + edges * (8 + 4 * index_itemsize) + min(STAGING_BYTES, b // 16)
        scatter = max(window + b // 8, route)
    else:
        scatter = window + chunk
    features = 2 * min(b // 4, n * int(row_bytes)) + 4096
    reorder = 0 if reordered is None else reorder_peak(reordered, b, longest)
    read = READ_STAGING + 4096
    per_node = BYTES_PER_NODE - (0 if labels_held else LABEL_BYTES_PER_NODE)
    return int(base) + per_node * n + max(scatter, features + read, reorder + read)
