"""The Ginex neighbor cache (Ginex §3.2, Fig. 10).

Static: the in-neighbour lists of the nodes with the highest ratio
``out_degree / in_degree`` (benefit / cost), in that order, as many as fit in
a byte budget. ``slots`` (an :class:`~ooc.storage.id_map.IdMap`, sized by
the cached nodes, not by N) maps a cached node to its address in
``cache_array`` (the index dtype), which holds for each cached node its
neighbour count and then its neighbour ids.

The budget counts everything resident: ``slots`` (at most
:func:`map_bytes_per_node` per cached node, or a direct table of 4 or 8 bytes
per node where that is smaller) plus ``cache_array``. Lists are placed in
node-id order, so building from a memmap of ``indices.bin`` reads it
sequentially.

Built once and saved beside the dataset as
``<dataset>/neighbor_cache/<budget_bytes>/`` (written atomically; dataset
readers ignore the extra folder), or, when the dataset folder is not
writable, in the user cache folder (``$OOC_CACHE``, else
``$XDG_CACHE_HOME/ooc`` or ``~/.cache/ooc``) under
``neighbor_cache/<dataset identity>/<budget_bytes>/``, the identity being a
hash of the dataset's ``meta.json`` (sizes and checksums of its files). A
saved cache records the sha256 of its arrays (``checksum``) and the
fingerprint of the dataset it was built from (``source``,
:meth:`~ooc.storage.Dataset.fingerprint`); when loaded it is checked against
both and against ``indptr`` (entries inside the array, counts equal to the
in-degrees, ids in range), and rebuilt, with a one-line note, when any fails
(an edit in range changes no count, only the checksum shows it); ids out of
range while building are an error naming ``indices.bin`` and the position. A saved cache of a budget up to
:data:`REUSE_SHARE` smaller is used rather than building another (the budget a
run plans varies a little from run to run: each would otherwise build and
keep a cache of its own).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from ooc.caches import _neighbor_cache_kernels as NK
from ooc.core.errors import DatasetError
from ooc.core.notes import note
from ooc.storage.atomic import atomic_dir, write_json
from ooc.storage.dataset import index_range_error
from ooc.storage.id_map import IdMap
from ooc.storage.neighbors import NeighborRequest, NeighborSource
from ooc.storage.pagecache import release_mapped
from ooc.storage.probe import cache_dir as user_root

__all__ = ["MIN_CACHE_BYTES", "NeighborCache", "build_bytes", "build_neighbor_cache", "cache_dir",
           "load_or_build_neighbor_cache", "full_cache_bytes", "compute_out_degrees",
           "user_cache_dir"]

CACHE_VERSION = 2
#: The smallest neighbor cache built (bytes): below one page it would hold next to nothing.
MIN_CACHE_BYTES = 4096


def map_bytes_per_node(num_nodes: int, max_address: int) -> int:
    """The most bytes the map takes per cached node (see :class:`~ooc.storage.id_map.IdMap`)."""
    return IdMap.max_bytes_per_entry(max(0, num_nodes - 1), max_address)


@dataclass
class NeighborCache:
    """A loaded neighbor cache.

    Attributes:
        slots: cached node -> address (:class:`~ooc.storage.id_map.IdMap`):
            ``cache_array[a]`` is the node's count and ``cache_array[a+1 : a+1+count]``
            its in-neighbours.
        cache_array: int32/int64 flat array.
        meta: build information (budget, cached nodes, bytes, ...).
    """

    slots: IdMap
    cache_array: np.ndarray
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, nodes: np.ndarray, addresses: np.ndarray, cache_array: np.ndarray,
                    meta: dict) -> "NeighborCache":
        """The cache of ``nodes`` (int64 [k], in [0, meta's num_nodes)) whose entries start
        at ``addresses`` (int64 [k])."""
        nodes = np.asarray(nodes, dtype=np.int64)
        m = IdMap(nodes.shape[0], max(0, int(meta["num_nodes"]) - 1),
                  max(0, cache_array.shape[0] - 1))
        m.put(nodes, addresses)
        return cls(m, cache_array, meta)

    @property
    def nodes(self) -> np.ndarray:
        """int64 [k]: the cached nodes, sorted (computed from the map)."""
        return self.slots.ids()

    @property
    def addresses(self) -> np.ndarray:
        """int64 [k]: where the entry of each of :attr:`nodes` starts."""
        return self.slots.get(self.nodes)

    @property
    def num_cached(self) -> int:
        return len(self.slots)

    @property
    def nbytes(self) -> int:
        """Bytes resident while it serves: the map and the lists."""
        return int(self.slots.nbytes + self.cache_array.nbytes)

    def neighbors(self, v: int) -> np.ndarray | None:
        """In-neighbours of ``v`` (a view), or None when not cached."""
        a = int(self.slots.get(np.array([v]))[0])
        if a < 0:
            return None
        return self.cache_array[a + 1:a + 1 + int(self.cache_array[a])]

    def save(self, folder: str | os.PathLike, overwrite: bool = True) -> Path:
        """Write to ``folder`` atomically (nodes.npy, addresses.npy, cache_array.npy,
        meta.json with the arrays' :func:`arrays_checksum` as ``checksum``)."""
        nodes = self.nodes
        addresses = self.slots.get(nodes)
        self.meta["checksum"] = arrays_checksum(nodes, addresses, self.cache_array)
        with atomic_dir(folder, overwrite=overwrite, what="neighbor_cache") as tmp:
            np.save(tmp / "nodes.npy", nodes)
            np.save(tmp / "addresses.npy", addresses)
            np.save(tmp / "cache_array.npy", self.cache_array)
            write_json(tmp / "meta.json", self.meta)
        return Path(folder)

    @classmethod
    def load(cls, folder: str | os.PathLike, mmap: bool = False) -> "NeighborCache":
        """Load a saved cache (into RAM unless ``mmap``).

        Raises:
            DatasetError: a file is missing, unreadable or does not match meta.json.
        """
        folder = Path(folder)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
                raise DatasetError(folder / "meta.json", "not a neighbor cache of version "
                                                         f"{CACHE_VERSION}")
            mode: Literal["r"] | None = "r" if mmap else None
            nodes = np.load(folder / "nodes.npy", allow_pickle=False)
            addr = np.load(folder / "addresses.npy", allow_pickle=False)
            ca = np.load(folder / "cache_array.npy", mmap_mode=mode, allow_pickle=False)
            k = meta.get("num_cached")
            n = meta.get("num_nodes")
            ok = (nodes.dtype == np.int64 and nodes.shape == (k,) and addr.dtype == np.int64
                  and addr.shape == (k,) and ca.dtype.name == meta.get("index_dtype")
                  and ca.shape == (meta.get("cache_entries"),) and isinstance(n, int)
                  and (k == 0 or (bool((np.diff(nodes) > 0).all()) and 0 <= nodes[0]
                                  and nodes[-1] < n)))
            same = ok and meta.get("checksum") == arrays_checksum(nodes, addr, ca)
        except DatasetError:
            raise
        except (OSError, ValueError, EOFError, UnicodeDecodeError) as e:
            raise DatasetError(folder, f"unreadable neighbor cache ({e})") from None
        if not ok:
            raise DatasetError(folder, "neighbor cache files do not match its meta.json")
        if not same:
            raise DatasetError(folder, "neighbor cache files do not match their checksum in "
                                       "its meta.json (edited or corrupted)")
        return cls.from_arrays(nodes, addr, ca, meta)

    def check(self, indptr: np.ndarray, indices_path: str | os.PathLike = "indices.bin") -> None:
        """Check the cache against ``indptr`` (int64 [N+1]) and the id range.

        Raises:
            DatasetError: naming ``indices_path`` and the position of an id out
                of range, or the cache (an entry that does not fit ``indptr``).
        """
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        n = indptr.shape[0] - 1
        if self.meta.get("num_nodes") != n:
            raise DatasetError(indices_path, f"neighbor cache covers {self.meta.get('num_nodes')} "
                                             f"nodes, the graph has {n}")
        nodes = self.nodes
        status = np.zeros(nodes.shape[0], dtype=np.int8)
        NK.check_cache(nodes, self.slots.get(nodes), self.cache_array, indptr, n, status)
        bad = np.flatnonzero(status)
        if not bad.size:
            return
        v = int(nodes[bad[0]])
        if status[bad[0]] == 1:
            raise DatasetError(indices_path, f"neighbor cache entry of node {v} does not match "
                                             f"its in-degree")
        ids = self.neighbors(v)
        assert ids is not None  # status 2 is set only for a node with a cache entry
        j = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
        raise index_range_error(Path(indices_path), int(indptr[v]) + j, int(ids[j]), n)


def arrays_checksum(nodes: np.ndarray, addresses: np.ndarray, cache_array: np.ndarray) -> str:
    """sha256 (hex) of a cache's arrays (nodes int64 [k], addresses int64 [k], the
    cache array), in that order, over their bytes (a memmap is read as it is hashed)."""
    h = hashlib.sha256()
    for arr in (nodes, addresses, cache_array):
        arr = np.ascontiguousarray(arr)
        for a in range(0, arr.shape[0], 1 << 20):
            h.update(arr[a:a + (1 << 20)].tobytes())  # a million entries a time
    return h.hexdigest()


#: Neighbour ids copied from the ``indices.bin`` memmap between two releases of its pages.
FILL_SLICE_ENTRIES = 1 << 24
#: The most nodes of one range of the fill (its chosen ids, sizes, addresses: int64 each).
FILL_SLICE_NODES = 1 << 20


def compute_out_degrees(indices: np.ndarray, num_nodes: int, chunk: int = 1 << 24,
                        dtype=np.int64) -> np.ndarray:
    """``dtype`` [N] out-degrees from an indices array/memmap, streamed in chunks (a
    memmap's pages released after each).

    Raises:
        DatasetError: an id outside ``[0, num_nodes)``, naming the file and position.
    """
    deg = np.zeros(num_nodes, dtype=dtype)
    for a in range(0, indices.shape[0], chunk):
        part = np.asarray(indices[a:a + chunk])
        e = NK.out_degrees(part, num_nodes, 0, part.shape[0], deg)
        if e >= 0:
            path = getattr(indices, "filename", None) or "indices.bin"
            raise index_range_error(Path(path), a + int(e), int(part[e]), num_nodes)
        release_mapped(indices)  # the scan's file pages leave this process's RSS as it goes
    return deg


def degree_dtype(num_edges: int) -> type:
    """The counter type of a degree: uint32 while no degree can pass it."""
    return np.uint32 if num_edges < 2**32 else np.int64


def _degree_chunks(indptr: np.ndarray, chunk: int):
    """``(a, in-degrees of nodes a..)`` (int64) of ``indptr`` (an array or a memmap) a chunk
    at a time; a memmap's pages are released at the end."""
    n = indptr.shape[0] - 1
    for a in range(0, n, chunk):
        yield a, np.diff(np.asarray(indptr[a:min(n, a + chunk) + 1], dtype=np.int64))
    release_mapped(indptr)


def in_degrees(indptr: np.ndarray, chunk: int = 1 << 22, dtype=None) -> np.ndarray:
    """[N] in-degrees from ``indptr`` (int64 [N+1], an array or a memmap read in chunks),
    ``dtype`` (default uint32, int64 when the graph has 2^32 edges or more)."""
    out = np.empty(indptr.shape[0] - 1, dtype=dtype or degree_dtype(int(indptr[-1])))
    for a, deg in _degree_chunks(indptr, chunk):
        out[a:a + deg.shape[0]] = deg
    return out


def _map_bytes(num_nodes: int, cached: int, max_address: int) -> int:
    """The most the map of ``cached`` nodes takes (:meth:`IdMap.max_bytes`)."""
    return IdMap.max_bytes(cached, max(0, num_nodes - 1), max_address)


def full_cache_bytes(indptr: np.ndarray, itemsize: int, chunk: int = 1 << 22) -> int:
    """Bytes (the map included) of a cache holding every non-empty list (``indptr`` read
    in chunks)."""
    n = indptr.shape[0] - 1
    listed = sum(int(np.count_nonzero(deg)) for _, deg in _degree_chunks(indptr, chunk))
    return full_bytes(n, listed, int(indptr[-1]), itemsize)


def full_bytes(num_nodes: int, listed: int, num_edges: int, itemsize: int) -> int:
    """Bytes (the map included) of a cache holding the lists of ``listed`` of
    ``num_nodes`` nodes, ``num_edges`` ids of ``itemsize`` bytes in all (each list stored
    with its length)."""
    entries = int(num_edges) + int(listed)
    return _map_bytes(int(num_nodes), int(listed), entries) + int(itemsize) * entries


#: The 16-bit digits of a ratio key, most significant first (the select's rounds).
_SHIFTS = (48, 32, 16, 0)


def _select(in_deg: np.ndarray, out_deg: np.ndarray, itemsize: int, extra: int,
            room: int) -> tuple[int, int]:
    """The longest prefix of the nodes in the cache's order (ratio ``out/in`` as float64,
    highest first, ties by id) whose costs (``(in + 1) * itemsize + extra`` each) sum
    to at most ``room``, as ``(key, last)`` for :func:`NK.select_nodes`: the nodes whose
    ratio key is above ``key``, and those equal to it up to id ``last``.

    A radix select over the float64 bits of the ratio, 16 bits a round: each round
    one pass over the degrees adds up the costs per digit under the prefix found so
    far, so nothing is sorted and nothing over N is allocated."""
    none = (np.iinfo(np.int64).max, -1)
    if room <= 0:
        return none
    prefix = 0
    for shift in _SHIFTS:
        hist = np.zeros(1 << 16, np.int64)
        NK.key_cost_histogram(in_deg, out_deg, itemsize, extra, prefix, shift, hist)
        top = np.cumsum(hist[::-1])  # top[i]: the costs of the i + 1 highest digits
        whole = int(np.searchsorted(top, room, side="right"))  # digits taken whole
        if whole == top.shape[0]:  # everything under the prefix fits (only in round one)
            return (-1, -1)
        if whole:
            room -= int(top[whole - 1])
        prefix = (prefix << 16) | ((1 << 16) - 1 - whole)
    return prefix, int(NK.tie_prefix(in_deg, out_deg, itemsize, extra, prefix, room))


def build_neighbor_cache(indptr: np.ndarray, indices: np.ndarray, budget_bytes: int,
                         out_degrees: np.ndarray | None = None,
                         degrees=None) -> NeighborCache:
    """Choose and fill the cache (Ginex §3.2).

    Nodes with at least one in-neighbour are ranked by ``out_deg / in_deg``
    (highest first, ties by node id) and taken in that order while the total
    (the map, at its bound, + cache array) stays within ``budget_bytes``; the
    first list that does not fit ends the selection.

    Streaming: besides what it keeps (the lists and the map), the build holds
    the in- and out-degrees (4 bytes per node each, 8 from 2^32 edges) and one
    range of nodes' lists at a time (memmaps' pages released as it goes):
    :func:`build_bytes`. ``degrees``: the degree counters' dtype (default
    :func:`degree_dtype` of the edge count).
    """
    n = indptr.shape[0] - 1
    dtype = np.dtype(indices.dtype)
    indeg = in_degrees(indptr, dtype=degrees)
    if out_degrees is None:
        out_degrees = compute_out_degrees(indices, n, dtype=indeg.dtype)
    best, most, entries = _choose(indeg, out_degrees, dtype.itemsize, int(budget_bytes))
    slots = IdMap(most, max(0, n - 1), max(0, entries - 1))
    cache_array = np.empty(entries, dtype=dtype)
    _fill(indptr, indices, indeg, out_degrees, best, slots, cache_array)
    meta = {
        "version": CACHE_VERSION,
        "policy": "out_in_degree_ratio",
        "budget_bytes": int(budget_bytes),
        "num_nodes": n,
        "num_edges": int(indptr[-1]),
        "num_cached": most,
        "cached_edges": entries - most,
        "cache_entries": entries,
        "index_dtype": dtype.name,
    }
    cache = NeighborCache(slots, cache_array, meta)
    meta["bytes"] = cache.nbytes
    return cache


def _choose(indeg: np.ndarray, out_deg: np.ndarray, itemsize: int,
            budget_bytes: int) -> tuple[tuple[int, int], int, int]:
    """The nodes the cache takes, as ``((key, last), nodes, entries)``: the
    :func:`_select` bound, how many nodes it takes and their entries (counts and
    lists, ``itemsize`` bytes each). ``indeg``, ``out_deg``: [N] degrees.

    The map is charged as a hash table (bytes per cached node) or as a direct table
    (bytes per node of the graph): the one that lets more lists in.
    """
    n = indeg.shape[0]
    # addresses stay below the entries the budget can hold (which decides their dtype)
    max_address = max(0, budget_bytes // itemsize)
    best, most, entries = (np.iinfo(np.int64).max, -1), -1, 0
    count_only = np.zeros(0, np.int64)
    for extra, room in ((map_bytes_per_node(n, max_address), budget_bytes),
                        (0, budget_bytes - _map_bytes(n, n, max_address))):
        key, last = _select(indeg, out_deg, itemsize, extra, room)
        k, e = NK.select_nodes(indeg, out_deg, key, last, 0, n, count_only)
        if k > most:
            best, most, entries = (key, last), int(k), int(e)
    return best, most, entries


def _fill(indptr: np.ndarray, indices: np.ndarray, indeg: np.ndarray, out_deg: np.ndarray,
          best: tuple[int, int], slots: IdMap, cache_array: np.ndarray) -> None:
    """Copy the lists of the nodes ``best`` selects (see :func:`_choose`) into
    ``cache_array`` (the index dtype, [entries]) and their addresses into ``slots``.

    ``indptr`` (int64 [N+1]) and ``indices`` ([E]) may be memmaps: node ranges are
    done in turn (their chosen nodes, addresses and lists) and the memmaps' pages
    released after each, so the peak holds the cache and one range's pages.
    """
    n = indeg.shape[0]
    entries = cache_array.shape[0]
    step = min(FILL_SLICE_NODES, max(1, FILL_SLICE_ENTRIES * n // max(1, entries)))
    ids = np.empty(min(n, step), np.int64)
    at = 0
    for a in range(0, n, step):
        k, e = NK.select_nodes(indeg, out_deg, best[0], best[1], a, min(n, a + step), ids)
        if not k:
            continue
        chosen = ids[:k]
        sizes = indeg[chosen].astype(np.int64) + 1
        addr = at + np.cumsum(sizes) - sizes  # where each entry starts
        NK.fill_cache(chosen, addr, indptr, indices, cache_array)
        slots.put(chosen, addr)
        at += int(e)
        release_mapped(indices)
        release_mapped(indptr)


def build_bytes(num_nodes: int, num_edges: int, itemsize: int = 8) -> int:
    """The most :func:`build_neighbor_cache` holds above the cache it builds: the in- and
    out-degrees (uint32 [N] each; int64 from 2^32 edges), the mapped pages of one
    chunk of ``indices`` (ids of ``itemsize`` bytes) and one range's ids, sizes,
    addresses and ``indptr`` pages."""
    degrees = 2 * np.dtype(degree_dtype(num_edges)).itemsize * num_nodes
    return (degrees + itemsize * min(num_edges, FILL_SLICE_ENTRIES)
            + 32 * min(num_nodes, FILL_SLICE_NODES))


def cache_dir(dataset_path: str | os.PathLike, budget_bytes: int) -> Path:
    """Where the cache of ``budget_bytes`` for a dataset lives beside it."""
    return Path(dataset_path) / "neighbor_cache" / str(int(budget_bytes))


def user_cache_dir(dataset, budget_bytes: int) -> Path:
    """Where the cache lives when the dataset folder is not writable: the user
    cache folder, keyed by a hash of the dataset's ``meta.json``."""

    ident = hashlib.sha256((Path(dataset.path) / "meta.json").read_bytes()).hexdigest()[:24]
    return user_root() / "neighbor_cache" / ident / str(int(budget_bytes))


def _load_valid(folder: Path, dataset) -> NeighborCache | None:
    """The cache saved in ``folder`` if it is there, readable, matches its checksum, was
    built from the dataset as it is now (its fingerprint) and fits it; a saved cache
    that does not is rebuilt, with a one-line note saying why."""
    if not (folder / "meta.json").exists():
        return None
    try:
        cache = NeighborCache.load(folder)
        if cache.meta.get("num_edges") != dataset.num_edges:
            raise DatasetError(folder, "neighbor cache is of a graph with another edge count")
        if cache.meta.get("source") != json.loads(json.dumps(dataset.fingerprint())):
            raise DatasetError(folder, f"neighbor cache was built from another version of "
                                       f"{dataset.path} (its fingerprint differs)")
        cache.check(dataset.indptr, dataset.file("indices.bin"))
    except DatasetError as e:
        note(f"{e}; building it again")
        return None
    return cache


#: A saved cache of at least this share of the budget is used instead of building one.
REUSE_SHARE = 0.95


def _saved_near(folder: Path, budget_bytes: int) -> list[Path]:
    """Saved caches beside ``folder`` (same parent) of budgets within
    ``[REUSE_SHARE * budget_bytes, budget_bytes)``, largest first."""
    try:
        names = [p.name for p in folder.parent.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    near = sorted((int(b) for b in names if REUSE_SHARE * budget_bytes <= int(b) < budget_bytes),
                  reverse=True)
    return [folder.parent / str(b) for b in near]


def load_or_build_neighbor_cache(dataset, budget_bytes: int) -> NeighborCache:
    """Load the dataset's neighbor cache of ``budget_bytes`` (or a saved one up to
    :data:`REUSE_SHARE` smaller), building and saving it first if there is none that
    fits (see the module docstring for where).

    ``dataset`` is an :class:`ooc.storage.Dataset`. A cache that cannot be saved
    anywhere is still returned (and built again next time).

    Raises:
        DatasetError: ``indices.bin`` holds an id out of range (file and position named).
    """
    here = cache_dir(dataset.path, budget_bytes)
    try:
        there = user_cache_dir(dataset, budget_bytes)
    except OSError:
        there = None
    for folder in (here, there):
        if folder is not None:
            for saved in [folder, *_saved_near(folder, budget_bytes)]:
                cache = _load_valid(saved, dataset)
                if cache is not None:
                    return cache
    cache = build_neighbor_cache(dataset.indptr, dataset.indices, budget_bytes)
    cache.check(dataset.indptr, dataset.file("indices.bin"))
    cache.meta["source"] = dataset.fingerprint()
    for folder in (here, there):
        if folder is None:
            continue
        try:
            cache.save(folder, overwrite=True)
            break
        except OSError:
            continue
    return cache


class CachedNeighbors(NeighborSource):
    """Neighbour ids from a :class:`~ooc.caches.neighbor_cache.NeighborCache`,
    misses from ``fallback``.

    Hits and misses count frontier nodes with at least one wanted position.
    """

    def __init__(self, cache, fallback: NeighborSource):
        self.cache = cache
        self.fallback = fallback
        self.hits = 0
        self.misses = 0

    @property
    def num_edges(self) -> int:
        return self.fallback.num_edges

    def _gather(self, req: NeighborRequest) -> np.ndarray:
        out = np.empty(req.size, dtype=np.int64)
        miss = np.zeros(req.nodes.shape[0], dtype=np.bool_)
        keys, vals, shift = self.cache.slots.table
        hits, misses = NK.cache_gather(req.nodes, req.offsets, req.rel_pos, keys, vals, shift,
                                       self.cache.cache_array, out, miss)
        self.hits += int(hits)
        self.misses += int(misses)
        if misses and not hits:
            return self.fallback._gather(req)
        if misses:
            which = np.flatnonzero(miss).astype(np.int64)
            sub, sel = req.subset(which)
            if sub.size:
                out[sel] = self.fallback._gather(sub)
        return out

    def stats(self) -> dict:
        total = self.hits + self.misses
        return {"neighbor_cache_hits": self.hits, "neighbor_cache_misses": self.misses,
                "neighbor_cache_hit_ratio": (self.hits / total) if total else 0.0,
                **self.fallback.stats()}

    def close(self) -> None:
        self.fallback.close()
