"""The feature cache against plain numpy indexing, under heavy churn."""
import numpy as np
import pytest

from ooc.caches.feature_cache import FeatureCache
from ooc.storage.features import InMemoryFeatures


class ArraySource(InMemoryFeatures):
    """Rows of ``x``, counting the rows read (``reads``)."""

    @property
    def reads(self) -> int:
        return self.rows


def _random_changeset(rng, cached, batch, capacity):
    """A valid changeset: insert some batch ids not cached, evict enough to fit."""
    cand = np.setdiff1d(batch, cached)
    ins = rng.choice(cand, size=min(len(cand), rng.integers(0, capacity + 1)), replace=False) \
        if len(cand) else np.zeros(0, np.int64)
    room = capacity - len(cached)
    need = max(0, len(ins) - room)
    extra = rng.integers(0, 3)
    evict = rng.choice(cached, size=min(len(cached), need + extra), replace=False) \
        if len(cached) else np.zeros(0, np.int64)
    if len(cached) - len(evict) + len(ins) > capacity:
        ins = ins[: capacity - (len(cached) - len(evict))]
    return ins.astype(np.int64), evict.astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_and_update_match_numpy(dtype):
    rng = np.random.default_rng(0)
    n, d, cap = 300, 17, 40
    x = rng.standard_normal((n, d)).astype(dtype)
    src = ArraySource(x)
    fc = FeatureCache(n, cap, d, dtype)
    init = rng.choice(n, 25, replace=False)
    assert fc.switch(init, src) == 25
    cached = np.sort(init)
    total_miss = 0
    for step in range(200):
        batch = rng.choice(n, rng.integers(1, 60), replace=False)
        out, nmiss = fc.gather(batch, src)
        np.testing.assert_array_equal(out, x[batch])
        assert nmiss == len(np.setdiff1d(batch, cached))
        total_miss += nmiss
        ins, evict = _random_changeset(rng, cached, batch, cap)
        pos = np.array([np.flatnonzero(batch == i)[0] for i in ins], dtype=np.int64)
        fc.update(ins, evict, pos, out)
        cached = np.sort(np.union1d(np.setdiff1d(cached, evict), ins))
        np.testing.assert_array_equal(fc.cached_ids(), cached)
        assert len(fc) == len(cached) <= cap
        slots = fc.slots.get(cached)
        assert (slots >= 0).all()
        np.testing.assert_array_equal(fc.cache[slots], x[cached])
        if step % 50 == 49:  # a superbatch switch keeps the rows that stay
            new_init = rng.choice(n, 30, replace=False)
            reads_before = src.reads
            fc.switch(new_init, src)
            assert src.reads - reads_before == len(np.setdiff1d(new_init, cached))
            cached = np.sort(new_init)
            np.testing.assert_array_equal(fc.cached_ids(), cached)
    assert fc.lookups > 0 and fc.hits == fc.lookups - total_miss


def test_zero_capacity_reads_everything():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    fc = FeatureCache(10, 0, 4, np.float32)
    out, nmiss = fc.gather(np.array([3, 1]), ArraySource(x))
    np.testing.assert_array_equal(out, x[[3, 1]])
    assert nmiss == 2
    fc.update(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), out)


def test_cached_feature_follows_the_feature_protocol(tmp_path):
    """CachedFeature over an O_DIRECT reader: rows equal numpy's, hits from the cache,
    misses from the fallback, ``out=`` honoured; a Feature like the readers it wraps."""
    from ooc.caches.feature_cache import CachedFeature
    from ooc.storage import DirectFeatures, FeatureLayout
    from ooc.storage.features import Feature

    rng = np.random.default_rng(3)
    x = rng.standard_normal((500, 24)).astype(np.float32)
    lay = FeatureLayout(500, 24, "float32")
    buf = np.zeros(lay.file_bytes, np.uint8)
    view = lay.view(buf)
    view[0:500] = x
    path = tmp_path / "features.bin"
    buf.tofile(path)
    cache = FeatureCache(500, 50, 24, np.float32)
    with DirectFeatures(path, lay, queue_depth=8) as disk:
        cache.fill_static(np.arange(100, 150), disk)
        f = CachedFeature(cache, disk)
        assert isinstance(f, Feature) and f.shape == (500, 24) and f.dtype == np.float32
        ids = rng.integers(0, 500, 300)
        out = np.empty((300, 24), np.float32)
        got = f.read(ids, out)
        assert got is out
        np.testing.assert_array_equal(got, x[ids])
        hits = int(((ids >= 100) & (ids < 150)).sum())
        st = f.stats()
        assert st["hits"] == hits and st["misses"] == 300 - hits and st["lookups"] == 300


def test_misses_are_read_straight_into_the_batch_through_any_wrapper():
    """The cache reads a gather's misses with the source's ``read_into`` into the batch's
    rows (one path), through the loader's timing wrapper and the node-order wrapper too:
    numpy's rows, the misses the only rows read."""
    from ooc.executor.loader.readers import TimedFeature
    from ooc.storage.features import NodeRows

    rng = np.random.default_rng(4)
    table = rng.standard_normal((300, 5)).astype(np.float32)
    calls: list[int] = []

    class Into(InMemoryFeatures):
        def _read_into(self, ids, out, rows):
            calls.append(len(ids))
            super()._read_into(ids, out, rows)

    ids = rng.permutation(300)[:120]
    identity = np.arange(300)
    for source in [Into(table), TimedFeature(Into(table)), NodeRows(Into(table), identity, "f")]:
        cache = FeatureCache(300, 50, 5, np.float32)
        cache.switch(np.arange(50), ArraySource(table))
        calls.clear()
        out, nmiss = cache.gather(ids, source)
        np.testing.assert_array_equal(out, table[ids])
        assert calls == [nmiss] and nmiss == int((ids >= 50).sum())


def _direct_table(tmp_path, n: int, dim: int, seed: int):
    """A features file of ``n`` random float32 rows of ``dim`` in ooc's page layout, and
    the rows."""
    from ooc.storage.layout import FeatureLayout

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    lay = FeatureLayout(n, dim, "float32")
    buf = np.zeros(lay.file_bytes, np.uint8)
    for r in range(n):
        page, slot = divmod(r, lay.rows_per_page) if lay.rows_per_page else (r, 0)
        off = page * 4096 * max(1, lay.pages_per_row) + slot * lay.row_bytes
        buf[off:off + x[r].nbytes] = x[r].view(np.uint8)
    (tmp_path / "f.bin").write_bytes(buf.tobytes())
    return tmp_path / "f.bin", lay, x


@pytest.mark.parametrize("row_dim", [100, 1024])
def test_a_switch_reads_rows_straight_into_the_cache(tmp_path, row_dim):
    """A switch from a DirectFeatures source reads the new rows into their slots (no row
    buffer): the cache then serves numpy's rows for rows smaller and as large as a page,
    in chunks smaller than the fill."""
    from ooc.storage.direct import DirectFeatures

    path, lay, x = _direct_table(tmp_path, 3000, row_dim, 6)
    rng = np.random.default_rng(7)
    with DirectFeatures(path, lay, backend="preadv") as src:
        cache = FeatureCache(3000, 700, row_dim, np.float32)
        cache.switch_chunk = 128
        first = rng.permutation(3000)[:700]
        assert cache.switch(first, src) == 700
        second = np.concatenate([first[:300], rng.permutation(3000)[:400]])
        second = np.unique(second)[:700]
        cache.switch(second, src)
        before = src.reader.stats.rows_direct + src.reader.stats.rows_copied

        class Refuse(InMemoryFeatures):
            def _read_into(self, ids, out, rows):
                raise AssertionError("a hit was read")

        out, misses = cache.gather(second, Refuse(x))
        np.testing.assert_array_equal(out, x[second])
        assert misses == 0 and src.reader.stats.rows_direct + src.reader.stats.rows_copied == before


@pytest.mark.parametrize("row_dim", [32, 1024])
def test_misses_read_on_another_thread_while_the_hits_are_copied(tmp_path, row_dim):
    """With OVERLAP_MIN_BYTES of hits or more, a gather copies the hits while another thread
    reads the misses (and page-mates) into the same array: numpy's rows, every miss read
    once, on a thread other than the caller's; under the threshold, on the caller's."""
    import threading

    from ooc.caches import feature_cache as FC
    from ooc.storage.direct import DirectFeatures

    need = FC.OVERLAP_MIN_BYTES // (4 * row_dim)  # hits that start the reading thread
    n = 3 * need
    path, lay, x = _direct_table(tmp_path, n, row_dim, 8)
    rng = np.random.default_rng(9)
    threads: list[str] = []
    with DirectFeatures(path, lay, backend="preadv") as src:
        real = src.read_into

        def read_into(*a):
            threads.append(threading.current_thread().name)
            return real(*a)

        src.read_into = read_into
        cache = FeatureCache(n, need + 500, row_dim, np.float32)
        cache.switch(np.arange(need + 500), src)
        ids = rng.permutation(np.concatenate([rng.permutation(need + 500)[:-200],
                                              rng.permutation(np.arange(need
                                                                        + 500, n))[:3000]]))
        hits = int((ids < need + 500).sum())
        assert hits >= need
        mates = np.setdiff1d(np.arange(need + 500, n), ids)[:300]
        mates_out = np.empty((len(mates), row_dim), np.float32)
        threads.clear()
        before = src.reader.stats.rows_direct + src.reader.stats.rows_copied
        out, misses = cache.gather(ids, src, mates=mates, mates_out=mates_out)
        np.testing.assert_array_equal(out, x[ids])
        np.testing.assert_array_equal(mates_out, x[mates])
        assert misses == len(ids) - hits
        assert src.reader.stats.rows_direct + src.reader.stats.rows_copied - before == misses + len(mates)
        assert threads == ["ooc-miss-read"]
        threads.clear()
        few = np.concatenate([np.arange(10), np.arange(n - 10, n)])  # 10 hits
        out, misses = cache.gather(few, src)
        np.testing.assert_array_equal(out, x[few])
        assert misses == 10 and threads == [threading.current_thread().name]


def test_a_failed_miss_read_on_the_reading_thread_reaches_the_caller():
    """The error a miss read raises on the reading thread is raised by ``gather``, and the
    cache's counters are left as they were."""
    from ooc.caches import feature_cache as FC

    need = FC.OVERLAP_MIN_BYTES // 16  # rows of 4 float32
    n = 3 * need
    table = np.arange(n * 4, dtype=np.float32).reshape(n, 4)

    class Failing(InMemoryFeatures):
        def _read_into(self, ids, out, rows):
            raise OSError(5, "Input/output error: f.bin")

    cache = FeatureCache(n, 2 * need, 4, np.float32)
    cache.switch(np.arange(2 * need), ArraySource(table))
    with pytest.raises(OSError, match="Input/output error"):
        cache.gather(np.arange(n), Failing(table))
    assert cache.lookups == 0 and cache.hits == 0
