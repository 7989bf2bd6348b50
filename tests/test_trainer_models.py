"""Trainer with a user's model, optimizer and loss (stock PyG models included)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import community_graph
from torch_geometric.nn import GCN, GraphSAGE

import ooc
from ooc.executor import TrainConfig, Trainer
from ooc.storage import OocError


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return ooc.open_dataset(community_graph(tmp_path_factory.mktemp("tm") / "g", n=500))


def _cfg(**kw):
    base = dict(fanouts=[5, 5], batch_size=64, epochs=2, mode="ooc", progress=False, seed=1)
    base.update(kw)
    return TrainConfig(**base)


class Spy(torch.nn.Module):
    """A GraphSAGE that records how the trainer calls it."""

    def __init__(self, ds):
        super().__init__()
        self.inner = GraphSAGE(ds.feature_dim, 16, num_layers=2, out_channels=ds.num_classes)
        self.calls = []

    def forward(self, x, edge_index, num_sampled_nodes_per_hop=None,
                num_sampled_edges_per_hop=None):
        self.calls.append((num_sampled_nodes_per_hop, num_sampled_edges_per_hop))
        return self.inner(x, edge_index, num_sampled_nodes_per_hop=num_sampled_nodes_per_hop,
                          num_sampled_edges_per_hop=num_sampled_edges_per_hop)


def test_stock_models_get_per_hop_counts_by_keyword(ds):
    torch.manual_seed(0)  # the model's initial weights, whatever ran before
    spy = Spy(ds)
    with Trainer(ds, _cfg(epochs=6, lr=0.02), model=spy) as t:
        t.fit()
        assert t.evaluate(ds.val_idx) > 0.6  # 3 classes: chance is 1/3
        rep = t.report()
    assert spy.calls and all(n is not None and e is not None and len(n) == 3 and len(e) == 2
                             for n, e in spy.calls)
    assert rep["model"]["user_model"].endswith("Spy")
    # stock GCN trains too (positional counts used to land in its edge_weight and crash)
    gcn = GCN(ds.feature_dim, 16, num_layers=2, out_channels=ds.num_classes)
    with Trainer(ds, _cfg(), model=gcn) as t:
        rec = t.train_epoch()
    assert rec["loss"] == rec["loss"]  # finite


def test_user_optimizer_and_loss(ds):
    seen = []

    def loss(out, y):
        seen.append(out.shape[0])
        return F.cross_entropy(out, y)

    model = GraphSAGE(ds.feature_dim, 16, num_layers=2, out_channels=ds.num_classes)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Trainer(ds, _cfg(epochs=1), model=model, optimizer=opt, loss=loss) as t:
        t.fit()
    n_batches = -(-len(ds.train_idx) // 64)
    assert len(seen) == n_batches and sum(seen) == len(ds.train_idx)
    assert t.optimizer is opt
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def _fresh(ds):
    torch.manual_seed(5)
    return GraphSAGE(ds.feature_dim, 16, num_layers=2, out_channels=ds.num_classes)


def test_user_model_checkpoint_resumes_exactly(ds, tmp_path):
    with Trainer(ds, _cfg(epochs=4), model=_fresh(ds)) as straight:
        straight.fit()
    with Trainer(ds, _cfg(epochs=2), model=_fresh(ds)) as first:
        first.fit(checkpoint_dir=tmp_path / "ck")
    path = sorted((tmp_path / "ck").glob("*.pt"))[-1]
    with Trainer(ds, _cfg(epochs=4), model=_fresh(ds)) as second:
        second.resume(path)
        assert second.epoch == 2
        second.fit()
    assert [r["loss"] for r in second.history] == [r["loss"] for r in straight.history]
    for a, b in zip(second.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # another model is refused in one line; load_model says how to load a user model
    other = GCN(ds.feature_dim, 16, num_layers=2, out_channels=ds.num_classes)
    with Trainer(ds, _cfg(epochs=4), model=other) as t:
        with pytest.raises(OocError, match="different model") as e:
            t.resume(path)
        assert "\n" not in str(e.value)
    with pytest.raises(OocError, match="user model .*GraphSAGE"):
        ooc.load_model(path)


def test_not_a_module(ds):
    with pytest.raises(OocError, match="torch.nn.Module"):
        Trainer(ds, _cfg(), model="sage")
