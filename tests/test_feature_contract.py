"""The reader contract, the same for every implementation.

Every :class:`~ooc.storage.features.Feature` (direct, mmap, threaded mmap, in-memory,
cached, the inference's chunk rows, and the wrappers: node order, timing) gives numpy's
rows of the same table for ids in any order with repeats, through ``read`` and through
``read_into`` (target rows, a second array in the same request); refuses an id out of range
with ``IdOutOfRange`` naming the id and the file, and a wrong ``out`` or target rows with
``InvalidValue``, before reading anything; has ``stats()`` as a dict and can be closed
twice. Every :class:`~ooc.storage.neighbors.NeighborSource` (in-memory, direct, mmap,
cached) gives numpy's ids at a request's positions and refuses a position out of range.
"""
from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from ooc.caches.feature_cache import CachedFeature, FeatureCache
from ooc.caches.neighbor_cache import CachedNeighbors, build_neighbor_cache
from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.executor.loader.readers import TimedFeature
from ooc.storage import csc_from_edges
from ooc.storage.dataset import MmapFeatures
from ooc.storage.direct import DirectFeatures, DirectReader
from ooc.storage.features import Feature, FeatureWrapper, InMemoryFeatures, NodeRows
from ooc.storage.layout import FeatureLayout
from ooc.storage.mmap_features import ThreadedMmapFeatures
from ooc.storage.neighbors import (
    DirectNeighbors,
    InMemoryNeighbors,
    MmapNeighbors,
    NeighborRequest,
    NeighborSource,
)

N = 700


def _table(dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((N, dim)).astype(np.float32)


def _features_file(folder: Path, x: np.ndarray) -> tuple[Path, FeatureLayout]:
    """``x`` written in ooc's page layout."""
    lay = FeatureLayout(x.shape[0], x.shape[1], "float32")
    buf = np.zeros(lay.file_bytes, np.uint8)
    lay.view(buf)[0:x.shape[0]] = x
    path = folder / "features.bin"
    buf.tofile(path)
    return path, lay


def _direct(folder, x, stack):
    path, lay = _features_file(folder, x)
    return stack.enter_context(DirectFeatures(path, lay, queue_depth=8, backend="preadv"))


def _mmap(folder, x, stack):
    return MmapFeatures(*_features_file(folder, x))


def _threaded_mmap(folder, x, stack):
    return ThreadedMmapFeatures(*_features_file(folder, x), threads=3)


def _in_memory(folder, x, stack):
    return InMemoryFeatures(x, "x")


def _cached(folder, x, stack):
    cache = FeatureCache(N, 120, x.shape[1], np.float32)
    disk = _direct(folder, x, stack)
    cache.switch(np.arange(0, N, 5)[:120], disk)   # every fifth row a hit
    return CachedFeature(cache, disk)


def _chunk_rows(folder, x, stack):
    import zarr

    from ooc.executor.inference.chunk_rows import ChunkFileRows

    g = zarr.open_group(str(folder / "g"), mode="w")
    arr = g.create_array("h1", shape=x.shape, dtype=x.dtype, chunks=(128, x.shape[1]),
                         compressors=None, fill_value=0.0)
    arr[:] = x
    return ChunkFileRows(folder / "g" / "h1", N, 128, x.shape[1], x.dtype, backend="preadv")


def _node_rows(folder, x, stack):
    """The table stored in a shuffled row order, read by node id."""
    row_of = np.random.default_rng(5).permutation(N)
    stored = np.empty_like(x)
    stored[row_of] = x
    return NodeRows(_direct(folder, stored, stack), row_of, "features.bin")


def _timed(folder, x, stack):
    return TimedFeature(_direct(folder, x, stack))


def _timed_cached_node_rows(folder, x, stack):
    """The loader's stack: a cache over timed reads by node id."""
    nodes = _node_rows(folder, x, stack)
    cache = FeatureCache(N, 64, x.shape[1], np.float32)
    cache.switch(np.arange(64) * 3, nodes)
    return CachedFeature(cache, TimedFeature(nodes))


FEATURES: dict[str, Callable] = {
    "direct": _direct, "mmap": _mmap, "threaded_mmap": _threaded_mmap,
    "in_memory": _in_memory, "cached": _cached, "chunk_rows": _chunk_rows,
    "node_rows": _node_rows, "timed": _timed, "cached_timed_node_rows": _timed_cached_node_rows,
}
#: 24 float32 (several rows a page) and 1024 (a whole page a row): both read paths
DIMS = [24, 1024]


@pytest.fixture(params=[(k, d) for k in FEATURES for d in DIMS],
                ids=[f"{k}-{d}" for k in FEATURES for d in DIMS])
def feature(request, tmp_path):
    """``(feature, x)``: an implementation over the table ``x``."""
    name, dim = request.param
    x = _table(dim)
    with ExitStack() as stack:
        f = FEATURES[name](tmp_path, x, stack)
        yield f, x
        f.close()


def _ids(seed: int, n: int = 300) -> np.ndarray:
    """Random ids, unsorted, with repeats, the first and the last row among them."""
    rng = np.random.default_rng(seed)
    ids = np.concatenate([rng.integers(0, N, n), [0, N - 1, 7, 7]])
    return ids[rng.permutation(ids.shape[0])]


def test_a_feature_is_one(feature):
    f, x = feature
    assert isinstance(f, Feature)
    assert tuple(f.shape) == x.shape and f.dtype == np.float32


def test_read_gives_numpys_rows(feature):
    f, x = feature
    for seed in range(3):
        ids = _ids(seed)
        np.testing.assert_array_equal(f.read(ids), x[ids])
    assert f.read(np.zeros(0, np.int64)).shape == (0, x.shape[1])
    out = np.full((10, x.shape[1]), np.nan, np.float32)
    ids = _ids(9, 6)
    assert f.read(ids, out) is out
    np.testing.assert_array_equal(out, x[ids])
    np.testing.assert_array_equal(f.read(ids.astype(np.int32).tolist()), x[ids])


def test_read_into_fills_the_target_rows_only(feature):
    f, x = feature
    rng = np.random.default_rng(11)
    ids = _ids(3, 150)
    out = np.full((400, x.shape[1]), np.nan, np.float32)
    rows = rng.permutation(400)[:ids.shape[0]]
    assert f.read_into(ids, out, rows) is out
    np.testing.assert_array_equal(out[rows], x[ids])
    untouched = np.setdiff1d(np.arange(400), rows)
    assert np.isnan(out[untouched]).all()
    # a second array in the same request
    ids2 = _ids(4, 40)
    out2 = np.full((60, x.shape[1]), np.nan, np.float32)
    rows2 = rng.permutation(60)[:ids2.shape[0]]
    out[:] = np.nan
    f.read_into(ids, out, rows, (ids2, out2, rows2))
    np.testing.assert_array_equal(out[rows], x[ids])
    np.testing.assert_array_equal(out2[rows2], x[ids2])
    assert np.isnan(out[untouched]).all()
    assert np.isnan(out2[np.setdiff1d(np.arange(60), rows2)]).all()
    # no target rows: row i of out
    same = np.empty((ids.shape[0], x.shape[1]), np.float32)
    np.testing.assert_array_equal(f.read_into(ids, same, None), x[ids])


@pytest.mark.parametrize("bad", [N, -1, 10 * N])
def test_an_id_out_of_range_is_named_with_the_file(feature, bad):
    f, x = feature
    ids = np.array([3, bad, 5], np.int64)
    with pytest.raises(IdOutOfRange, match=rf"{re.escape(f.what)}: .*id {bad} out of range \[0, {N}\)"):
        f.read(ids)
    out = np.full((5, x.shape[1]), np.nan, np.float32)
    with pytest.raises(IdOutOfRange, match=rf"id {bad} out of range"):
        f.read_into(ids, out, np.array([0, 1, 2]))
    assert np.isnan(out).all()  # refused before anything was read
    with pytest.raises(IdOutOfRange, match=rf"id {bad} out of range"):
        f.read_into(np.array([1]), out, np.array([4]), (ids, out, np.array([0, 1, 2])))


def test_a_wrong_out_or_target_rows_are_refused(feature):
    f, x = feature
    d = x.shape[1]
    ids = np.array([1, 2, 3], np.int64)
    bad_outs = [np.empty((4, d), np.float32),          # rows
                np.empty((3, d + 1), np.float32),      # dim
                np.empty((3, d), np.float64),          # dtype
                np.empty((3, 2 * d), np.float32)[:, ::2]]  # not C-contiguous
    for out in bad_outs:
        with pytest.raises(InvalidValue, match=re.escape(f.what)):
            f.read(ids, out)
    out = np.empty((5, d), np.float32)
    for rows, why in [([0, 1], "3 ids but 2 target rows"), ([0, 5, 1], "target row 5 out of range"),
                      ([2, 0, 2], "target row 2 given twice"), ([0, -1, 1], "target row -1")]:
        with pytest.raises(InvalidValue, match=why):
            f.read_into(ids, out, np.array(rows))
    with pytest.raises(InvalidValue, match="out must be"):
        f.read_into(ids, np.empty((5, d), np.float64), np.array([0, 1, 2]))
    with pytest.raises(InvalidValue, match="must be integers"):
        f.read(np.array([1.0, 2.0]))


def test_stats_is_a_dict_and_close_twice_is_fine(feature):
    f, x = feature
    f.read(_ids(1, 20))
    st = f.stats()
    assert isinstance(st, dict)
    if "bytes_read" in st:
        assert st["bytes_read"] > 0
    f.close()
    f.close()


def test_the_wrappers_share_one_base():
    """Node order, timing and cache wrappers are FeatureWrappers: the inner's shape, dtype,
    name and close."""
    x = _table(8)
    inner = InMemoryFeatures(x, "x.bin")
    cache = FeatureCache(N, 10, 8, np.float32)
    for w in (NodeRows(inner, np.arange(N), "x.bin"), TimedFeature(inner),
              CachedFeature(cache, inner)):
        assert isinstance(w, FeatureWrapper) and w.inner is inner
        assert tuple(w.shape) == x.shape and w.dtype == x.dtype and w.what == "x.bin"
    t = TimedFeature(inner)
    t.read(_ids(2, 10))
    assert t.stats()["read_s"] > 0 and t.stats()["rows"] == inner.rows


def test_a_reader_that_skips_the_base_is_refused():
    """The hook is abstract: a Feature without ``_read_into`` cannot be made."""

    class NoHook(Feature):
        shape = (1, 1)
        dtype = np.dtype(np.float32)

    with pytest.raises(TypeError, match="_read_into"):
        NoHook()  # type: ignore[abstract]


# -- neighbour sources ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """``(indptr, indices, path of indices.bin)`` of a skewed random graph."""
    rng = np.random.default_rng(2)
    n, e = 600, 7000
    src = (n * rng.random(e) ** 2).astype(np.int64)
    dst = (n * rng.random(e) ** 2.5).astype(np.int64)
    indptr, indices = csc_from_edges(src, dst, n)
    indices = indices.astype(np.int32)
    path = tmp_path_factory.mktemp("nbrs") / "indices.bin"
    padded = np.zeros(-(-indices.nbytes // 4096) * 1024, np.int32)  # whole pages, as written
    padded[:indices.shape[0]] = indices
    padded.tofile(path)
    return indptr, indices, path


def _nbr_in_memory(indptr, indices, path):
    return InMemoryNeighbors(indices)


def _nbr_direct(indptr, indices, path):
    reader = DirectReader(path, backend="preadv")
    return DirectNeighbors(path, indptr, reader=reader, dtype=np.int32, owns_reader=True)


def _nbr_mmap(indptr, indices, path):
    return MmapNeighbors(np.memmap(path, dtype=np.int32, mode="r", shape=indices.shape),
                         threads=3)


def _nbr_cached(indptr, indices, path):
    cache = build_neighbor_cache(indptr, indices, 4 * indices.nbytes // 10)
    assert 0 < cache.num_cached < indptr.shape[0] - 1   # hits and misses both
    return CachedNeighbors(cache, _nbr_direct(indptr, indices, path))


NEIGHBORS = {"in_memory": _nbr_in_memory, "direct": _nbr_direct, "mmap": _nbr_mmap,
             "cached": _nbr_cached}


@pytest.fixture(params=list(NEIGHBORS))
def neighbors(request, graph):
    src = NEIGHBORS[request.param](*graph)
    yield src, graph
    src.close()


def _request(indptr: np.ndarray, seed: int) -> NeighborRequest:
    """Random frontier nodes (repeats, unsorted, some without neighbours) and random
    positions (repeats, unsorted) in each one's list."""
    rng = np.random.default_rng(seed)
    n = indptr.shape[0] - 1
    nodes = rng.integers(0, n, 200)
    deg = indptr[nodes + 1] - indptr[nodes]
    counts = np.where(deg > 0, rng.integers(0, 6, nodes.shape[0]), 0)
    offsets = np.zeros(nodes.shape[0] + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    owner = np.repeat(np.arange(nodes.shape[0]), counts)
    rel = (rng.random(owner.shape[0]) * deg[owner]).astype(np.int64)
    return NeighborRequest(nodes.astype(np.int64), offsets, rel, indptr[nodes[owner]] + rel)


def test_a_neighbor_source_gives_numpys_ids(neighbors):
    src, (indptr, indices, path) = neighbors
    assert isinstance(src, NeighborSource) and src.num_edges == indices.shape[0]
    for seed in range(4):
        req = _request(indptr, seed)
        got = src.gather(req)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, indices[req.edge_pos])
    empty = NeighborRequest(np.zeros(0, np.int64), np.zeros(1, np.int64),
                            np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert src.gather(empty).shape == (0,)
    assert isinstance(src.stats(), dict)


@pytest.mark.parametrize("where", ["end", "negative"])
def test_a_position_out_of_range_is_named_with_the_file(neighbors, where):
    src, (indptr, indices, path) = neighbors
    bad = indices.shape[0] if where == "end" else -1
    pos = np.array([0, bad], np.int64)
    req = NeighborRequest(np.zeros(1, np.int64), np.array([0, 2], np.int64), pos, pos)
    with pytest.raises(IdOutOfRange, match=rf"indices.bin: edge position {bad} out of range"):
        src.gather(req)


def test_a_neighbor_source_closes_twice(neighbors):
    src, _ = neighbors
    src.close()
    src.close()
