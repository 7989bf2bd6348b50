"""Neighbor cache (Ginex §3.2) and neighbour sources: identical batches from every source."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ooc.caches.neighbor_cache import (
    CachedNeighbors,
    NeighborCache,
    build_neighbor_cache,
    cache_dir,
    compute_out_degrees,
    full_bytes,
    full_cache_bytes,
    load_or_build_neighbor_cache,
)
from ooc.sampling.sampler import NeighborSampler, derive_seed, epoch_batches
from ooc.storage import csc_from_edges, open_dataset, write_dataset
from ooc.storage.direct import DEFAULT_MAX_BUFFER_PAGES
from ooc.storage.neighbors import DirectNeighbors, InMemoryNeighbors

FANOUTS = [8, 4, -1]


def make_graph(n=800, e=9000, seed=0):
    rng = np.random.default_rng(seed)
    src = (n * rng.random(e) ** 2).astype(np.int64)
    dst = (n * rng.random(e) ** 2.5).astype(np.int64)
    pairs = np.unique(np.stack([src, dst], 1), axis=0)
    return csc_from_edges(pairs[:, 0], pairs[:, 1], n)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    indptr, indices = make_graph()
    n = indptr.shape[0] - 1
    path = tmp_path_factory.mktemp("nc") / "ds"
    write_dataset(path, indptr, indices, np.zeros((n, 4), np.float32),
                  labels=np.zeros(n, np.int64), train_idx=np.arange(0, n, 2), num_classes=2)
    return open_dataset(path)


class PreadReader:
    """Stand-in with the DirectReader interface (buffered pread), counting submissions."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.calls = 0
        self.sizes: list[int] = []  # pages of each submission

    def read_pages(self, pages, out):
        self.calls += 1
        self.sizes.append(int(pages.shape[0]))
        assert np.all(np.diff(pages) > 0), "pages must be sorted and unique"
        assert out.ctypes.data % 4096 == 0 and out.shape[0] >= pages.shape[0] * 4096
        for i, p in enumerate(pages.tolist()):
            data = os.pread(self.fd, 4096, p * 4096)
            out[i * 4096:i * 4096 + len(data)] = np.frombuffer(data, np.uint8)

    def close(self):
        os.close(self.fd)


@pytest.mark.parametrize("max_pages,pages,submissions", [(DEFAULT_MAX_BUFFER_PAGES, 6, 1),
                                                         (4, 5, 5)])
def test_direct_neighbors_read_through_short_gaps(tmp_path, max_pages, pages, submissions):
    """Positions on pages 0, 2, 3, 7 and 20 of a raw int32 file, gaps of up to 2 pages read
    through: pages 0-3, 7 and 20 are read (one run and two), the ids are the file's; with 4
    pages a submission (gaps included) the wanted pages go 4 // 3 = 1 at a time."""
    from ooc.storage.neighbors import NeighborRequest

    vals = np.arange(21 * 1024, dtype=np.int32) * 7
    path = tmp_path / "indices.bin"
    vals.tofile(path)
    indptr = np.array([0, vals.size], np.int64)
    pos = np.array([5, 2 * 1024 + 9, 3 * 1024, 7 * 1024 + 1023, 20 * 1024 + 3, 6], np.int64)
    req = NeighborRequest(np.zeros(1, np.int64), np.array([0, pos.size], np.int64), pos, pos)
    reader = PreadReader(path)
    src = DirectNeighbors(path, indptr, reader=reader, max_pages=max_pages, max_gap_pages=2)
    np.testing.assert_array_equal(src.gather(req), vals[pos])
    assert (src.pages_read, src.submissions) == (pages, submissions)
    none = DirectNeighbors(path, indptr, reader=reader, max_gap_pages=0)
    np.testing.assert_array_equal(none.gather(req), vals[pos])
    assert none.pages_read == 5
    reader.close()


@pytest.mark.parametrize("gap", [0, 2])
def test_direct_neighbors_read_the_sectors_of_wanted_positions(tmp_path, gap):
    """Through a :class:`DirectReader` that reads 512 B sectors: of each page only the
    sectors from its first to its last wanted position are read (pages 0, 1 and 5 here;
    with gaps of 2 pages read through, 0-1 and 5 stay two reads)."""
    from ooc.storage import DirectReader
    from ooc.storage.neighbors import NeighborRequest

    vals = np.arange(8 * 1024, dtype=np.int32) * 3
    path = tmp_path / "indices.bin"
    vals.tofile(path)
    pos = np.array([130, 10, 1024 + 1023, 5 * 1024 + 200, 5 * 1024 + 250], np.int64)
    req = NeighborRequest(np.zeros(1, np.int64), np.array([0, pos.size], np.int64), pos, pos)
    with DirectReader(path, backend="preadv", max_gap_bytes=gap * 4096) as r:
        if r.read_align != 512:
            pytest.skip(f"{tmp_path} takes no 512 B O_DIRECT reads")
        src = DirectNeighbors(path, np.array([0, vals.size], np.int64), reader=r)
        np.testing.assert_array_equal(src.gather(req), vals[pos])
        # page 0: bytes 40..524 -> sectors 0-1; page 1: byte 4092 -> sector 7, merged with
        # page 0 into one read of 0..8192; page 5: bytes 800..1004 -> sector 1
        assert (r.stats.read_ops, r.stats.bytes_read) == (2, 8192 + 512)


def test_direct_neighbors_refuse_a_read_size_that_splits_no_page_evenly(tmp_path):
    """Positions are split into pages and sectors by shifts: a reader whose reads round to
    something other than a power of two from the id size to a page is refused by name."""
    from ooc.core.errors import InvalidValue

    path = tmp_path / "indices.bin"
    np.arange(2048, dtype=np.int32).tofile(path)

    class Odd:
        read_align = 3000

    with pytest.raises(InvalidValue, match=r"indices\.bin: reads rounded to 3000 bytes"):
        DirectNeighbors(path, np.array([0, 2048], np.int64), reader=Odd())


def test_build_policy_layout_and_budget(dataset):
    indptr, indices = dataset.indptr, np.asarray(dataset.indices)
    n = dataset.num_nodes
    indeg = np.diff(indptr)
    outdeg = np.bincount(indices, minlength=n)
    np.testing.assert_array_equal(compute_out_degrees(dataset.indices, n, chunk=1000), outdeg)
    full = full_cache_bytes(indptr, indices.itemsize)
    assert full == full_bytes(n, int(np.count_nonzero(indeg)), int(indptr[-1]), indices.itemsize)
    assert build_neighbor_cache(indptr, indices, 1 << 40).nbytes == full   # every list cached
    assert build_neighbor_cache(indptr, indices, 0).num_cached == 0
    for frac in [0.01, 0.1, 0.25, 0.6, 1.0]:
        budget = int(frac * full)
        c = build_neighbor_cache(indptr, indices, budget)
        assert c.nbytes <= budget
        cached = c.nodes
        assert c.num_cached == cached.shape[0] and (np.diff(cached) > 0).all()
        for v in range(n):   # the look-up returns the exact list, or a miss
            lst = c.neighbors(v)
            if lst is None:
                assert v not in set(cached.tolist())
            else:
                np.testing.assert_array_equal(lst, indices[indptr[v]:indptr[v + 1]])
        # the chosen nodes are the prefix of the ratio order
        cand = np.flatnonzero(indeg > 0)
        order = cand[np.argsort(-(outdeg[cand] / indeg[cand]), kind="stable")]
        assert set(order[:cached.shape[0]].tolist()) == set(cached.tolist())
        if frac == 1.0:
            assert cached.shape[0] == cand.shape[0]


def _reference_choice(indptr, indices, budget):
    """The cache's nodes by a full sort (the order of Ginex §3.2: out/in degree ratio,
    highest first, ties by id; the longest prefix that fits)."""
    from ooc.caches.neighbor_cache import _map_bytes, map_bytes_per_node

    n = indptr.shape[0] - 1
    indeg = np.diff(indptr)
    outdeg = np.bincount(indices, minlength=n)
    cand = np.flatnonzero(indeg > 0)
    order = cand[np.argsort(-(outdeg[cand] / indeg[cand]), kind="stable")]
    total = np.cumsum((indeg[order] + 1) * indices.itemsize)
    top = budget // indices.itemsize
    take = np.searchsorted(total + map_bytes_per_node(n, top) * np.arange(1, len(order) + 1),
                           budget, side="right")
    room = budget - _map_bytes(n, n, top)
    if room > 0:
        take = max(take, np.searchsorted(total, room, side="right"))
    return np.sort(order[:take])


@pytest.mark.parametrize("symmetric", [False, True])
def test_streaming_choice_equals_a_full_sort(symmetric):
    """The radix select picks the nodes a full sort does, ties included: every node of a
    graph stored both ways has ratio 1, so the order is the ids'."""
    rng = np.random.default_rng(5)
    n = 3000
    src = rng.integers(0, n, 20000) ** 2 // n
    dst = rng.integers(0, n, 20000)
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    indptr, indices = csc_from_edges(src, dst, n)
    full = full_cache_bytes(indptr, indices.itemsize)
    for budget in [1, 50, 777, full // 100, full // 7, full // 2, full - 1, full, 10 * full]:
        c = build_neighbor_cache(indptr, indices, int(budget))
        np.testing.assert_array_equal(c.nodes, _reference_choice(indptr, indices, int(budget)))
        assert c.nbytes <= max(budget, 64)


def test_the_map_grows_with_the_cached_nodes_not_the_graph():
    """1M nodes, 1000 of them with in-neighbours: a 64 KiB cache holds lists, and its
    map is a small hash table, not a table of 4 MB over every node."""
    n, k = 1_000_000, 1000
    indptr = np.zeros(n + 1, np.int64)
    indptr[1:k + 1] = 3 * np.arange(1, k + 1)
    indptr[k + 1:] = 3 * k
    indices = (np.arange(3 * k, dtype=np.int32) * 7919) % n
    c = build_neighbor_cache(indptr, indices, 64 << 10)
    assert c.num_cached > 500 and not c.slots.direct
    assert c.nbytes <= 64 << 10 and c.slots.nbytes <= 32 * c.num_cached
    for v in (0, 1, k - 1, k, n - 1):
        lst = c.neighbors(v)
        if v in set(c.nodes.tolist()):
            np.testing.assert_array_equal(lst, indices[indptr[v]:indptr[v + 1]])
        else:
            assert lst is None


def test_save_load_beside_dataset(dataset):
    n = dataset.num_nodes
    budget = 8 * n + 6000
    c = load_or_build_neighbor_cache(dataset, budget)
    folder = cache_dir(dataset.path, budget)
    assert (folder / "meta.json").exists()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left
    again = load_or_build_neighbor_cache(dataset, budget)
    np.testing.assert_array_equal(again.nodes, c.nodes)
    np.testing.assert_array_equal(again.addresses, c.addresses)
    np.testing.assert_array_equal(again.cache_array, c.cache_array)
    m = NeighborCache.load(folder, mmap=True)
    np.testing.assert_array_equal(m.cache_array, c.cache_array)
    open_dataset(dataset.path, verify=True)   # the extra folder does not disturb the dataset


def test_a_saved_cache_of_a_slightly_smaller_budget_is_used(dataset, tmp_path, monkeypatch):
    """A run whose planned budget is a little larger than a saved cache's uses that cache
    (no build, no new folder); one more than 5% larger builds its own."""
    import shutil

    from ooc.caches import neighbor_cache as nc

    path = tmp_path / "ds"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)
    budget = 8 * ds.num_nodes + 6000
    saved = load_or_build_neighbor_cache(ds, budget)
    built = []
    real_build = nc.build_neighbor_cache
    monkeypatch.setattr(nc, "build_neighbor_cache",
                        lambda *a, **k: built.append(a[2]) or real_build(*a, **k))
    near = load_or_build_neighbor_cache(ds, int(budget * 1.04))
    assert built == [] and sorted(p.name for p in (path / "neighbor_cache").iterdir()) == [
        str(budget)]
    np.testing.assert_array_equal(near.nodes, saved.nodes)
    np.testing.assert_array_equal(near.cache_array, saved.cache_array)
    far = int(budget * 1.06)
    bigger = load_or_build_neighbor_cache(ds, far)
    assert built == [far] and (path / "neighbor_cache" / str(far) / "meta.json").exists()
    assert bigger.num_cached >= saved.num_cached
    # a budget smaller than the saved one does not take the larger cache
    smaller = int(budget * 0.99)
    load_or_build_neighbor_cache(ds, smaller)
    assert built == [far, smaller]


def test_corrupt_saved_cache_is_rebuilt(dataset, tmp_path):
    """A saved cache whose counts or ids do not fit the dataset is rebuilt, not trusted."""
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)
    budget = 8 * ds.num_nodes + 6000
    good = load_or_build_neighbor_cache(ds, budget)
    folder = cache_dir(path, budget)
    ca = np.load(folder / "cache_array.npy")
    ca[good.addresses[0] + 1] = 10**6          # an id out of range
    np.save(folder / "cache_array.npy", ca)
    again = load_or_build_neighbor_cache(ds, budget)
    np.testing.assert_array_equal(again.cache_array, good.cache_array)
    np.testing.assert_array_equal(np.load(folder / "cache_array.npy"), good.cache_array)


def _noted(monkeypatch) -> list[str]:
    from ooc.core import notes

    lines: list[str] = []
    notes.reset()
    monkeypatch.setattr(notes, "sink", lines.append)
    return lines


def test_a_saved_cache_edited_in_range_is_rebuilt_with_a_note(dataset, tmp_path, monkeypatch):
    """An id of a saved cache changed to another id in range fits every count: the cache's
    checksum shows it, and the cache is built again (a one-line note), not served."""
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)
    budget = 8 * ds.num_nodes + 6000
    good = load_or_build_neighbor_cache(ds, budget)
    assert good.meta["source"] == ds.fingerprint() and len(good.meta["checksum"]) == 64
    folder = cache_dir(path, budget)
    ca = np.load(folder / "cache_array.npy")
    a = int(good.addresses[0])
    ca[a + 1] = (ca[a + 1] + 1) % ds.num_nodes     # still in range
    np.save(folder / "cache_array.npy", ca)
    edited = NeighborCache.from_arrays(good.nodes, good.addresses, ca, good.meta)
    edited.check(ds.indptr)  # every count and id still fits the graph
    lines = _noted(monkeypatch)
    again = load_or_build_neighbor_cache(ds, budget)
    np.testing.assert_array_equal(again.cache_array, good.cache_array)
    np.testing.assert_array_equal(np.load(folder / "cache_array.npy"), good.cache_array)
    assert lines == [f"ooc: note: {folder}: neighbor cache files do not match their checksum "
                     f"in its meta.json (edited or corrupted); building it again"]


def test_a_saved_cache_of_a_changed_dataset_is_rebuilt_with_a_note(dataset, tmp_path,
                                                                   monkeypatch):
    """indices.bin written in place after the cache was built (ids moved between lists of
    the same lengths): the cache's source fingerprint no longer matches; rebuilt."""
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)
    budget = 8 * ds.num_nodes + 6000
    load_or_build_neighbor_cache(ds, budget)
    ids = np.memmap(path / "indices.bin", dtype=np.int32, mode="r+")
    ids[:ds.num_edges] = ids[:ds.num_edges][::-1]
    ids.flush()
    del ids
    lines = _noted(monkeypatch)
    again = load_or_build_neighbor_cache(ds, budget)
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    v = int(again.nodes[0])
    np.testing.assert_array_equal(again.neighbors(v), indices[indptr[v]:indptr[v + 1]])
    assert len(lines) == 1 and "was built from another version of" in lines[0]
    assert lines[0].endswith("(its fingerprint differs); building it again")


def test_bad_index_while_building_names_position(dataset, tmp_path):
    import shutil

    from ooc.storage import DatasetError

    path = tmp_path / "ds"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)   # corrupted after the checks at open: the kernels find it
    mm = np.memmap(path / "indices.bin", dtype=np.int32, mode="r+")
    mm[123] = -3
    mm.flush()
    del mm
    with pytest.raises(DatasetError, match=r"indices.bin: node id -3 at position 123 is out of range"):
        load_or_build_neighbor_cache(ds, 8 * ds.num_nodes + 6000)


def test_read_only_dataset_uses_user_cache(dataset, tmp_path, monkeypatch):
    """When the dataset folder cannot take the cache, it goes to $OOC_CACHE keyed by meta.json."""
    import shutil

    from ooc.caches import neighbor_cache as NC
    from ooc.storage import atomic

    path = tmp_path / "ro"
    shutil.copytree(dataset.path, path, ignore=shutil.ignore_patterns("neighbor_cache"))
    ds = open_dataset(path)
    monkeypatch.setenv("OOC_CACHE", str(tmp_path / "user"))
    real_mkdtemp = atomic.tempfile.mkdtemp

    def read_only(prefix="", dir=None):
        if str(dir).startswith(str(path)):
            raise OSError(30, "Read-only file system", str(dir))
        return real_mkdtemp(prefix=prefix, dir=dir)

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", read_only)
    budget = 8 * ds.num_nodes + 6000
    c = load_or_build_neighbor_cache(ds, budget)
    user = NC.user_cache_dir(ds, budget)
    assert user.is_relative_to(tmp_path / "user") and (user / "meta.json").exists()
    assert not (path / "neighbor_cache" / str(budget) / "meta.json").exists()
    again = load_or_build_neighbor_cache(ds, budget)
    np.testing.assert_array_equal(again.cache_array, c.cache_array)
    ref = build_neighbor_cache(ds.indptr, ds.indices, budget)
    np.testing.assert_array_equal(c.cache_array, ref.cache_array)


def sample_all(dataset, source, group_size=16):
    batches = epoch_batches(dataset.train_idx, 25, seed=5, epoch=1)
    seeds = [derive_seed(5, 1, i) for i in range(len(batches))]
    s = NeighborSampler(dataset.indptr, source, FANOUTS, group_size=group_size)
    return s.sample_many(batches, seeds)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_identical_batches_from_every_source(dataset, tmp_path, index_dtype):
    indptr = dataset.indptr
    if index_dtype == "int32":
        indices = dataset.indices
        path = dataset.file("indices.bin")
    else:   # a raw int64 file laid out like indices.bin
        indices = np.asarray(dataset.indices, dtype=np.int64)
        path = tmp_path / "indices64.bin"
        raw = np.zeros(-(-indices.nbytes // 4096) * 4096, np.uint8)
        raw[:indices.nbytes] = indices.view(np.uint8)
        raw.tofile(path)
    ref = sample_all(dataset, InMemoryNeighbors(np.asarray(indices)))
    assert sum(b.num_edges for b in ref) > 1000
    same = lambda got: all(a.equals(b) for a, b in zip(got, ref, strict=False)) and len(got) == len(ref)  # noqa: E731

    assert same(sample_all(dataset, indices))                       # memmap, wrapped
    reader = PreadReader(path)
    direct = DirectNeighbors(path, indptr, reader=reader, dtype=index_dtype)
    assert same(sample_all(dataset, direct, group_size=1000))
    # one batched submission per hop for the whole group
    assert reader.calls == direct.submissions == len(FANOUTS)
    small = DirectNeighbors(path, indptr, reader=reader, max_pages=2, dtype=index_dtype)
    assert same(sample_all(dataset, small))
    assert small.submissions > len(FANOUTS)

    full = full_cache_bytes(indptr, indices.itemsize)
    for frac in [0.0, 0.25, 1.0]:
        cache = build_neighbor_cache(indptr, indices, int(frac * full))
        for fallback in [InMemoryNeighbors(indices),
                         DirectNeighbors(path, indptr, reader=reader, dtype=index_dtype)]:
            src = CachedNeighbors(cache, fallback)
            assert same(sample_all(dataset, src))
            st = src.stats()
            if frac == 0.0:
                assert st["neighbor_cache_hits"] == 0 and st["neighbor_cache_misses"] > 0
            elif frac == 1.0:
                assert st["neighbor_cache_misses"] == 0 and st["neighbor_cache_hits"] > 0
            else:
                assert st["neighbor_cache_hits"] > 0 and st["neighbor_cache_misses"] > 0
    reader.close()


def test_real_direct_reader(dataset):
    """O_DIRECT / io_uring (and its fallbacks) give the same batches as memory."""
    import warnings

    import ooc.storage.direct as direct_mod
    from ooc.storage import OocError

    ref = sample_all(dataset, InMemoryNeighbors(np.asarray(dataset.indices)))
    n = dataset.num_nodes
    path = dataset.file("indices.bin")
    cache = build_neighbor_cache(dataset.indptr, dataset.indices,
                                 8 * n + full_cache_bytes(dataset.indptr, 4) // 4)
    used = []
    from ooc.storage.io_backends import REGISTRY

    for backend in ["auto", *REGISTRY]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                reader = direct_mod.DirectReader(path, queue_depth=8, backend=backend)
            except OocError:
                continue    # that backend is unavailable here
        used.append(reader.backend)
        try:
            for src in [DirectNeighbors(path, dataset.indptr, reader=reader, max_pages=5),
                        CachedNeighbors(cache, DirectNeighbors(path, dataset.indptr, reader=reader))]:
                got = sample_all(dataset, src)
                assert len(got) == len(ref) and all(a.equals(b) for a, b in zip(got, ref, strict=True))
        finally:
            reader.close()
    assert used, "no direct reader backend could be opened"
    # the default: DirectNeighbors opens (and closes) its own reader
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = DirectNeighbors(path, dataset.indptr)
    try:
        assert all(a.equals(b) for a, b in zip(sample_all(dataset, own), ref, strict=True))
    finally:
        own.close()


def test_open_sources_of_each_preset(dataset):
    """The loader stack's one assembly of the neighbour path: every preset's readers,
    with and without the neighbor cache, sample what the in-memory indices sample."""
    import warnings

    from ooc.executor.loader.presets import PRESETS
    from ooc.executor.loader.stack import ModeOptions, open_sources
    from ooc.storage.neighbors import InMemoryNeighbors

    ref = sample_all(dataset, InMemoryNeighbors(dataset.indices))
    budget = 8 * dataset.num_nodes + 5000
    for preset in PRESETS.values():
        for cb in [0, budget]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                src = open_sources(dataset, preset, ModeOptions(io_threads=4), cb)
            try:
                assert all(a.equals(b) for a, b in zip(sample_all(dataset, src.neighbors), ref, strict=True))
                assert src.info["neighbor_cache_bytes"] == (0 if not (cb and preset.neighbor_cache)
                                                            else src.neighbors.cache.nbytes)
            finally:
                src.close()
