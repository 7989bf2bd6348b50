"""Layer-wise inference from disk equals a stock PyG model's full-graph forward in memory.

References are computed with plain PyG on the edge list as it was given (PyG's
``edge_index``, row 0 = source): ``model(x, edge_index)`` in eval mode, and the
hidden layers' outputs caught where ``BasicGNN.forward`` passes them through
its dropout module. ooc reads the same graph from its CSC dataset on disk
(Cora through ``ooc.storage.ingest.ingest_planetoid``). Nothing of ooc's
layer code is used by the reference.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import require_cora
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from ooc.executor.inference.layerwise import layerwise_inference, read_embeddings
from ooc.executor.training.models import build_model
from ooc.storage import OocError, csc_from_edges, open_dataset, write_dataset

#: largest difference allowed between ooc's layers and the reference, absolute for a layer
#: whose values stay within [-1, 1], else relative to the layer's largest magnitude
ATOL = 1e-4

STOCK = {"GraphSAGE": GraphSAGE, "GCN": GCN, "GAT": GAT}


def _stock(name: str, d_in: int, hidden: int, d_out: int, layers: int, seed: int, **kw):
    """A stock PyG model with random weights (fixed seed), in eval mode; dropout 0.5
    must be the identity there."""
    torch.manual_seed(seed)
    return STOCK[name](d_in, hidden, layers, out_channels=d_out, dropout=0.5, **kw).eval()


def _stock_reference(model, x: np.ndarray, edge_index: np.ndarray) -> list[np.ndarray]:
    """Every layer's output of the full-graph forward: hidden layers as they leave
    ``model.dropout`` (after norm and activation), then ``model(x, edge_index)``."""
    hidden: list[np.ndarray] = []
    hook = model.dropout.register_forward_hook(lambda m, i, o: hidden.append(o.numpy().copy()))
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(x), torch.from_numpy(edge_index)).numpy()
    finally:
        hook.remove()
    assert len(hidden) == model.num_layers - 1
    return hidden + [out]


def _ooc_reference(model, x: np.ndarray, edge_index: np.ndarray) -> list[np.ndarray]:
    """ooc's built-in model: ``layer(0) .. layer(L-1)`` on the full graph, the last
    checked equal to its ``forward``."""
    model.eval()
    outs = []
    with torch.no_grad():
        h = torch.from_numpy(x)
        ei = torch.from_numpy(edge_index)
        for l in range(model.num_layers):
            h = model.layer(l, h, ei)
            outs.append(h.numpy().copy())
        full = model(torch.from_numpy(x), ei).numpy()
    np.testing.assert_allclose(full, outs[-1], atol=1e-6, rtol=0)
    return outs


def _compare(ds, model, ref: list[np.ndarray], out, **kw) -> tuple[dict, float]:
    """Run ooc from disk; returns its report and the largest difference over all layers
    (scaled down by the layer's largest magnitude where that exceeds 1)."""
    rep = layerwise_inference(ds, model, out, memory_budget="3GiB", keep_layers=True, **kw)
    worst = 0.0
    for l, r in enumerate(ref):
        h = read_embeddings(out, f"h{l + 1}")
        assert h.shape == r.shape, (l, h.shape, r.shape)
        worst = max(worst, float(np.abs(h - r).max()) / max(1.0, float(np.abs(r).max())))
    assert worst < ATOL, worst
    np.testing.assert_array_equal(read_embeddings(out, "pred"), ref[-1].argmax(1))
    return rep, worst


# ----------------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A directed 1,500-node graph (no reverse edges added) with skewed in- and
    out-degrees, self loops, duplicate edges and isolated nodes; the edge list as
    PyG gets it, and the ooc dataset written from its CSC."""
    rng = np.random.default_rng(11)
    n, e, d = 1500, 9000, 20
    src = (rng.pareto(1.2, e) * 40).astype(np.int64) % (n - 20)
    dst = (rng.pareto(2.0, e) * 300).astype(np.int64) % (n - 20)  # nodes n-20.. have no edges
    src[:50] = dst[:50]                                            # self loops
    src[50:120], dst[50:120] = src[200:270], dst[200:270]          # duplicates
    x = rng.standard_normal((n, d)).astype(np.float32)
    indptr, indices = csc_from_edges(src, dst, n)
    path = write_dataset(tmp_path_factory.mktemp("pyg") / "synth", indptr, indices, x,
                         labels=rng.integers(0, 4, n), num_classes=4,
                         train_idx=np.arange(0, 500), val_idx=np.arange(500, 1000),
                         test_idx=np.arange(1000, n))
    return open_dataset(path), x, np.stack([src, dst])


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    """Cora: PyG's own reading of the raw files (x, edge_index) and ooc's ingest of them."""
    from torch_geometric.io.planetoid import read_planetoid_data

    from ooc.storage.ingest import ingest_planetoid

    raw = require_cora()
    data = read_planetoid_data(str(raw), "cora")
    path = ingest_planetoid(raw.parent.parent, "Cora", tmp_path_factory.mktemp("pyg") / "cora",
                            progress=False)
    return open_dataset(path), data.x.numpy(), data.edge_index.numpy()


# ----------------------------------------------------------------------------- stock models
@pytest.mark.parametrize("name", ["GraphSAGE", "GCN", "GAT"])
def test_stock_model_on_cora(cora, tmp_path, name):
    ds, x, ei = cora
    model = _stock(name, x.shape[1], 32, 7, 2, seed=0)
    ref = _stock_reference(model, x, ei)
    rep, worst = _compare(ds, model, ref, tmp_path / "o.zarr", chunk_rows=512, block_rows=100,
                          cache_chunks=2, aggregate="blocks")
    assert rep["model"] == name and rep["num_chunks"] == 6
    assert rep["layers"][1]["cache"]["misses"] > 0


@pytest.mark.parametrize("name", ["GraphSAGE", "GCN", "GAT"])
@pytest.mark.parametrize("order", ["natural", "degree"])
def test_stock_model_on_synthetic(synth, tmp_path, name, order):
    ds, x, ei = synth
    model = _stock(name, x.shape[1], 24, 5, 3, seed=1)
    ref = _stock_reference(model, x, ei)
    rep, _ = _compare(ds, model, ref, tmp_path / "o.zarr", chunk_rows=128, block_rows=40,
                      cache_chunks=3, order=order)
    assert rep["order"] == order and len(rep["layers"]) == 3


@pytest.mark.parametrize("kw", [
    dict(norm="batch", act_first=True),          # BatchNorm with running statistics
    dict(norm="batch", act="tanh"),
    dict(norm="layer", norm_kwargs={"mode": "node"}),
], ids=["batch-act-first", "batch-tanh", "layer-node"])
def test_stock_norms_and_activations(synth, tmp_path, kw):
    ds, x, ei = synth
    model = _stock("GraphSAGE", x.shape[1], 24, 5, 3, seed=2, **kw)
    g = torch.Generator().manual_seed(3)
    for norm in model.norms:  # running statistics that change the outputs
        bn = getattr(norm, "module", None)
        if isinstance(bn, torch.nn.BatchNorm1d):
            bn.running_mean.copy_(torch.randn(bn.num_features, generator=g))
            bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
    ref = _stock_reference(model, x, ei)
    _compare(ds, model, ref, tmp_path / "o.zarr", chunk_rows=256, block_rows=64, cache_chunks=2)


def test_stock_gcn_without_normalisation_and_gin(synth, tmp_path):
    """GCNConv(normalize=False) sums over in-edges as they are (self loops kept);
    GIN's sum and MLP act on each node."""
    ds, x, ei = synth
    torch.manual_seed(4)
    for i, model in enumerate([GCN(x.shape[1], 16, 2, out_channels=5, normalize=False),
                               GIN(x.shape[1], 16, 2, out_channels=5)]):
        model.eval()
        _compare(ds, model, _stock_reference(model, x, ei), tmp_path / f"o{i}.zarr",
                 chunk_rows=256, block_rows=64, cache_chunks=2)


@pytest.mark.parametrize("make,msg", [
    (lambda d: GraphSAGE(d, 16, 2, out_channels=4, jk="cat"), "jumping knowledge"),
    (lambda d: GraphSAGE(d, 16, 2, out_channels=4, jk="last"), "jumping knowledge"),
    (lambda d: GraphSAGE(d, 16, 2, out_channels=4, norm="layer"), "mode='graph'"),
    (lambda d: GraphSAGE(d, 16, 2, out_channels=4, norm="instance"), "InstanceNorm"),
    (lambda d: GraphSAGE(d, 16, 2, out_channels=4, norm="batch",
                         norm_kwargs={"track_running_stats": False}), "running statistics"),
    (lambda d: GCN(d, 16, 2, out_channels=4, improved=True), "improved=True"),
    (lambda d: GCN(d, 16, 2, out_channels=4, add_self_loops=False), "add_self_loops=False"),
    (lambda d: torch.nn.Linear(d, 4), "layer-wise protocol"),
], ids=["jk-cat", "jk-last", "layernorm-graph", "instancenorm", "batchnorm-no-stats",
        "gcn-improved", "gcn-no-loops", "not-a-gnn"])
def test_refuses_what_it_cannot_run_layer_by_layer(synth, tmp_path, make, msg):
    ds, x, _ = synth
    out = tmp_path / "o.zarr"
    with pytest.raises(OocError, match=msg) as e:
        layerwise_inference(ds, make(x.shape[1]), out)
    assert "\n" not in str(e.value)
    assert not out.exists() and not (tmp_path / ".o.zarr.partial").exists()


# ----------------------------------------------------------------------------- ooc's models
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_builtin_model_on_cora_from_ingest(cora, tmp_path, kind):
    """ooc's own GNN against its own full-graph forward on PyG's edge_index, the
    dataset made by the Planetoid ingest."""
    ds, x, ei = cora
    torch.manual_seed(5)
    model = build_model(kind, x.shape[1], 16, 7, num_layers=2)
    _compare(ds, model, _ooc_reference(model, x, ei), tmp_path / "o.zarr", chunk_rows=512,
             block_rows=128, cache_chunks=2)
