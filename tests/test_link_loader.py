"""ooc.LinkLoader: link batches in PyG LinkNeighborLoader's conventions, every preset."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import budget_above, community_graph

import ooc
from ooc.sampling import link_plan
from ooc.storage import OocError

PRESETS = ["baseline", "static", "ooc", "packed", "auto"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return ooc.open_dataset(community_graph(tmp_path_factory.mktemp("link") / "g", n=300))


def _epochs(ds, preset, epochs=2, **kw):
    kw.setdefault("neg_sampling", "binary")
    with ooc.LinkLoader(ds, [3, 2], batch_size=200, shuffle=True, preset=preset, seed=5,
                        superbatch_size=3, **kw) as loader:
        return [list(loader) for _ in range(epochs)], len(loader)


def test_binary_batches_follow_the_graph(graph):
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    dst_of = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    feats = np.asarray(graph.features.read(np.arange(graph.num_nodes)), dtype=np.float32)
    epochs, n_batches = _epochs(graph, "ooc", neg_sampling_ratio=1.5)
    assert n_batches == math.ceil(graph.num_edges / 200)
    orders = []
    for batches in epochs:
        ids = np.concatenate([d.input_id.numpy() for d in batches])
        assert sorted(ids.tolist()) == list(range(graph.num_edges))  # every edge once
        orders.append(ids)
        for d in batches:
            n_id = d.n_id.numpy()
            b = len(d.input_id)
            eli = n_id[d.edge_label_index.numpy()]
            # positives: the stored edges at input_id (source = neighbour, target = node)
            np.testing.assert_array_equal(eli[0, :b], indices[d.input_id.numpy()])
            np.testing.assert_array_equal(eli[1, :b], dst_of[d.input_id.numpy()])
            assert eli.shape[1] == b + math.ceil(1.5 * b)
            np.testing.assert_array_equal(d.edge_label.numpy(),
                                          np.r_[np.ones(b), np.zeros(eli.shape[1] - b)])
            seeds = n_id[:d.num_sampled_nodes[0]]
            np.testing.assert_array_equal(seeds, np.unique(eli))  # the seeds: the ends
            np.testing.assert_array_equal(d.x.numpy(), feats[n_id])
            src, dst = n_id[d.edge_index[0].numpy()], n_id[d.edge_index[1].numpy()]
            for s, t in zip(src, dst, strict=True):
                assert s in indices[indptr[t]:indptr[t + 1]]
    assert not np.array_equal(orders[0], orders[1])  # shuffled per epoch


def test_every_preset_the_same_batches(graph):
    ref, _ = _epochs(graph, "baseline", epochs=1)
    for preset in PRESETS[1:]:
        got, _ = _epochs(graph, preset, epochs=1)
        for a, b in zip(ref[0], got[0], strict=True):
            for key in ("n_id", "edge_index", "edge_label_index", "edge_label", "input_id", "x"):
                assert torch.equal(a[key], b[key]), (preset, key)


def test_given_pairs_labels_and_triplets(graph):
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, graph.num_nodes, (2, 50))
    lab = rng.integers(0, 3, 50)
    (batches,), _ = _epochs(graph, "baseline", epochs=1, edge_label_index=torch.from_numpy(pairs),
                            edge_label=torch.from_numpy(lab))
    (d,) = batches
    b = 50
    eli = d.n_id.numpy()[d.edge_label_index.numpy()]
    np.testing.assert_array_equal(eli[:, :b], pairs[:, d.input_id.numpy()])
    np.testing.assert_array_equal(d.edge_label.numpy()[:b], lab[d.input_id.numpy()] + 1)  # as PyG
    assert (d.edge_label.numpy()[b:] == 0).all()
    (batches,), _ = _epochs(graph, "static", epochs=1, edge_label_index=pairs,
                            neg_sampling="triplet", neg_sampling_ratio=3)
    (d,) = batches
    n_id = d.n_id.numpy()
    np.testing.assert_array_equal(n_id[d.src_index.numpy()], pairs[0, d.input_id.numpy()])
    np.testing.assert_array_equal(n_id[d.dst_pos_index.numpy()], pairs[1, d.input_id.numpy()])
    assert d.dst_neg_index.shape == (50, 3)
    assert "edge_label_index" not in d
    (batches,), _ = _epochs(graph, "baseline", epochs=1, edge_label_index=pairs,
                            neg_sampling=None)
    assert batches[0].edge_label_index.shape == (2, 50) and (batches[0].edge_label == 1).all()


def test_edges_per_epoch_a_new_sample_each_epoch(graph):
    indices = np.asarray(graph.indices)
    epochs, n_batches = _epochs(graph, "ooc", epochs=2, edges_per_epoch=450)
    assert n_batches == 3 and graph.num_edges > 900
    got = []
    for batches in epochs:
        ids = np.concatenate([d.input_id.numpy() for d in batches])
        assert len(ids) == len(set(ids.tolist())) == 450          # distinct stored edges
        assert ids.min() >= 0 and ids.max() < graph.num_edges
        for d in batches:
            eli = d.n_id.numpy()[d.edge_label_index.numpy()]
            np.testing.assert_array_equal(eli[0, :len(d.input_id)], indices[d.input_id.numpy()])
        got.append(set(ids.tolist()))
    assert got[0] != got[1]                                           # another sample
    with pytest.raises(OocError, match="edges_per_epoch"):
        ooc.LinkLoader(graph, [2], edges_per_epoch=0)


def test_affine_order_is_a_bijection(monkeypatch):
    """Past PERMUTE_LIMIT edges an epoch's order is an affine map: every position once."""
    monkeypatch.setattr(link_plan, "PERMUTE_LIMIT", 10)
    m = 1000
    pos = link_plan._order(m, 0, m, seed=3, epoch=2, shuffle=True)
    assert sorted(pos.tolist()) == list(range(m)) and not np.array_equal(pos, np.arange(m))
    np.testing.assert_array_equal(link_plan._order(m, 100, 300, 3, 2, True), pos[100:300])


def test_bad_arguments(graph):
    with pytest.raises(OocError, match=r"\[2, m\]"):
        ooc.LinkLoader(graph, [2], edge_label_index=np.zeros((3, 4), np.int64))
    with pytest.raises(OocError, match="out of range"):
        ooc.LinkLoader(graph, [2], edge_label_index=np.full((2, 4), 10**6))
    with pytest.raises(OocError, match="neg_sampling"):
        ooc.LinkLoader(graph, [2], neg_sampling="both")
    with pytest.raises(OocError, match="no link split"):
        ooc.LinkLoader(graph, [2], edge_label_index="val")
    with pytest.raises(OocError, match="one per pair"):
        ooc.LinkLoader(graph, [2], edge_label_index=np.zeros((2, 4), np.int64),
                       edge_label=np.zeros(3))


@pytest.mark.parametrize("neg", ["binary", "triplet", None])
def test_pyg_link_neighbor_loader_over_ooc_pyg(graph, neg):
    """PyG's own LinkNeighborLoader over ooc.pyg's stores and sampler: every batch against
    the dataset (its edges, the features, the labels PyG's conventions give)."""
    import ooc.pyg
    from torch_geometric.loader import LinkNeighborLoader

    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    feats = np.asarray(graph.features.read(np.arange(graph.num_nodes)), dtype=np.float32)
    rng = np.random.default_rng(1)
    pairs = torch.from_numpy(rng.integers(0, graph.num_nodes, (2, 130)))
    fs, gs, sampler = ooc.pyg.remote_backend(graph, num_neighbors=[3, 2], plan_ahead=False)
    try:
        loader = LinkNeighborLoader((fs, gs), num_neighbors=[3, 2], edge_label_index=(None, pairs),
                                    neg_sampling=neg,
                                    batch_size=50, neighbor_sampler=sampler)
        seen = []
        for d in loader:
            n_id = d.n_id.numpy()
            np.testing.assert_array_equal(d.x.numpy(), feats[n_id])
            src, dst = n_id[d.edge_index[0].numpy()], n_id[d.edge_index[1].numpy()]
            for s, t in zip(src, dst, strict=True):
                assert s in indices[indptr[t]:indptr[t + 1]]
            ids = d.input_id.numpy()
            seen.append(ids)
            b = len(ids)
            if neg == "triplet":
                np.testing.assert_array_equal(n_id[d.src_index.numpy()], pairs[0, ids].numpy())
                np.testing.assert_array_equal(n_id[d.dst_pos_index.numpy()],
                                              pairs[1, ids].numpy())
                assert d.dst_neg_index.shape == (b,)
            else:
                eli = n_id[d.edge_label_index.numpy()]
                np.testing.assert_array_equal(eli[:, :b], pairs[:, ids].numpy())
                want = np.r_[np.ones(b), np.zeros(b)] if neg else np.ones(b)
                if neg is None:
                    assert "edge_label" not in d or d.edge_label is None
                else:
                    np.testing.assert_array_equal(d.edge_label.numpy(), want)
        assert sorted(np.concatenate(seen).tolist()) == list(range(130))
        assert sampler.stats()["on_demand_batches"] == 3
    finally:
        sampler.close()


def test_memory_budget_plans_link_batches(graph):
    """Under a budget the plan probes the loader's own link batches; the batches stay the
    unbudgeted loader's, alone or in a budget shared with a node loader."""
    ref, _ = _epochs(graph, "ooc", epochs=1)
    got, _ = _epochs(graph, "ooc", epochs=1, memory_budget=budget_above(768 << 20))
    for a, b in zip(ref[0], got[0], strict=True):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_label_index, b.edge_label_index)
    with ooc.memory_budget(budget_above(1 << 30)):
        link = ooc.LinkLoader(graph, [3, 2], neg_sampling="binary", batch_size=200, shuffle=True,
                              seed=5, superbatch_size=3)
        node = ooc.NodeLoader(graph, [3, 2], input_nodes="train", batch_size=64)
    with link, node:
        shared = list(link)
        assert len(list(node)) == len(node)
        assert link.memory_plan is not None
    for a, b in zip(ref[0], shared, strict=True):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x)


def test_degree_biased_negatives(graph):
    """neg_distribution="degree": a negative's node drawn in proportion to its in-degree."""
    deg = np.diff(np.asarray(graph.indptr))
    from ooc.executor.loader.link_loader import edge_seeds

    seeds = edge_seeds(graph, None, None, "binary", 1.0, "degree")
    drawn = seeds.draw(np.random.default_rng(0), 200_000)
    counts = np.bincount(drawn, minlength=graph.num_nodes)
    assert counts[deg == 0].sum() == 0
    expected = 200_000 * deg / deg.sum()
    big = expected > 200
    assert np.all(np.abs(counts[big] - expected[big]) < 5 * np.sqrt(expected[big]))
    (batches,), _ = _epochs(graph, "static", epochs=1, neg_distribution="degree")
    for d in batches:
        b = len(d.input_id)
        neg = d.n_id.numpy()[d.edge_label_index.numpy()[:, b:]]
        assert (deg[neg] > 0).all()
    with pytest.raises(OocError, match="neg_distribution"):
        ooc.LinkLoader(graph, [2], neg_sampling="binary", neg_distribution="popular")
