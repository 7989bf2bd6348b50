"""The Ginex neighbor cache (Ginex §3.2, Fig. 10).

Static: the in-neighbour lists of the nodes with the highest ratio
``out_degree / in_degree`` (benefit / cost), in that order, as many as fit in
a byte budget. Direct addressed: ``address_table`` (int64 [N], -1 when the
node is not cached) points into ``cache_array`` (the index dtype), which holds
for each cached node its neighbour count and then its neighbour ids.

The budget counts everything resident: ``address_table`` (8 bytes per node)
plus ``cache_array``. Lists are placed in node-id order, so building from a
memmap of ``indices.bin`` reads it sequentially.

Built once and saved beside the dataset as
``<dataset>/neighbor_cache/<budget_bytes>/`` (written atomically; dataset
readers ignore the extra folder), or, when the dataset folder is not
writable, in the user cache folder (``$OOC_CACHE``, else
``$XDG_CACHE_HOME/ooc`` or ``~/.cache/ooc``) under
``neighbor_cache/<dataset identity>/<budget_bytes>/``, the identity being a
hash of the dataset's ``meta.json`` (sizes and checksums of its files). A
saved cache is checked against ``indptr`` when loaded (entries inside the
array, counts equal to the in-degrees, ids in range) and rebuilt when it
does not match; ids out of range while building are an error naming
``indices.bin`` and the position.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from ooc.storage.atomic import atomic_dir, write_json
from ooc.storage.dataset import index_range_error
from ooc.storage.errors import DatasetError
from ooc.storage.pagecache import release_mapped

from . import _neighbor_cache_kernels as NK

__all__ = ["NeighborCache", "build_neighbor_cache", "cache_dir", "load_or_build_neighbor_cache",
           "full_cache_bytes", "compute_out_degrees", "user_cache_dir"]

CACHE_VERSION = 1


@dataclass
class NeighborCache:
    """A loaded neighbor cache.

    Attributes:
        address_table: int64 [N]; ``cache_array[a]`` is node v's count and
            ``cache_array[a+1 : a+1+count]`` its in-neighbours, with
            ``a = address_table[v]``; -1 when v is not cached.
        cache_array: int32/int64 flat array.
        meta: build information (budget, cached nodes, bytes, ...).
    """

    address_table: np.ndarray
    cache_array: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def num_cached(self) -> int:
        return int(self.meta.get("num_cached", int((self.address_table >= 0).sum())))

    @property
    def nbytes(self) -> int:
        return int(self.address_table.nbytes + self.cache_array.nbytes)

    def neighbors(self, v: int) -> np.ndarray | None:
        """In-neighbours of ``v`` (a view), or None when not cached."""
        a = int(self.address_table[v])
        if a < 0:
            return None
        return self.cache_array[a + 1:a + 1 + int(self.cache_array[a])]

    def save(self, folder: str | os.PathLike, overwrite: bool = True) -> Path:
        """Write to ``folder`` atomically (address_table.npy, cache_array.npy, meta.json)."""
        with atomic_dir(folder, overwrite=overwrite) as tmp:
            np.save(tmp / "address_table.npy", self.address_table)
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
            at = np.load(folder / "address_table.npy", mmap_mode=mode, allow_pickle=False)
            ca = np.load(folder / "cache_array.npy", mmap_mode=mode, allow_pickle=False)
            ok = (at.dtype == np.int64 and at.shape == (meta.get("num_nodes"),)
                  and ca.dtype.name == meta.get("index_dtype")
                  and ca.shape == (meta.get("cache_entries"),))
        except DatasetError:
            raise
        except (OSError, ValueError, EOFError, UnicodeDecodeError) as e:
            raise DatasetError(folder, f"unreadable neighbor cache ({e})") from None
        if not ok:
            raise DatasetError(folder, "neighbor cache files do not match its meta.json")
        return cls(at, ca, meta)

    def check(self, indptr: np.ndarray, indices_path: str | os.PathLike = "indices.bin") -> None:
        """Check the cache against ``indptr`` (int64 [N+1]) and the id range.

        Raises:
            DatasetError: naming ``indices_path`` and the position of an id out
                of range, or the cache (an entry that does not fit ``indptr``).
        """
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        n = indptr.shape[0] - 1
        if self.address_table.shape != (n,):
            raise DatasetError(indices_path, f"neighbor cache covers {self.address_table.shape[0]} "
                                             f"nodes, the graph has {n}")
        status = np.zeros(n, dtype=np.int8)
        NK.check_cache(self.address_table, self.cache_array, indptr, n, status)
        bad = np.flatnonzero(status)
        if not bad.size:
            return
        v = int(bad[0])
        if status[v] == 1:
            raise DatasetError(indices_path, f"neighbor cache entry of node {v} does not match "
                                             f"its in-degree")
        ids = self.neighbors(v)
        assert ids is not None  # status 2 is set only for a node with a cache entry
        j = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
        raise index_range_error(Path(indices_path), int(indptr[v]) + j, int(ids[j]), n)


#: Neighbour ids copied from the ``indices.bin`` memmap between two releases of its pages.
FILL_SLICE_ENTRIES = 1 << 24


def compute_out_degrees(indices: np.ndarray, num_nodes: int, chunk: int = 1 << 24) -> np.ndarray:
    """int64 [N] out-degrees from an indices array/memmap, streamed in chunks.

    Raises:
        DatasetError: an id outside ``[0, num_nodes)``, naming the file and position.
    """
    deg = np.zeros(num_nodes, dtype=np.int64)
    for a in range(0, indices.shape[0], chunk):
        part = np.asarray(indices[a:a + chunk])
        e = NK.out_degrees(part, num_nodes, 0, part.shape[0], deg)
        if e >= 0:
            path = getattr(indices, "filename", None) or "indices.bin"
            raise index_range_error(Path(path), a + int(e), int(part[e]), num_nodes)
        release_mapped(indices)  # the scan's file pages leave this process's RSS as it goes
    return deg


def full_cache_bytes(indptr: np.ndarray, itemsize: int) -> int:
    """Bytes (address table included) of a cache holding every non-empty list."""
    indeg = np.diff(np.asarray(indptr, dtype=np.int64))
    n = indeg.shape[0]
    return 8 * n + itemsize * int((indeg + (indeg > 0)).sum())


def build_neighbor_cache(indptr: np.ndarray, indices: np.ndarray, budget_bytes: int,
                         out_degrees: np.ndarray | None = None) -> NeighborCache:
    """Choose and fill the cache (Ginex §3.2).

    Nodes with at least one in-neighbour are ranked by ``out_deg / in_deg``
    (highest first, ties by node id) and taken in that order while the total
    (address table + cache array) stays within ``budget_bytes``; the first
    list that does not fit ends the selection.
    """
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    n = indptr.shape[0] - 1
    dtype = np.dtype(indices.dtype)
    indeg = np.diff(indptr)
    if out_degrees is None:
        out_degrees = compute_out_degrees(indices, n)
    out_degrees = np.asarray(out_degrees, dtype=np.int64)
    cand = np.flatnonzero(indeg > 0)
    ratio = out_degrees[cand] / indeg[cand]
    order = cand[np.argsort(-ratio, kind="stable")]
    cost = (indeg[order] + 1) * dtype.itemsize
    room = int(budget_bytes) - 8 * n
    if room > 0:
        take = int(np.searchsorted(np.cumsum(cost), room, side="right"))
    else:
        take = 0
    chosen = np.sort(order[:take])
    sizes = indeg[chosen] + 1
    addr = np.zeros(chosen.shape[0], dtype=np.int64)
    if chosen.shape[0]:
        np.cumsum(sizes[:-1], out=addr[1:])
    entries = int(sizes.sum())
    address_table = np.full(n, -1, dtype=np.int64)
    address_table[chosen] = addr
    cache_array = np.empty(entries, dtype=dtype)
    # filled in slices, releasing the memmap's pages after each: the peak holds the cache
    # and one slice's pages, never all of indices.bin
    step = max(1, FILL_SLICE_ENTRIES * chosen.shape[0] // max(1, entries))
    for a in range(0, chosen.shape[0], step):
        NK.fill_cache(chosen[a:a + step], addr[a:a + step], indptr, indices, cache_array)
        release_mapped(indices)
    meta = {
        "version": CACHE_VERSION,
        "policy": "out_in_degree_ratio",
        "budget_bytes": int(budget_bytes),
        "num_nodes": n,
        "num_edges": int(indptr[-1]),
        "num_cached": int(chosen.shape[0]),
        "cached_edges": int(entries - chosen.shape[0]),
        "cache_entries": entries,
        "index_dtype": dtype.name,
        "bytes": int(address_table.nbytes + cache_array.nbytes),
    }
    return NeighborCache(address_table, cache_array, meta)


def cache_dir(dataset_path: str | os.PathLike, budget_bytes: int) -> Path:
    """Where the cache of ``budget_bytes`` for a dataset lives beside it."""
    return Path(dataset_path) / "neighbor_cache" / str(int(budget_bytes))


def user_cache_dir(dataset, budget_bytes: int) -> Path:
    """Where the cache lives when the dataset folder is not writable: the user
    cache folder, keyed by a hash of the dataset's ``meta.json``."""
    from ooc.storage.probe import cache_dir as user_root

    ident = hashlib.sha256((Path(dataset.path) / "meta.json").read_bytes()).hexdigest()[:24]
    return user_root() / "neighbor_cache" / ident / str(int(budget_bytes))


def _load_valid(folder: Path, dataset) -> NeighborCache | None:
    """The cache saved in ``folder`` if it is there, readable and fits the dataset."""
    if not (folder / "meta.json").exists():
        return None
    try:
        cache = NeighborCache.load(folder)
        if cache.meta.get("num_edges") != dataset.num_edges:
            return None
        cache.check(dataset.indptr, dataset.file("indices.bin"))
    except DatasetError:
        return None
    return cache


def load_or_build_neighbor_cache(dataset, budget_bytes: int) -> NeighborCache:
    """Load the dataset's neighbor cache of ``budget_bytes``, building and saving it
    first if there is none that fits (see the module docstring for where).

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
            cache = _load_valid(folder, dataset)
            if cache is not None:
                return cache
    cache = build_neighbor_cache(dataset.indptr, dataset.indices, budget_bytes)
    cache.check(dataset.indptr, dataset.file("indices.bin"))
    for folder in (here, there):
        if folder is None:
            continue
        try:
            cache.save(folder, overwrite=True)
            break
        except OSError:
            continue
    return cache
