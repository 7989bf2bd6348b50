"""A built-in model's training step on sampled batches: CSR spmm against scatter.

    python tools/bench_sparse_step.py --data D [--model sage|gcn] [--fanouts 15,10,5]
        [--batch-size 1024] [--hidden 256] [--batches 8] [--rounds 3]

Takes ``--batches`` batches of ``ooc.NodeLoader`` (baseline preset: the batches are the
same in every preset) and times forward and backward of the model on each, with the CSR
adjacency path (``ooc.executor.training.models.target_csr``) and with it disabled (PyG's
gather-scatter over an [E, d] message tensor), alternating, ``--rounds`` times; prints the
medians, their ratio and the largest output and gradient differences.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ooc  # noqa: E402
from ooc.cli import main_wrapper  # noqa: E402
from ooc.executor.training import models as M  # noqa: E402


@main_wrapper
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", choices=("sage", "gcn"), default="sage")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    ds = ooc.open_dataset(a.data)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    batches = []
    with ooc.NodeLoader(ds, fanouts, "train", batch_size=a.batch_size, shuffle=True,
                        preset="baseline", num_workers=0) as loader:
        for d in loader:
            batches.append(d)
            if len(batches) == a.batches:
                break
    torch.manual_seed(0)
    model = M.build_model(a.model, ds.feature_dim, a.hidden, ds.num_classes, len(fanouts),
                          dropout=0.0)
    real = M.target_csr

    def run(sparse: bool):
        M.target_csr = real if sparse else (lambda *args: None)
        total, outs = 0.0, []
        for b in batches:
            model.zero_grad()
            t0 = time.perf_counter()
            out = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
            out = out[:b.batch_size]
            torch.nn.functional.cross_entropy(out, b.y[:b.batch_size]).backward()
            total += time.perf_counter() - t0
            outs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
        return total, outs

    times: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for _ in range(a.rounds):
        for sparse in (False, True):
            t, outs[sparse] = run(sparse)
            times[sparse].append(t)
    M.target_csr = real
    d_out = max(float((x[0] - y[0]).abs().max()) for x, y in zip(outs[True], outs[False]))
    d_grad = max(float((g - h).abs().max()) for x, y in zip(outs[True], outs[False])
                 for g, h in zip(x[1], y[1]))
    nodes = statistics.mean(int(b.num_nodes) for b in batches)
    edges = statistics.mean(int(b.edge_index.size(1)) for b in batches)
    s, c = statistics.median(times[False]), statistics.median(times[True])
    print(f"{a.model}: {len(batches)} batches of ~{nodes:,.0f} nodes, {edges:,.0f} edges; hidden "
          f"{a.hidden}; {a.threads} threads")
    print(f"scatter {s:.3f} s  csr {c:.3f} s  ratio {s / c:.2f}x  (medians of {a.rounds})")
    print(f"max |out diff| {d_out:.2e}  max |grad diff| {d_grad:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
