"""ooc.NodeLoader: a user's own PyG model and loop over out-of-core batches."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import community_graph, require_cora

import ooc
from ooc.storage import OocError

PRESETS = ["baseline", "static", "ooc"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = community_graph(tmp_path_factory.mktemp("loader") / "g", n=600)
    return ooc.open_dataset(path)


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from ooc.storage.ingest import ingest_planetoid

    raw = require_cora()
    out = tmp_path_factory.mktemp("cora") / "cora"
    ingest_planetoid(raw.parent.parent, "Cora", out)
    return ooc.open_dataset(out)


def _batches(ds, preset, **kw):
    with ooc.NodeLoader(ds, num_neighbors=[4, 3], batch_size=64, input_nodes="train",
                        shuffle=True, preset=preset, seed=7, superbatch_size=3, **kw) as loader:
        return [list(loader) for _ in range(2)], loader.stats()


def test_batches_follow_the_graph(graph):
    """Every batch against the dataset itself: edges are in-edges of the CSC, x are the
    feature rows of n_id, y the seeds' labels, the seeds an epoch's permutation."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    feats = np.asarray(graph.features.read(np.arange(graph.num_nodes)), dtype=np.float32)
    epochs, stats = _batches(graph, "ooc")
    assert stats["setup"]["reader_backend"]
    for batches in epochs:
        seeds = np.concatenate([d.n_id[:d.batch_size].numpy() for d in batches])
        assert sorted(seeds.tolist()) == sorted(np.asarray(graph.train_idx).tolist())
        for d in batches:
            n_id = d.n_id.numpy()
            assert len(np.unique(n_id)) == len(n_id)
            np.testing.assert_array_equal(d.x.numpy(), feats[n_id])
            np.testing.assert_array_equal(d.y.numpy(), np.asarray(graph.labels)[n_id])  # PyG's y
            src, dst = n_id[d.edge_index[0].numpy()], n_id[d.edge_index[1].numpy()]
            for s, t in zip(src, dst, strict=True):
                assert s in indices[indptr[t]:indptr[t + 1]]
            assert sum(d.num_sampled_nodes) == len(n_id)
            assert sum(d.num_sampled_edges) == d.edge_index.shape[1]
            assert d.num_sampled_nodes[0] == d.batch_size
    # the two epochs differ (a new shuffle each iter())
    assert not all(torch.equal(a.n_id, b.n_id) for a, b in zip(*epochs, strict=True))


def test_presets_yield_identical_batches(graph):
    ref, _ = _batches(graph, "baseline")
    for preset in ("static", "ooc"):
        got, _ = _batches(graph, preset)
        for ea, eb in zip(ref, got, strict=True):
            assert len(ea) == len(eb)
            for a, b in zip(ea, eb, strict=True):
                for key in ("n_id", "edge_index", "x", "y"):
                    assert torch.equal(a[key], b[key]), (preset, key)


def test_set_epoch_and_len(graph):
    with ooc.NodeLoader(graph, num_neighbors=[3], batch_size=50, input_nodes="val",
                        shuffle=True, preset="static") as loader:
        assert len(loader) == -(-len(graph.val_idx) // 50)
        loader.set_epoch(3)
        a = [d.n_id for d in loader]
        assert loader.epoch == 4
        loader.set_epoch(3)
        b = [d.n_id for d in loader]
        assert len(a) == len(loader) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("preset", ["baseline", "ooc"])
def test_a_second_iterator_while_one_runs_is_refused(graph, preset):
    """Two interleaved ``iter()`` on one loader once failed deep in the Belady changesets
    ("changeset inserts 140 ids but the cache has room for 33"); the second is refused
    naming what to do, the first runs on unharmed, and a finished or closed iterator lets
    the next one run."""
    ref, _ = _batches(graph, preset)
    with ooc.NodeLoader(graph, num_neighbors=[4, 3], batch_size=64, input_nodes="train",
                        shuffle=True, preset=preset, seed=7, superbatch_size=3) as loader:
        first = iter(loader)
        got = [next(first)]
        for second in (lambda: iter(loader), lambda: loader.batches(5)):
            with pytest.raises(OocError, match=r"^this NodeLoader is already being iterated "
                                               r"\(epoch 1\); finish or close the first "
                                               r"iterator, or make a second NodeLoader$"):
                next(second())
        got += list(first)
        assert loader.epoch == 2  # the refused iter() did not move the epoch on
        again = iter(loader)
        next(again)
        again.close()
        loader.set_epoch(2)
        epoch2 = list(loader)
    for mine, theirs in zip((got, epoch2), ref, strict=True):
        assert len(mine) == len(theirs)
        assert all(torch.equal(a.n_id, b.n_id) for a, b in zip(mine, theirs, strict=True))


def test_input_nodes_kinds(graph):
    ids = np.array([5, 3, 9, 1])
    mask = np.zeros(graph.num_nodes, bool)
    mask[ids] = True
    for nodes, want in [(ids, ids), (torch.from_numpy(ids), ids), (mask, np.sort(ids)),
                        (None, np.arange(graph.num_nodes))]:
        with ooc.NodeLoader(graph, num_neighbors=[2], batch_size=1000, input_nodes=nodes,
                            preset="baseline") as loader:
            (d,) = list(loader)
            np.testing.assert_array_equal(d.n_id[:d.batch_size].numpy(), want)
    for bad, msg in [("training", "expected one of train"), (np.array([0, graph.num_nodes]),
                     "out of range"), (np.array([[1, 2]]), "1-D"), (np.array([0.5]), "integer")]:
        with pytest.raises(OocError, match=msg):
            ooc.NodeLoader(graph, input_nodes=bad, preset="baseline")
    with pytest.raises(OocError, match="preset"):
        ooc.NodeLoader(graph, preset="fast")
    with pytest.raises(OocError, match="num_neighbors"):
        ooc.NodeLoader(graph, num_neighbors=[0])


def test_runtime_files_cleaned_on_close_and_gc(graph):
    rt = graph.path / "runtime"

    def runs():
        return sorted(rt.glob("run*")) if rt.exists() else []

    before = runs()
    loader = ooc.NodeLoader(graph, num_neighbors=[3, 3], batch_size=32, input_nodes="train",
                            preset="ooc", superbatch_size=2)
    next(iter(loader))  # an epoch left half-way
    assert len(runs()) == len(before) + 1
    loader.close()
    assert runs() == before and loader.closed
    with pytest.raises(OocError, match="closed"):
        iter(loader)
    loader = ooc.NodeLoader(graph, num_neighbors=[3, 3], batch_size=32, input_nodes="train",
                            preset="ooc", superbatch_size=2)
    for _ in loader:
        pass
    del loader
    gc.collect()
    assert runs() == before


def test_stock_graphsage_on_cora_in_every_preset(cora):
    """A hand-written loop with torch_geometric.nn.GraphSAGE over the loader: test accuracy
    >= 0.78 on Cora in every preset (the presets give the same batches, so the same model)."""
    from torch_geometric.nn import GraphSAGE

    accs = {}
    for preset in PRESETS:
        torch.manual_seed(0)
        model = GraphSAGE(cora.feature_dim, 128, num_layers=2, out_channels=cora.num_classes,
                          dropout=0.5)
        opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
        kw = dict(num_neighbors=[10, 10], preset=preset, seed=0)
        with ooc.NodeLoader(cora, batch_size=128, input_nodes="train", shuffle=True, **kw) as tr, \
                ooc.NodeLoader(cora, batch_size=1024, input_nodes="test", **kw) as te:
            for _ in range(20):
                model.train()
                for data in tr:
                    opt.zero_grad()
                    out = model(data.x, data.edge_index,
                                num_sampled_nodes_per_hop=data.num_sampled_nodes,
                                num_sampled_edges_per_hop=data.num_sampled_edges)
                    F.cross_entropy(out[:data.batch_size], data.y[:data.batch_size]).backward()
                    opt.step()
            model.eval()
            correct = total = 0
            te.set_epoch(1)
            with torch.no_grad():
                for data in te:
                    pred = model(data.x, data.edge_index)[:data.batch_size].argmax(-1)
                    correct += int((pred == data.y[:data.batch_size]).sum())
                    total += data.batch_size
        accs[preset] = correct / total
    assert all(a >= 0.78 for a in accs.values()), accs


def test_arguments_in_pygs_order(graph):
    """``NodeLoader(data, num_neighbors, input_nodes)`` as PyG's NeighborLoader; the rest
    are keywords (a batch size given third is not taken for input nodes)."""
    import inspect

    params = list(inspect.signature(ooc.NodeLoader).parameters.values())
    assert [p.name for p in params[:3]] == ["dataset", "num_neighbors", "input_nodes"]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[3:])
    with ooc.NodeLoader(graph, [3], "train", batch_size=16, preset="baseline") as loader:
        first = next(iter(loader))
    assert first.batch_size == 16
    with pytest.raises(TypeError):
        ooc.NodeLoader(graph, [3], "train", 16)


def test_input_id_is_each_seeds_position_in_input_nodes(graph):
    """``data.input_id`` as PyG gives it: input_nodes[input_id] are the batch's seeds."""
    nodes = np.random.default_rng(1).permutation(np.asarray(graph.train_idx))[:70]
    with ooc.NodeLoader(graph, [3], nodes, batch_size=16, shuffle=True,
                        preset="baseline") as loader:
        seen = []
        for data in loader:
            np.testing.assert_array_equal(nodes[data.input_id.numpy()],
                                          data.n_id[:data.batch_size].numpy())
            seen.append(data.input_id.numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(70))


@pytest.mark.parametrize("bad,needle", [("10,10", "a list with one int per layer"),
                                        ({("a", "to", "b"): [5]}, "heterogeneous"),
                                        ([10.5], "one value per layer"), (["x"], "one value"),
                                        (5, "a list"), ([0], "one value per layer")])
def test_num_neighbors_in_pygs_forms_only(graph, bad, needle):
    with pytest.raises(OocError, match=needle):
        ooc.NodeLoader(graph, bad, "train", preset="baseline")


def test_trainer_batches_are_the_loaders(graph):
    """The trainer runs the loader users run: its epoch's Data equal NodeLoader's with the
    same settings, with the seeds' labels only (labels="seeds")."""
    from ooc.executor.training.config import TrainConfig
    from ooc.executor.training.trainer import Trainer

    cfg = TrainConfig(fanouts=[4, 3], batch_size=64, seed=7, mode="static", device="cpu",
                      progress=False)
    with Trainer(graph, cfg, log=lambda m: None) as t:
        mine = list(t.train_loader.batches(2))
    with ooc.NodeLoader(graph, [4, 3], "train", batch_size=64, shuffle=True, preset="static",
                        seed=7, labels="seeds") as loader:
        loader.set_epoch(2)
        theirs = list(loader)
    assert len(mine) == len(theirs) == -(-len(graph.train_idx) // 64)
    labels = np.asarray(graph.labels)
    for a, b in zip(mine, theirs, strict=True):
        for key in ("x", "edge_index", "n_id", "y", "input_id"):
            assert torch.equal(a[key], b[key]), key
        seeds = a.n_id[:a.batch_size].numpy()
        np.testing.assert_array_equal(a.y.numpy(), labels[seeds])   # seeds' labels only
        np.testing.assert_array_equal(np.asarray(graph.train_idx)[a.input_id.numpy()], seeds)


def test_labels_argument(graph):
    with ooc.NodeLoader(graph, [3], "val", batch_size=32, labels=False) as loader:
        assert all("y" not in d for d in loader)
    with pytest.raises(OocError, match="labels 'some'"):
        ooc.NodeLoader(graph, [3], "val", labels="some")


def test_batches_take_the_models_sparse_path(graph):
    """Every batch's targets are sorted hop after hop, so the built-in SAGE aggregates each
    layer with one CSR spmm (``target_csr`` is not None for any layer's edges)."""
    from ooc.executor.training.models import target_csr

    with ooc.NodeLoader(graph, [5, 4, 3], "train", batch_size=64, preset="static") as loader:
        for d in loader:
            nodes, edges = d.num_sampled_nodes, d.num_sampled_edges
            for keep in range(2, len(nodes) + 1):   # what layer L - keep + 1 reads
                m = sum(edges[:keep - 1])
                assert target_csr(d.edge_index[:, :m], sum(nodes[:keep]),
                                  sum(nodes[:keep - 1]), torch.float32) is not None


@pytest.mark.parametrize("preset", PRESETS)
def test_a_nan_feature_row_is_refused_naming_the_node_and_file(tmp_path, preset):
    """A NaN in a feature page the sampled checksum does not read: the batch holding
    that node is refused (one line naming the file and the node), in every preset."""
    from conftest import nan_in_an_unsampled_row

    path, node = nan_in_an_unsampled_row(tmp_path / "g")
    ds = ooc.open_dataset(path)  # the cheap checks cannot see it
    with ooc.NodeLoader(ds, num_neighbors=[2], batch_size=32, input_nodes=np.arange(300),
                        preset=preset) as loader:
        with pytest.raises(ooc.DatasetError) as ei:
            for _ in loader:
                pass
    msg = str(ei.value)
    assert "\n" not in msg and isinstance(ei.value, ValueError)
    assert msg.startswith(f"{path}/features.bin: the feature row of node ") and \
        "holds NaN or infinite values" in msg
    bad = int(msg.split("node ")[1].split(" ")[0])
    assert np.isnan(ds.features.read(np.array([bad]))).any() and bad == node
