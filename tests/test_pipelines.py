"""Every mode's pipeline yields the same batches with bit-identical feature rows."""
import numpy as np
import pytest

from ooc.caches.feature_cache import FeatureCache
from ooc.executor.loader.pipelines import OnDemandPipeline, SuperbatchPipeline
from ooc.sampling.pipeline import Inspector
from ooc.sampling.sampler import NeighborSampler
from ooc.storage import csc_from_edges, open_dataset, write_dataset


@pytest.fixture
def ds(tmp_path):
    n = 3000
    rng = np.random.default_rng(5)
    # skewed sources so some nodes are hot
    src = (rng.pareto(1.2, 30000) * 50).astype(np.int64) % n
    dst = rng.integers(0, n, 30000)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, 24)).astype(np.float16)
    p = write_dataset(tmp_path / "d", indptr, indices, x, labels=rng.integers(0, 3, n),
                      train_idx=np.arange(0, n, 2), num_classes=3)
    return open_dataset(p), x


def _check(pipe, sampler, x, epoch):
    seed_batches, bseeds = pipe.plan(epoch)
    k = 0
    for batch, rows in pipe.batches(epoch):
        assert batch.equals(sampler.sample(seed_batches[k], bseeds[k]))
        assert rows.dtype == x.dtype
        np.testing.assert_array_equal(rows, x[batch.node_ids])
        k += 1
    assert k == len(seed_batches) == len(pipe)


def test_baseline_pipeline(ds):
    d, x = ds
    sampler = NeighborSampler(d.indptr, d.indices, [5, 5])
    pipe = OnDemandPipeline(sampler, d.train_idx, 64, 7, d.features)
    _check(pipe, sampler, x, 1)
    assert pipe.misses == pipe.lookups > 0
    assert {"sample", "gather"} <= set(pipe.stage_times())


def test_static_pipeline(ds):
    d, x = ds
    sampler = NeighborSampler(d.indptr, d.indices, [5, 5])
    cache = FeatureCache(d.num_nodes, 300, d.feature_dim, d.feature_dtype)
    cache.fill_static(np.argsort(-d.out_degrees(), kind="stable"), d.features)
    pipe = OnDemandPipeline(sampler, d.train_idx, 64, 7, d.features, cache=cache)
    _check(pipe, sampler, x, 2)
    assert 0 < pipe.misses < pipe.lookups


@pytest.mark.parametrize("capacity,superbatch", [(150, 4), (600, 100), (0, 3)])
def test_superbatch_pipeline_heavy_churn(ds, tmp_path, capacity, superbatch):
    from ooc.caches.changesets import precompute_changesets

    d, x = ds
    sampler = NeighborSampler(d.indptr, d.indices, [5, 5])
    cache = FeatureCache(d.num_nodes, capacity, d.feature_dim, d.feature_dtype)
    cs_fn = lambda ids: precompute_changesets(ids, d.num_nodes, capacity)  # noqa: E731
    insp = Inspector(sampler, tmp_path / "rt", superbatch, changesets=cs_fn)
    pipe = SuperbatchPipeline(insp, d.train_idx, 64, 7, d.features, cache)
    _check(pipe, sampler, x, 3)
    # the misses equal an independent Belady count per superbatch
    seed_batches, bseeds = pipe.plan(3)
    ids = [sampler.sample(s, b).node_ids for s, b in zip(seed_batches, bseeds, strict=True)]
    expected = 0
    for a in range(0, len(ids), superbatch):
        expected += _belady_misses(ids[a:a + superbatch], capacity)
    assert pipe.misses == expected
    assert len(cache) <= capacity
    assert not any((tmp_path / "rt").rglob("*.bin"))


def _belady_misses(batches, capacity):
    """Brute force: cache starts with the soonest-used ids; after each batch keep
    the capacity ids of cache ∪ batch used soonest (never-used-again dropped)."""
    def next_use(v, after):
        for j in range(after, len(batches)):
            if v in sets[j]:
                return j
        return None

    sets = [set(b.tolist()) for b in batches]
    cand = set().union(*sets) if sets else set()
    ranked = sorted((next_use(v, 0), v) for v in cand)
    cache = {v for _, v in ranked[:capacity]}
    misses = 0
    for i, s in enumerate(sets):
        misses += len(s - cache)
        pool = [(next_use(v, i + 1), v) for v in cache | s]
        pool = sorted((u, v) for u, v in pool if u is not None)
        cache = {v for _, v in pool[:capacity]}
    return misses


def test_superbatch_pipeline_page_mates(ds, tmp_path):
    """Rows share pages (24 float16 a row): the changesets insert page-mates, which the
    gather reads with the batch's misses into the cache; every batch's rows stay exact and
    the misses are the changesets' own, fewer than without page-mates."""
    from ooc.caches.changesets import precompute_changesets

    d, x = ds
    pages = d.row_pages()
    assert pages is not None
    sampler = NeighborSampler(d.indptr, d.indices, [5, 5])
    capacity, superbatch = 400, 6
    cache = FeatureCache(d.num_nodes, capacity, d.feature_dim, d.feature_dtype)

    def cs_fn(ids, pages=pages):
        return precompute_changesets(ids, d.num_nodes, capacity, pages=pages, mate_fraction=0.5)
    insp = Inspector(sampler, tmp_path / "rt", superbatch, changesets=cs_fn)
    pipe = SuperbatchPipeline(insp, d.train_idx, 64, 7, d.features, cache)
    _check(pipe, sampler, x, 3)
    seed_batches, bseeds = pipe.plan(3)
    ids = [sampler.sample(s, b).node_ids for s, b in zip(seed_batches, bseeds, strict=True)]
    parts = [ids[a:a + superbatch] for a in range(0, len(ids), superbatch)]
    assert pipe.misses == sum(cs_fn(p).num_misses for p in parts)
    assert pipe.misses < sum(_belady_misses(p, capacity) for p in parts)
    mates = sum(int((c.in_positions >= np.repeat([len(b) for b in p], np.diff(c.in_ptr))).sum())
                for p in parts for c in [cs_fn(p)])
    assert cache.mates_read == mates > 0
    assert pipe.io_stats()["feature_page_mates_read"] == mates
