"""ooc.pyg: PyG's own loaders over an ooc dataset (remote backend)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import community_graph, require_cora
from torch_geometric.loader import NeighborLoader, NodeLoader
from torch_geometric.sampler import NodeSamplerInput

import ooc
import ooc.pyg
from ooc.storage import OocError

KW = dict(num_neighbors=[4, 3], input_nodes="train", batch_size=48, shuffle=True, seed=3)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return ooc.open_dataset(community_graph(tmp_path_factory.mktemp("pyg") / "g", n=500))


def _mapped_from(addr: int, name: str) -> bool:
    """Whether ``addr`` lies in a file mapping of a file called ``name`` (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            if lo <= addr < hi and len(parts) >= 6 and parts[5].endswith("/" + name):
                return True
    return False


def _reference(ds, epochs=2):
    with ooc.NodeLoader(ds, preset="baseline", **KW) as loader:
        return [list(loader) for _ in range(epochs)]


def _same(a, b):
    """One PyG batch against one ooc.NodeLoader batch: ids, edges, features, seed labels."""
    assert a.batch_size == b.batch_size
    for key in ("n_id", "edge_index", "x"):
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(a.y, b.y)                   # every node's labels from both
    assert list(a.num_sampled_nodes) == list(b.num_sampled_nodes)
    assert list(a.num_sampled_edges) == list(b.num_sampled_edges)


@pytest.mark.parametrize("preset,plan_ahead", [("ooc", True), ("static", True),
                                               ("ooc", False)])
def test_pyg_node_loader_equals_ooc_loader(graph, preset, plan_ahead):
    ref = _reference(graph)
    fs, gs, sampler = ooc.pyg.remote_backend(graph, preset=preset, plan_ahead=plan_ahead,
                                             superbatch_size=3, **KW)
    try:
        loader = NodeLoader((fs, gs), node_sampler=sampler, **sampler.loader_kwargs())
        for epoch in ref:
            got = list(loader)
            assert len(got) == len(epoch)
            for a, b in zip(got, epoch, strict=True):
                _same(a, b)
        st = sampler.stats()
        if plan_ahead:  # every batch came from the pipeline (under ooc: the Belady cache)
            assert st["planned_batches"] == st["planned_reads"] == 2 * len(ref[0])
            assert st["on_demand_batches"] == 0
            assert st["pipeline"]["io"]["feature_lookups"] > 0
            assert not sampler._b._planned_x  # each batch's rows were taken by its request
        else:
            assert st["planned_batches"] == 0 and st["on_demand_batches"] == 2 * len(ref[0])
    finally:
        sampler.close()


def test_unforeseen_requests_are_still_correct(graph):
    """Batches PyG's loader orders itself (its own batch_size/shuffle) and a request outside
    any plan are sampled on demand: valid in-edges and the right feature rows."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    feats = graph.features.read(np.arange(graph.num_nodes))
    fs, gs, sampler = ooc.pyg.remote_backend(graph, preset="ooc", **KW)
    try:
        loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=sampler.input_nodes,
                            batch_size=40, shuffle=True)
        n = 0
        for d in loader:
            n_id = d.n_id.numpy()
            np.testing.assert_array_equal(d.x.numpy(), feats[n_id])
            np.testing.assert_array_equal(d.y.numpy(), np.asarray(graph.labels)[n_id])
            for s, t in zip(n_id[d.edge_index[0].numpy()], n_id[d.edge_index[1].numpy()], strict=True):
                assert s in indices[indptr[t]:indptr[t + 1]]
            n += d.batch_size
        assert n == len(graph.train_idx)
        assert sampler.stats()["planned_batches"] == 0
        # the same request twice gives the same sample (deterministic per seed)
        inp = NodeSamplerInput(input_id=None, node=torch.tensor([3, 1, 4]))
        a, b = sampler.sample_from_nodes(inp), sampler.sample_from_nodes(inp)
        assert torch.equal(a.node, b.node) and torch.equal(a.row, b.row)
        assert a.node[:3].tolist() == [3, 1, 4] and a.metadata[0] is None
    finally:
        sampler.close()


def test_neighbor_loader_and_workers(graph):
    """PyG's NeighborLoader with the ooc sampler, in two spawned worker processes: the
    stores pickle, reopen the dataset there, and give the same batches."""
    ref = _reference(graph, epochs=1)[0]
    fs, gs, sampler = ooc.pyg.remote_backend(graph, preset="ooc", **KW)
    try:
        loader = NeighborLoader((fs, gs), num_neighbors=KW["num_neighbors"],
                                neighbor_sampler=sampler, **sampler.loader_kwargs(num_workers=2))
        got = list(loader)
        assert len(got) == len(ref)
        for a, b in zip(got, ref, strict=True):
            _same(a, b)
    finally:
        sampler.close()


def test_neighbor_loaders_num_neighbors_must_be_the_samplers(graph):
    """PyG's NeighborLoader drops its num_neighbors when given a sampler: [15, 15] once
    sampled silently with the backend's fanouts. A mismatch is one line naming both; the
    same list (any sequence type) loads."""
    fs, gs, sampler = ooc.pyg.remote_backend(graph, preset="baseline", plan_ahead=False, **KW)
    try:
        with pytest.raises(OocError, match=r"^ooc.pyg: NeighborLoader's num_neighbors \[15, 15\] "
                                           r"differs from the ooc sampler's \[4, 3\]"):
            NeighborLoader((fs, gs), num_neighbors=[15, 15], neighbor_sampler=sampler,
                           **sampler.loader_kwargs())
        with pytest.raises(ValueError, match=r"num_neighbors \[4\] differs"):
            NeighborLoader((fs, gs), [4], neighbor_sampler=sampler, **sampler.loader_kwargs())
        loader = NeighborLoader((fs, gs), num_neighbors=(4, 3), neighbor_sampler=sampler,
                                **sampler.loader_kwargs())
        batch = next(iter(loader))
        assert len(batch.num_sampled_nodes) == 3 and batch.batch_size == KW["batch_size"]
    finally:
        sampler.close()


def test_stores(graph):
    fs, gs, sampler = ooc.pyg.remote_backend(graph, preset="static", **KW)
    try:
        n, d = graph.num_nodes, graph.feature_dim
        attrs = fs.get_all_tensor_attrs()
        assert [(a.group_name, a.attr_name) for a in attrs] == [(None, "x"), (None, "y")]
        assert fs.get_tensor_size(group_name=None, attr_name="x") == (n, d)
        ids = torch.tensor([7, 0, 7, n - 1])
        x, y = fs.multi_get_tensor([dict(group_name=None, attr_name="x", index=ids),
                                    dict(group_name=None, attr_name="y", index=ids)])
        np.testing.assert_array_equal(x.numpy(), graph.features.read(ids.numpy()))
        np.testing.assert_array_equal(y.numpy(), np.asarray(graph.labels)[ids.numpy()])
        (attr,) = gs.get_all_edge_attrs()
        assert attr.layout.value == "csc" and attr.size == (n, n) and attr.edge_type is None
        row, colptr = gs.get_edge_index(edge_type=None, layout="csc")
        np.testing.assert_array_equal(colptr.numpy(), np.asarray(graph.indptr))
        np.testing.assert_array_equal(row.numpy(), np.asarray(graph.indices)[:graph.num_edges])
        # handed out over a memory map of indices.bin, not copied into anonymous memory
        assert _mapped_from(row.data_ptr(), "indices.bin")
        # read-only, one line naming the dataset
        for call in (lambda: fs.put_tensor(torch.zeros(n), group_name=None, attr_name="z",
                                           index=None),
                     lambda: fs.remove_tensor(group_name=None, attr_name="x", index=None),
                     lambda: gs.put_edge_index((row, colptr), edge_type=None, layout="csc",
                                               size=(n, n)),
                     lambda: gs.remove_edge_index(edge_type=None, layout="csc")):
            with pytest.raises(OocError, match="read-only.*" + graph.path.name) as e:
                call()
            assert "\n" not in str(e.value)
        with pytest.raises(IndexError, match="out of range"):
            fs.get_tensor(group_name=None, attr_name="x", index=torch.tensor([n]))
        # pickles by its settings
        fs2 = pickle.loads(pickle.dumps(fs))
        assert torch.equal(fs2.get_tensor(group_name=None, attr_name="x", index=ids), x)
    finally:
        sampler.close()


def test_bad_arguments(graph):
    with pytest.raises(OocError, match="preset"):
        ooc.pyg.remote_backend(graph, preset="fast")
    with pytest.raises(OocError, match="num_neighbors"):
        ooc.pyg.remote_backend(graph, num_neighbors=[0])
    with pytest.raises(OocError, match="out of range"):
        ooc.pyg.remote_backend(graph, input_nodes=np.array([graph.num_nodes]))


def test_stock_graphsage_through_pyg_loader_on_cora(tmp_path):
    from torch_geometric.nn import GraphSAGE

    from ooc.storage.ingest import ingest_planetoid

    raw = require_cora()
    ingest_planetoid(raw.parent.parent, "Cora", tmp_path / "cora")
    ds = ooc.open_dataset(tmp_path / "cora")
    fs, gs, tr = ooc.pyg.remote_backend(ds, num_neighbors=[10, 10], input_nodes="train",
                                        batch_size=128, shuffle=True, preset="ooc")
    fs_te, gs_te, te = ooc.pyg.remote_backend(ds, num_neighbors=[10, 10], input_nodes="test",
                                              batch_size=1024, preset="ooc")
    try:
        train = NodeLoader((fs, gs), node_sampler=tr, **tr.loader_kwargs())
        test = NodeLoader((fs_te, gs_te), node_sampler=te, **te.loader_kwargs())
        torch.manual_seed(0)
        model = GraphSAGE(ds.feature_dim, 128, num_layers=2, out_channels=ds.num_classes,
                          dropout=0.5)
        opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
        for _ in range(20):
            model.train()
            for data in train:
                opt.zero_grad()
                out = model(data.x, data.edge_index)[:data.batch_size]
                F.cross_entropy(out, data.y[:data.batch_size]).backward()
                opt.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for data in test:
                pred = model(data.x, data.edge_index)[:data.batch_size].argmax(-1)
                correct += int((pred == data.y[:data.batch_size]).sum())
                total += data.batch_size
        assert correct / total >= 0.78, correct / total
    finally:
        tr.close()
        te.close()


@pytest.mark.parametrize("plan_ahead", [True, False])
def test_a_nan_feature_row_is_refused_naming_the_node_and_file(tmp_path, plan_ahead):
    """A NaN in a feature page the sampled checksum does not read reaches no PyG batch,
    planned or sampled on demand: one line naming the file and the node."""
    from conftest import nan_in_an_unsampled_row

    path, node = nan_in_an_unsampled_row(tmp_path / "g")
    ds = ooc.open_dataset(path)
    fs, gs, sampler = ooc.pyg.remote_backend(ds, num_neighbors=[2], input_nodes=np.arange(300),
                                             batch_size=32, plan_ahead=plan_ahead)
    try:
        loader = NodeLoader((fs, gs), node_sampler=sampler, **sampler.loader_kwargs())
        with pytest.raises(ooc.DatasetError) as ei:
            for _ in loader:
                pass
    finally:
        sampler.close()
    assert str(ei.value) == (f"{path}/features.bin: the feature row of node {node} holds NaN "
                             f"or infinite values (a corrupted page?); python -m ooc.prepare "
                             f"verify DATASET checks every row")
