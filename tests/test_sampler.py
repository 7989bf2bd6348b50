"""Neighbour sampler v0 against a slow pure-Python reference."""
from __future__ import annotations

import numpy as np
import pytest

from ooc.sampling import _sampler_kernels as K
from ooc.sampling.sampler import NeighborSampler, SampledBatch, derive_seed, epoch_batches
from ooc.storage import csc_from_edges


def power_law_graph(n=600, e=6000, seed=0):
    rng = np.random.default_rng(seed)
    # skewed sources and targets so some nodes have large in-degree (> 64: the
    # hash-set branch of the selection) and some none
    src = (n * rng.random(e) ** 2).astype(np.int64)
    dst = (n * rng.random(e) ** 3).astype(np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    pairs = np.unique(np.stack([src, dst], 1), axis=0)
    return csc_from_edges(pairs[:, 0], pairs[:, 1], n)


@pytest.fixture(scope="module")
def graph():
    indptr, indices = power_law_graph()
    return indptr, indices.astype(np.int32)


def reference_sample(indptr, indices, fanouts, seeds, batch_seed) -> SampledBatch:
    """Slow, independent implementation of the documented algorithm."""
    node_ids = [int(s) for s in seeds]
    local = {v: i for i, v in enumerate(node_ids)}
    frontier = list(node_ids)
    src, dst, nn, ne = [], [], [len(node_ids)], []
    for h, f in enumerate(fanouts, start=1):
        new = []
        edges = 0
        for v in frontier:
            lst = indices[indptr[v]:indptr[v + 1]]
            d = len(lst)
            k = d if (f < 0 or d < f) else f
            key = K.py_node_key(batch_seed, h, v, d)
            for p in K.py_select(key, d, k):
                u = int(lst[p])
                if u not in local:
                    local[u] = len(node_ids)
                    node_ids.append(u)
                    new.append(u)
                src.append(local[u])
                dst.append(local[v])
                edges += 1
        nn.append(len(new))
        ne.append(edges)
        frontier = new
    return SampledBatch(np.array(node_ids, dtype=np.int64), len(seeds),
                        np.array([src, dst], dtype=np.int64).reshape(2, -1), nn, ne)


def check_properties(b: SampledBatch, indptr, indices, fanouts, seeds):
    n = b.node_ids.shape[0]
    assert b.node_ids.dtype == np.int64 and b.edge_index.dtype == np.int64
    assert np.unique(b.node_ids).shape[0] == n
    np.testing.assert_array_equal(b.node_ids[:b.num_seeds], seeds)
    assert b.num_sampled_nodes[0] == b.num_seeds == len(seeds)
    assert sum(b.num_sampled_nodes) == n
    assert len(b.num_sampled_edges) == len(fanouts)
    assert sum(b.num_sampled_edges) == b.edge_index.shape[1]
    assert b.edge_index.min(initial=0) >= 0 and b.edge_index.max(initial=0) < n
    node_start = np.cumsum([0] + b.num_sampled_nodes)
    edge_start = np.cumsum([0] + b.num_sampled_edges)
    for h, f in enumerate(fanouts):
        s, d = b.edge_index[:, edge_start[h]:edge_start[h + 1]]
        # targets are exactly the previous hop's new nodes
        assert np.all((d >= node_start[h]) & (d < node_start[h + 1]))
        # sources were known by the end of this hop
        assert np.all(s < node_start[h + 2])
        for t in range(node_start[h], node_start[h + 1]):
            v = b.node_ids[t]
            nbrs = b.node_ids[s[d == t]]
            true = indices[indptr[v]:indptr[v + 1]]
            deg = true.shape[0]
            # without replacement: each position at most once; graph has no multi-edges
            assert np.unique(nbrs).shape[0] == nbrs.shape[0]
            assert np.isin(nbrs, true).all()          # real in-neighbours
            assert nbrs.shape[0] == (deg if f < 0 else min(f, deg))
            if f < 0:
                np.testing.assert_array_equal(np.sort(nbrs), np.sort(true))
        # new nodes of hop h+1 are in frontier order of first appearance
        new = b.node_ids[node_start[h + 1]:node_start[h + 2]]
        srcs_global = b.node_ids[s]
        _, first = np.unique(srcs_global, return_index=True)
        seen_before = set(b.node_ids[:node_start[h + 1]].tolist())
        order = [int(u) for u in srcs_global[np.sort(first)] if int(u) not in seen_before]
        assert order == new.tolist()


@pytest.mark.parametrize("fanouts", [[5, 3], [-1, 2], [10, -1], [3, 0, 2], [100, 4, 2], [-1]])
def test_matches_reference_and_properties(graph, fanouts):
    indptr, indices = graph
    s = NeighborSampler(indptr, indices, fanouts)
    rng = np.random.default_rng(1)
    for trial in range(3):
        seeds = rng.choice(indptr.shape[0] - 1, size=17, replace=False).astype(np.int64)
        bseed = derive_seed(7, 0, trial)
        b = s.sample(seeds, bseed)
        check_properties(b, indptr, indices, fanouts, seeds)
        ref = reference_sample(indptr, indices, fanouts, seeds, bseed)
        assert b.equals(ref)


def test_edges_map_to_real_edges(graph):
    indptr, indices = graph
    b = NeighborSampler(indptr, indices, [4, 4]).sample(np.arange(0, 40, 3), 5)
    edges = set(zip(indices.tolist(), np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr)).tolist(),
                    strict=True))
    g = b.node_ids[b.edge_index]
    assert all((int(u), int(v)) in edges for u, v in g.T)


def test_selection_without_replacement_and_uniform():
    # big k uses the hash-set branch, small k the linear scan; both equal the twin
    out = np.empty(300, dtype=np.int64)
    for d, k in [(10, 3), (100, 64), (500, 65), (1000, 300), (7, 7), (5, 9)]:
        key = K.py_node_key(3, 1, d, d)
        K.select_positions(np.uint64(key), d, min(k, d), out, 0)
        got = out[:min(k, d)].tolist()
        assert got == K.py_select(key, d, min(k, d))
        assert len(set(got)) == len(got) and all(0 <= p < d for p in got)
    # rough uniformity: each of 10 positions picked ~ 3/10 of the time
    counts = np.zeros(10)
    for v in range(3000):
        counts[K.py_select(K.py_node_key(1, 1, v, 10), 10, 3)] += 1
    assert np.all(np.abs(counts / 3000 - 0.3) < 0.04)


def test_determinism_and_independence(graph):
    indptr, indices = graph
    s = NeighborSampler(indptr, indices, [5, 5])
    seeds = np.arange(0, 60, 2)
    a = s.sample(seeds, 11)
    assert a.equals(s.sample(seeds, 11))
    assert not a.equals(s.sample(seeds, 12))
    assert derive_seed(0, 0, 0) != derive_seed(0, 0, 1) != derive_seed(0, 1, 0)
    assert derive_seed(3, 4, 5) == derive_seed(3, 4, 5) and 0 <= derive_seed(-1, -1, -1) < 2**63


def test_sample_many_equals_sample_any_threads_and_grouping(graph):
    import numba
    indptr, indices = graph
    batches = epoch_batches(np.arange(indptr.shape[0] - 1), 37, seed=3, epoch=2)
    seeds = [derive_seed(3, 2, i) for i in range(len(batches))]
    one = [NeighborSampler(indptr, indices, [6, 3], num_threads=1).sample(b, s)
           for b, s in zip(batches, seeds, strict=True)]
    for nt, group in [(None, 64), (numba.config.NUMBA_NUM_THREADS, 5), (1, 1)]:
        many = NeighborSampler(indptr, indices, [6, 3], num_threads=nt,
                               group_size=group).sample_many(batches, seeds)
        assert len(many) == len(one) and all(x.equals(y) for x, y in zip(many, one, strict=True))


def test_epoch_batches():
    idx = np.arange(100, 203)
    b = epoch_batches(idx, 10, seed=1, epoch=0)
    assert [x.shape[0] for x in b] == [10] * 10 + [3]
    np.testing.assert_array_equal(np.sort(np.concatenate(b)), idx)
    assert all(x.dtype == np.int64 for x in b)
    again = epoch_batches(idx, 10, seed=1, epoch=0)
    assert all(np.array_equal(x, y) for x, y in zip(b, again, strict=True))
    other = epoch_batches(idx, 10, seed=1, epoch=1)
    assert not all(np.array_equal(x, y) for x, y in zip(b, other, strict=True))
    np.testing.assert_array_equal(np.concatenate(epoch_batches(idx, 10, 1, 0, shuffle=False)), idx)


def test_bad_input(graph):
    indptr, indices = graph
    s = NeighborSampler(indptr, indices, [2])
    with pytest.raises(ValueError, match="duplicate"):
        s.sample(np.array([1, 2, 1]), 0)
    with pytest.raises(ValueError, match="outside"):
        s.sample(np.array([1, indptr.shape[0] - 1]), 0)
    with pytest.raises(ValueError):
        NeighborSampler(indptr, indices, [-2])
    empty = s.sample(np.zeros(0, dtype=np.int64), 0)
    assert empty.num_nodes == 0 and empty.edge_index.shape == (2, 0)
    assert empty.num_sampled_nodes == [0, 0] and empty.num_sampled_edges == [0]


@pytest.mark.parametrize("bad_id", [2**31 - 1, -3, 600])
def test_neighbour_id_out_of_range_names_position(graph, tmp_path, bad_id):
    """A bad id anywhere a sample reaches is a DatasetError naming the file and
    the id's position (not a crash); found against a brute-force search of the
    positions the sample read."""
    from ooc.storage import DatasetError

    indptr, indices = graph
    n = indptr.shape[0] - 1
    path = tmp_path / "indices.bin"
    mm = np.memmap(path, dtype=np.int32, mode="w+", shape=indices.shape)
    mm[:] = indices
    seeds = np.arange(0, n, 7)
    ok = NeighborSampler(indptr, mm, [5, 5]).sample(seeds, 3)
    hop1 = ok.edge_index[:, :ok.num_sampled_edges[0]]
    # the position of the first hop-1 edge: its target's list holds its source
    v = ok.node_ids[hop1[1, 0]]
    u = ok.node_ids[hop1[0, 0]]
    pos = int(indptr[v] + np.flatnonzero(indices[indptr[v]:indptr[v + 1]] == u)[0])
    mm[pos] = bad_id
    mm.flush()
    with pytest.raises(DatasetError, match=rf"indices.bin: node id {bad_id} at position {pos} "
                                           rf"is out of range \[0, {n}\)"):
        NeighborSampler(indptr, mm, [5, 5]).sample(seeds, 3)


def test_indices_shorter_than_indptr(graph):
    from ooc.storage import DatasetError

    indptr, indices = graph
    with pytest.raises(DatasetError, match=rf"holds {indices.shape[0] - 5} ids, but indptr has "
                                           rf"{indices.shape[0]} edges"):
        NeighborSampler(indptr, indices[:-5], [-1])


def test_pyg_graphsage_trim_to_layer(graph):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn.models import GraphSAGE

    indptr, indices = graph
    n = indptr.shape[0] - 1
    torch.manual_seed(0)
    x_all = torch.randn(n, 8)
    b = NeighborSampler(indptr, indices, [5, 3, 2]).sample(np.arange(10, 30), 99)
    model = GraphSAGE(8, 16, num_layers=3, out_channels=4).eval()
    x = x_all[torch.from_numpy(b.node_ids)]
    ei = torch.from_numpy(b.edge_index)
    with torch.no_grad():
        full = model(x, ei)[:b.num_seeds]
        trimmed = model(x, ei, num_sampled_nodes_per_hop=b.num_sampled_nodes,
                        num_sampled_edges_per_hop=b.num_sampled_edges)[:b.num_seeds]
    assert trimmed.shape == (20, 4)
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000])
def test_node_offsets_equal_indptr(n, monkeypatch):
    """The sampler's compact indptr (uint32 within 64-node blocks, an int64 base per
    block) gives indptr back exactly, built over several chunks, at 4.125 bytes a node."""
    from ooc.storage import offsets as O

    monkeypatch.setattr(O, "CHUNK", 128)  # several chunks, each a whole number of blocks
    rng = np.random.default_rng(n)
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 50, n))]).astype(np.int64)
    off = O.NodeOffsets(indptr)
    assert off.rel.dtype == np.uint32 and off.num_nodes == n and off.num_edges == indptr[-1]
    np.testing.assert_array_equal(off[np.arange(n + 1)], indptr)
    assert off.nbytes == 4 * (n + 1) + 8 * (-(-(n + 1) // 64)) == O.NodeOffsets.bytes_for(n)


def test_node_offsets_keep_int64_where_a_block_spans_2_to_the_32():
    from ooc.storage.offsets import NodeOffsets

    indptr = np.array([0, 5, (1 << 32) + 7, (1 << 32) + 9], dtype=np.int64)
    off = NodeOffsets(indptr)
    assert off.rel.dtype == np.int64
    np.testing.assert_array_equal(off[np.arange(4)], indptr)
    small = NodeOffsets(np.array([0, (1 << 32) - 1], dtype=np.int64))
    assert small.rel.dtype == np.uint32 and small[1] == (1 << 32) - 1


def test_samplers_of_a_dataset_share_one_offsets(small_dataset):
    from ooc.storage import open_dataset

    ds = open_dataset(small_dataset[0])
    a = NeighborSampler(ds.node_offsets(), ds.indices, [3])
    b = NeighborSampler(ds.node_offsets(), ds.indices, [5, 2])
    assert a.offsets is b.offsets is ds.node_offsets()
    ref = NeighborSampler(np.asarray(ds.indptr), np.asarray(ds.indices), [5, 2])
    seeds = np.asarray(ds.train_idx[:40])
    x, y = b.sample(seeds, 9), ref.sample(seeds, 9)
    np.testing.assert_array_equal(x.node_ids, y.node_ids)
    np.testing.assert_array_equal(x.edge_index, y.edge_index)
