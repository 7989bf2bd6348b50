"""Models: the forward/layer protocol, sampled batches (trim_to_layer), training."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from ooc.core.errors import OocError
from ooc.executor.training.models import GNN, build_model

KINDS = ("sage", "gcn", "gat")


def _graph(n=40, m=160, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    ei = torch.randint(0, n, (2, m), generator=g)
    return x, ei


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_forward_equals_layer_by_layer(kind, layers):
    torch.manual_seed(0)
    model = build_model(kind, 12, 16, 5, layers, dropout=0.3, heads=2)
    model.eval()
    x, ei = _graph()
    out = model(x, ei)
    h = x
    for l in range(layers):
        h = model.layer(l, h, ei)
    assert out.shape == (40, 5)
    assert torch.equal(out, h)


@pytest.mark.parametrize("kind", KINDS)
def test_protocol_attributes(kind):
    model = build_model(kind, 8, 16, 3, 2, dropout=0.1, heads=4)
    assert isinstance(model, GNN)
    assert model.kind == kind and model.num_layers == 2 and len(model.convs) == 2
    assert model.config == dict(kind=kind, in_dim=8, hidden=16, out_dim=3, num_layers=2,
                                dropout=0.1, heads=4)
    again = build_model(**model.config)
    again.load_state_dict(model.state_dict())


def test_gcn_explicit_weights_equal_default_normalisation():
    torch.manual_seed(0)
    model = build_model("gcn", 12, 16, 5, 2).eval()
    x, ei = _graph()
    ei2, w = gcn_norm(ei, None, num_nodes=x.size(0), add_self_loops=True)
    for l, _d_in in ((0, 12), (1, 16)):
        xi = x if l == 0 else torch.randn(40, 16)
        assert torch.allclose(model.layer(l, xi, ei), model.layer(l, xi, ei2, w))
    # weights are used as given: doubling them doubles the linear part
    a = model.layer(1, torch.randn(40, 16), ei2, w * 0)
    assert torch.allclose(a, model.convs[1].bias.expand_as(a))


def _sampled_batch():
    """A hand-made 2-hop batch in NeighborLoader layout: 2 seeds, hop1 3 nodes, hop2 4."""
    # nodes 0,1 seeds; 2,3,4 hop 1; 5,6,7,8 hop 2
    hop0 = [(2, 0), (3, 0), (4, 1), (1, 0)]          # edges into seeds
    hop1 = [(5, 2), (6, 3), (7, 4), (8, 4), (0, 2)]  # edges into hop-1 nodes
    ei = torch.tensor(hop0 + hop1).t().contiguous()
    return ei, [2, 3, 4], [len(hop0), len(hop1)]


@pytest.mark.parametrize("kind", KINDS)
def test_trimmed_forward_matches_untrimmed_on_seeds(kind):
    torch.manual_seed(1)
    model = build_model(kind, 6, 8, 3, 2).eval()
    ei, nodes, edges = _sampled_batch()
    x = torch.randn(9, 6)
    full = model(x, ei)
    trimmed = model(x, ei, nodes, edges)
    assert trimmed.shape[0] == 2  # the seeds only
    assert torch.allclose(full[:2], trimmed[:2], atol=1e-6)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    model = build_model("sage", 12, 64, 5, 2, dropout=0.5)
    x, ei = _graph()
    model.train()
    a, b = model(x, ei), model(x, ei)
    assert not torch.equal(a, b)
    model.eval()
    assert torch.equal(model(x, ei), model(x, ei))


@pytest.mark.parametrize("bad", [dict(kind="mlp"), dict(num_layers=0), dict(hidden=0),
                                 dict(dropout=1.0)])
def test_bad_arguments(bad):
    args = dict(kind="sage", in_dim=4, hidden=8, out_dim=2, num_layers=2) | bad
    with pytest.raises(OocError):
        build_model(**args)


@pytest.mark.parametrize("kind", KINDS)
def test_trains_on_separable_graph(kind):
    """Two communities; features carry a weak signal, neighbours a strong one."""
    torch.manual_seed(0)
    n = 200
    y = torch.arange(n) % 2
    x = torch.randn(n, 8) * 1.0
    x[:, 0] += (y.float() * 2 - 1) * 0.5
    src = torch.randint(0, n, (4000,))
    dst = torch.randint(0, n, (4000,))
    keep = y[src] == y[dst]
    ei = torch.stack([src[keep], dst[keep]])
    model = build_model(kind, 8, 16, 2, 2, dropout=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, ei), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    acc = (model(x, ei).argmax(-1) == y).float().mean().item()
    assert losses[-1] < losses[0] * 0.5
    assert acc > 0.95


def test_target_csr_only_for_sorted_targets():
    """The CSR adjacency is the edge list's (row = target) when targets are sorted and in
    range; None otherwise, so the caller scatters."""
    from ooc.executor.training.models import target_csr

    ei = torch.tensor([[4, 0, 2, 4, 1], [0, 0, 1, 2, 2]])
    adj = target_csr(ei, 5, 3, torch.float32)
    assert adj is not None
    dense = torch.zeros(3, 5)
    dense[ei[1], ei[0]] += 1
    assert torch.equal(adj.to_dense(), dense)
    assert target_csr(ei[:, [1, 0, 3, 2, 4]].flip(1), 5, 3, torch.float32) is None  # unsorted
    assert target_csr(ei, 5, 2, torch.float32) is None                             # target 2
    assert target_csr(torch.zeros(2, 0, dtype=torch.long), 5, 3, torch.float32) is not None


@pytest.mark.parametrize("layers", [2, 3])
def test_sage_sparse_path_equals_the_scatter_path(monkeypatch, layers):
    """SAGE on a sampled batch through the CSR spmm gives the scatter path's outputs and
    gradients."""
    from ooc.executor.training import models as M
    from ooc.sampling.sampler import NeighborSampler
    from ooc.storage import csc_from_edges

    g = torch.Generator().manual_seed(3)
    n = 300
    src, dst = torch.randint(0, n, (2, 3000), generator=g).numpy()
    indptr, indices = csc_from_edges(src, dst, n)
    batch = NeighborSampler(indptr, indices, [5, 4, 3][:layers]).sample(
        torch.arange(0, 64).numpy(), 1)
    x = torch.randn(len(batch.node_ids), 12, generator=g)
    ei = torch.as_tensor(batch.edge_index)
    torch.manual_seed(0)
    model = build_model("sage", 12, 16, 5, layers, dropout=0.0)

    def step():
        model.zero_grad()
        out = model(x, ei, batch.num_sampled_nodes, batch.num_sampled_edges)[:64]
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    calls = []
    real = M.target_csr
    monkeypatch.setattr(M, "target_csr", lambda *a: calls.append(real(*a)) or calls[-1])
    fast, fast_grads = step()
    assert len(calls) == layers and all(c is not None for c in calls)  # the sparse path ran
    monkeypatch.setattr(M, "target_csr", lambda *a: None)
    slow, slow_grads = step()
    assert torch.allclose(fast, slow, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fast_grads, slow_grads, strict=True))


def test_with_self_loops_keeps_targets_sorted():
    from ooc.executor.training.models import with_self_loops

    ei = torch.tensor([[4, 0, 2, 4, 1], [0, 0, 2, 2, 3]])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    loop_w = torch.tensor([10.0, 11.0, 12.0, 13.0, 14.0])
    got_ei, got_w = with_self_loops(ei, 5, w, loop_w)
    # brute force: each target's edges in order, then its loop
    want = []
    for t in range(5):
        want += [(int(s), t, float(x)) for s, d, x in zip(ei[0], ei[1], w, strict=True) if int(d) == t]
        want.append((t, t, float(loop_w[t])))
    assert list(zip(got_ei[0].tolist(), got_ei[1].tolist(), got_w.tolist(), strict=True)) == want
    # unsorted targets: the loops are appended
    got_ei, got_w = with_self_loops(ei.flip(1), 5, w.flip(0), loop_w)
    assert torch.equal(got_ei[:, 5:], torch.arange(5).repeat(2, 1))
    assert torch.equal(got_w, torch.cat([w.flip(0), loop_w]))


def _sorted_batch(seed=0):
    """A 3-hop batch in NeighborLoader layout whose edges' targets are sorted (hop after
    hop, each node's neighbours together), as ooc's sampler makes them."""
    g = torch.Generator().manual_seed(seed)
    nodes = [4, 9, 20, 30]
    starts = [0, 4, 13, 33]
    src, dst, edges = [], [], []
    for h in range(3):
        m = 0
        for t in range(starts[h], starts[h] + nodes[h]):
            k = int(torch.randint(1, 4, (1,), generator=g))
            pool = torch.arange(0, starts[h + 1] + nodes[h + 1])
            pool = pool[pool != t]  # no self loops in the graph
            src += pool[torch.randperm(len(pool), generator=g)[:k]].tolist()
            dst += [t] * k
            m += k
        edges.append(m)
    return torch.tensor([src, dst]), nodes, edges


@pytest.mark.parametrize("kind", KINDS)
def test_sorted_batches_take_the_csr_path_with_the_same_outputs(kind, monkeypatch):
    """Sampled batches aggregate through CSR (SAGE and GCN; GAT needs every edge's
    attention) with the seeds' outputs of the untrimmed forward pass."""
    from ooc.executor.training import models as M

    torch.manual_seed(2)
    model = build_model(kind, 6, 8, 3, 3).eval()
    ei, nodes, edges = _sorted_batch()
    x = torch.randn(sum(nodes), 6)
    full = model(x, ei)[:4]
    real, used = M.target_csr, []

    def counting(*args, **kwargs):
        adj = real(*args, **kwargs)
        used.append(adj is not None)
        return adj

    monkeypatch.setattr(M, "target_csr", counting)
    trimmed = model(x, ei, nodes, edges)
    assert trimmed.shape == (4, 3)
    assert torch.allclose(full, trimmed, atol=1e-5)
    assert used == ([True] * 3 if kind != "gat" else [])
    monkeypatch.setattr(M, "target_csr", lambda *a, **k: None)  # the scatter path
    assert torch.allclose(model(x, ei, nodes, edges), trimmed, atol=1e-5)


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_seed_outputs_equal_stock_pyg_with_the_same_weights(kind):
    """The built-in model on a sampled batch (bipartite, CSR) gives the seeds the outputs
    of stock PyG's model of that kind with the same weights on the whole batch graph."""
    from torch_geometric.nn.models import GCN, GraphSAGE

    torch.manual_seed(3)
    model = build_model(kind, 6, 8, 3, 3, dropout=0.0).eval()
    cls = GraphSAGE if kind == "sage" else GCN
    stock = cls(6, 8, 3, 3, dropout=0.0).eval()
    assert stock.load_state_dict(model.state_dict(), strict=True) is not None
    ei, nodes, edges = _sorted_batch(seed=4)
    x = torch.randn(sum(nodes), 6)
    ours = model(x, ei, nodes, edges)
    assert torch.allclose(ours, stock(x, ei)[:4], atol=1e-5)


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_targets_gradient_added_in_place_equals_the_slices(kind, monkeypatch):
    """A bipartite layer's ``(x, x[:n])`` as one autograd node: the model's gradients
    (parameters and input rows) equal those through plain slicing."""
    from ooc.executor.training import models as M
    from ooc.sampling.sampler import NeighborSampler
    from ooc.storage import csc_from_edges

    g = torch.Generator().manual_seed(4)
    n = 300
    src, dst = torch.randint(0, n, (2, 3000), generator=g).numpy()
    indptr, indices = csc_from_edges(src, dst, n)
    batch = NeighborSampler(indptr, indices, [5, 4, 3]).sample(torch.arange(0, 48).numpy(), 1)
    x0 = torch.randn(len(batch.node_ids), 12, generator=g, dtype=torch.float64)
    ei = torch.as_tensor(batch.edge_index)
    torch.manual_seed(0)
    model = build_model(kind, 12, 16, 5, 3, dropout=0.0).double()

    def step():
        model.zero_grad()
        x = x0.clone().requires_grad_()
        out = model(x, ei, batch.num_sampled_nodes, batch.num_sampled_edges)[:48]
        out.square().sum().backward()
        return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    calls = []
    real = M.sources_and_targets
    monkeypatch.setattr(M, "sources_and_targets", lambda x, k: calls.append(k) or real(x, k))
    fused = step()
    assert len(calls) == 3
    monkeypatch.setattr(M, "sources_and_targets", lambda x, k: (x, x[:k]))
    sliced = step()
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(fused, sliced, strict=True))


@pytest.mark.parametrize("use", ["both", "sources", "targets"])
def test_sources_and_targets_gradient_when_one_side_is_unused(use):
    from ooc.executor.training.models import sources_and_targets

    w = torch.randn(10, 3, dtype=torch.float64)
    grads = []
    for fused in (True, False):
        x = w.clone().requires_grad_()
        h = x * 2.0
        s, t = sources_and_targets(h, 4) if fused else (h, h[:4])
        loss = (s.square().sum() if use != "targets" else 0) + \
            (t.exp().sum() if use != "sources" else 0)
        loss.backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])
    plain = torch.randn(6, 2)
    s, t = sources_and_targets(plain, 3)
    assert s is plain and torch.equal(t, plain[:3])


@pytest.mark.parametrize("graph", ["csr", "edge_index", "full"])
def test_sage_conv_with_the_fused_root_term_is_stock_sageconv(graph):
    """Outputs and gradients (weights, bias, input) of ``sage_conv`` equal SAGEConv's own
    forward on the same graph."""
    from torch_geometric.nn import SAGEConv

    from ooc.executor.training.models import sage_conv, target_csr

    g = torch.Generator().manual_seed(5)
    n_src, n_dst = 30, 30 if graph == "full" else 11
    dst = torch.sort(torch.randint(0, n_dst, (90,), generator=g))[0]
    ei = torch.stack([torch.randint(0, n_src, (90,), generator=g), dst])
    conv = SAGEConv(7, 5).double()
    results = []
    for fused in (True, False):
        conv.zero_grad()
        x = torch.randn(n_src, 7, generator=torch.Generator().manual_seed(6),
                        dtype=torch.float64).requires_grad_()
        if graph == "full":
            out = sage_conv(conv, (x, x), ei) if fused else conv(x, ei)
        else:
            adj = target_csr(ei, n_src, n_dst, x.dtype) if graph == "csr" else ei
            size = None if graph == "csr" else (n_src, n_dst)
            pair = (x, x[:n_dst])
            out = sage_conv(conv, pair, adj, size) if fused else conv(pair, adj, size=size)
        out.sin().sum().backward()
        results.append([out.detach(), x.grad] + [p.grad.clone() for p in conv.parameters()])
    assert len(results[0]) == 5
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize("n_dst,d_in,d_out", [(6, 4, 9), (40, 9, 3)])
def test_gcn_conv_in_either_order_is_stock_gcnconv(n_dst, d_in, d_out, monkeypatch):
    """Aggregating first (few targets, narrow inputs) or transforming first (stock
    order): outputs and gradients equal GCNConv's own forward on the same adjacency."""
    from torch_geometric.nn import GCNConv

    from ooc.executor.training import models as M

    g = torch.Generator().manual_seed(7)
    n_src, m = 40, 120
    dst = torch.sort(torch.randint(0, n_dst, (m,), generator=g))[0]
    ei = torch.stack([torch.randint(0, n_src, (m,), generator=g), dst])
    adj = M.target_csr(ei, n_src, n_dst, torch.float64,
                       torch.rand(m, generator=g, dtype=torch.float64))
    conv = GCNConv(d_in, d_out, normalize=False, add_self_loops=False).double()
    torch.nn.init.normal_(conv.bias)
    stock_calls = []
    real_forward = GCNConv.forward
    monkeypatch.setattr(GCNConv, "forward",
                        lambda self, *a, **k: stock_calls.append(1) or real_forward(self, *a, **k))
    results = []
    for fused in (True, False):
        conv.zero_grad()
        x = torch.randn(n_src, d_in, generator=torch.Generator().manual_seed(8),
                        dtype=torch.float64).requires_grad_()
        out = M.gcn_conv(conv, x, adj) if fused else conv(x, adj)
        out.sin().sum().backward()
        results.append([out.detach(), x.grad] + [p.grad.clone() for p in conv.parameters()])
    assert len(stock_calls) == (1 if n_dst == 6 else 2)  # the first case aggregated first
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(*results, strict=True))
