"""A built-in model's training step on sampled batches: CSR spmm against scatter, and
against stock PyG's model of the same kind on the same batches.

    python -m bench sparse_step --data D [--model sage|gcn] [--fanouts 15,10,5]
        [--batch-size 1024] [--hidden 256] [--batches 8] [--rounds 3] [--dropout 0.5]

Takes ``--batches`` batches of ``ooc.NodeLoader`` (baseline preset: the batches are the
same in every preset) and times forward and backward (cross-entropy over the seeds) on
each, alternating (the order rotated each round), ``--rounds`` times, of:

- ``ooc csr``: the built-in model, aggregating through a CSR adjacency
  (``ooc.executor.training.models.target_csr``), what training runs;
- ``ooc scatter``: the same with the CSR path disabled (PyG's gather-scatter over an
  [E, d] message tensor);
- ``ooc stock act`` (with ``--dropout`` above 0): the built-in model with
  ``F.dropout(F.relu(h))`` in place of its fused
  :func:`~ooc.executor.training.activation.relu_dropout` (its noise drawn by
  ``bernoulli_``, one element at a time; two float copies of each hidden output kept for
  backward instead of a byte mask);
- ``pyg trim``: stock PyG's ``GraphSAGE`` / ``GCN`` (``torch_geometric.nn.models``) with
  the built-in model's weights, called as PyG's NeighborLoader examples call it:
  ``model(x, edge_index, num_sampled_nodes_per_hop=..., num_sampled_edges_per_hop=...)``
  (``trim_to_layer``, scatter);
- ``pyg adj_t``: the same stock model on the batch's whole adjacency as a CSR
  ``torch.sparse`` tensor (PyG's ``spmm`` path; PyG trims only ``torch_sparse``
  tensors, not installed here, so every layer computes every row).

The RNG is seeded per batch, so each variant draws the same noise every round; with
``--dropout`` the built-in activation's noise and ``F.dropout``'s are different draws, so
the outputs differ by their masks. Prints the medians, the ratios to ``ooc csr`` and the
largest seed-output difference of each variant from ``ooc csr`` (without dropout: stock
GCN normalises each trimmed layer by its own degrees, so ``pyg trim`` differs there by
design).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import ooc
from ooc.cli import main_wrapper
from ooc.executor.settings import parse_fanouts
from ooc.executor.training import models as M


def stock_model(kind: str, model: M.GNN):
    """Stock PyG's model of ``kind`` with ``model``'s weights (the same convolutions)."""
    from torch_geometric.nn.models import GCN, GraphSAGE

    cls = {"sage": GraphSAGE, "gcn": GCN}[kind]
    extra = {"normalize": True, "add_self_loops": True} if kind == "gcn" else {}
    stock = cls(model.dims[0], model.dims[1], model.num_layers, model.dims[-1],
                dropout=model.dropout, **extra)
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"stock {cls.__name__} does not take the weights: missing "
                           f"{missing}, unexpected {unexpected}")
    return stock


def variants(model: M.GNN, stock, batches: list) -> dict:
    """name -> (the module trained, ``step(i, batch)`` giving its outputs)."""
    real = M.target_csr
    adj_t = [real(b.edge_index, b.num_nodes, b.num_nodes, b.x.dtype) for b in batches]

    fused = M.relu_dropout

    def stock_act(h, p, training):
        return torch.nn.functional.dropout(torch.nn.functional.relu(h), p, training)

    def ooc_step(csr: bool, act=fused):
        def step(i, b):
            M.target_csr = real if csr else (lambda *args, **kwargs: None)
            M.relu_dropout = act
            try:
                return model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
            finally:
                M.target_csr, M.relu_dropout = real, fused
        return model, step

    stock_way = {"ooc stock act": ooc_step(True, stock_act)} if model.dropout > 0 else {}
    return {
        "ooc csr": ooc_step(True),
        **stock_way,
        "ooc scatter": ooc_step(False),
        "pyg trim": (stock, lambda i, b: stock(
            b.x, b.edge_index, num_sampled_nodes_per_hop=b.num_sampled_nodes,
            num_sampled_edges_per_hop=b.num_sampled_edges)),
        "pyg adj_t": (stock, lambda i, b: stock(b.x, adj_t[i])),
    }


def run(net, step, batches: list) -> tuple[float, list]:
    """Seconds of forward and backward over ``batches``, and the seeds' outputs."""
    total, outs = 0.0, []
    for i, b in enumerate(batches):
        net.zero_grad()
        torch.manual_seed(i)  # the same dropout noise in every variant
        t0 = time.perf_counter()
        out = step(i, b)[:b.batch_size]
        torch.nn.functional.cross_entropy(out, b.y[:b.batch_size]).backward()
        total += time.perf_counter() - t0
        outs.append(out.detach())
    return total, outs


@main_wrapper
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench sparse_step",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", choices=("sage", "gcn"), default="sage")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout of every model (0: none, so the outputs compare exactly)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    ds = ooc.open_dataset(a.data)
    fanouts = parse_fanouts(a.fanouts)
    batches = []
    with ooc.NodeLoader(ds, fanouts, "train", batch_size=a.batch_size, shuffle=True,
                        preset="baseline", num_workers=0) as loader:
        for d in loader:
            batches.append(d)
            if len(batches) == a.batches:
                break
    torch.manual_seed(0)
    model = M.build_model(a.model, ds.feature_dim, a.hidden, ds.num_classes, len(fanouts),
                          dropout=a.dropout)
    ways = variants(model, stock_model(a.model, model), batches)
    times: dict[str, list[float]] = {k: [] for k in ways}
    outs = {}
    names = list(ways)
    for r in range(a.rounds):  # the order rotated each round: the first after another runs
        for name in names[r % len(names):] + names[:r % len(names)]:  # slower
            net, step = ways[name]
            t, outs[name] = run(net, step, batches)
            times[name].append(t)
    nodes = statistics.mean(int(b.num_nodes) for b in batches)
    edges = statistics.mean(int(b.edge_index.size(1)) for b in batches)
    print(f"{a.model}: {len(batches)} batches of ~{nodes:,.0f} nodes, {edges:,.0f} edges; "
          f"hidden {a.hidden}; dropout {a.dropout}; {a.threads} threads; medians of {a.rounds}")
    ref = statistics.median(times["ooc csr"])
    for name in ways:
        t = statistics.median(times[name])
        diff = max(float((x - y).abs().max()) for x, y in zip(outs[name], outs["ooc csr"], strict=True))
        print(f"  {name:14} {t:7.3f} s  {t / ref:5.2f}x ooc csr  max |seed out diff| {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
