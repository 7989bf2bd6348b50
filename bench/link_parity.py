"""Link prediction: a stock PyG model trained over ``ooc.LinkLoader`` against the same model
trained full-batch in memory with PyG, on the same split.

    python -m bench link_parity --data bench_out/cora_link --report bench_out/link_parity.json

``--data``: a dataset with a link split (``python -m ooc.prepare planetoid ... --link-split
0.05,0.10``). For each model (``--models``: PyG's ``GCN`` and ``GraphSAGE``, 2 layers,
``--hidden`` channels out, a dot-product decoder) and each seed of ``--seeds``:

* ``full-batch``: PyG in memory, ``model(x, edge_index)`` over the whole training graph
  (the dataset's adjacency: held-out edges are not in it), every training edge a
  positive and as many uniform negative pairs per step, ``--epochs`` steps;
* ``ooc.LinkLoader``: the user's own loop over ``ooc.LinkLoader(ds, --fanouts,
  neg_sampling="binary", batch_size=--batch-size, shuffle=True)``, ``--loader-epochs``
  epochs;

both with Adam (``--lr``) and binary cross-entropy, then scored the same way: every node's
embedding (full-batch: in memory; LinkLoader: ``layerwise_inference``, out of core) and
each held-out test edge against its stored negatives (AUC, MRR:
:func:`ooc.executor.training.link.split_metrics`). The table: medians over the seeds and
the difference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _model(kind: str, in_dim: int, hidden: int):
    from torch_geometric.nn import GCN, GraphSAGE

    cls = {"gcn": GCN, "sage": GraphSAGE}[kind]
    return cls(in_dim, hidden, num_layers=2, out_channels=hidden)


def _graph(ds):
    import torch

    x = torch.from_numpy(np.asarray(ds.features.read(np.arange(ds.num_nodes)), np.float32))
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(np.asarray(ds.indptr)))
    ei = torch.from_numpy(np.stack([np.asarray(ds.indices, np.int64), dst]))
    return x, ei


def _score(ds, h, part: str) -> dict:
    """Metrics of ``part`` from in-memory embeddings ``h`` [N, d]."""
    from ooc.executor.training.link import rank_metrics

    pos, neg = ds.link_split.edges(part)
    hs = h[pos[0]]
    ps = (hs * h[pos[1]]).sum(-1)
    ns = (hs[:, None, :] * h[neg]).sum(-1)
    return rank_metrics(ps.numpy(), ns.numpy())


def full_batch(ds, kind: str, seed: int, a) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    x, ei = _graph(ds)
    model = _model(kind, ds.feature_dim, a.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(a.epochs):
        model.train()
        opt.zero_grad()
        h = model(x, ei)
        neg = torch.randint(0, ds.num_nodes, ei.shape, generator=gen)
        s, d = torch.cat([ei, neg], 1)
        y = torch.cat([torch.ones(ei.shape[1]), torch.zeros(neg.shape[1])])
        F.binary_cross_entropy_with_logits((h[s] * h[d]).sum(-1), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        h = model(x, ei)
    return {"val": _score(ds, h, "val"), "test": _score(ds, h, "test")}


def over_loader(ds, kind: str, seed: int, a) -> dict:
    import torch
    import torch.nn.functional as F

    import ooc
    from ooc.executor.inference.layerwise import layerwise_inference
    from ooc.executor.training.link import DotDecoder, split_metrics

    torch.manual_seed(seed)
    model = _model(kind, ds.feature_dim, a.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    with ooc.LinkLoader(ds, fanouts, neg_sampling="binary", batch_size=a.batch_size,
                        shuffle=True, seed=seed, preset=a.preset) as loader:
        for _ in range(a.loader_epochs):
            model.train()
            for data in loader:
                opt.zero_grad()
                h = model(data.x, data.edge_index)
                s, d = data.edge_label_index
                F.binary_cross_entropy_with_logits((h[s] * h[d]).sum(-1),
                                                   data.edge_label).backward()
                opt.step()
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        layerwise_inference(ds, model, Path(tmp) / "emb", memory_budget="1GiB", progress=False)
        return {part: split_metrics(Path(tmp) / "emb", *ds.link_split.edges(part), DotDecoder())
                for part in ("val", "test")}


RUNS = {"full-batch": full_batch, "ooc.LinkLoader": over_loader}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench link_parity", description=__doc__)
    p.add_argument("--data", required=True, help="a dataset with a link split")
    p.add_argument("--models", default="gcn",
                   help="gcn and/or sage (GraphSAGE needs a lower --lr: at 0.01 its "
                        "dot-product scores collapse to AUC 0.5 in both runs)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=100, help="full-batch steps")
    p.add_argument("--loader-epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--preset", default="ooc")
    p.add_argument("--report", required=True)
    a = p.parse_args(argv)
    import ooc

    ds = ooc.open_dataset(a.data)
    if ds.link_split is None:
        raise SystemExit(f"{a.data}: no link split (ooc.prepare --link-split)")
    runs = []
    for kind in a.models.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            for name, fn in RUNS.items():
                t0 = time.perf_counter()
                m = fn(ds, kind, seed, a)
                runs.append({"model": kind, "seed": seed, "run": name,
                             "time_s": round(time.perf_counter() - t0, 2),
                             "val_auc": m["val"]["auc"], "test_auc": m["test"]["auc"],
                             "test_mrr": m["test"]["mrr"]})
                print(json.dumps(runs[-1]), flush=True)
    rows = []
    for kind in a.models.split(","):
        med = {name: {k: statistics.median(r[k] for r in runs if r["model"] == kind
                                           and r["run"] == name)
                      for k in ("val_auc", "test_auc", "test_mrr", "time_s")}
               for name in RUNS}
        rows.append({"model": kind, **{f"{name} {k}": v for name, d in med.items()
                                       for k, v in d.items()},
                     "test_auc difference": med["ooc.LinkLoader"]["test_auc"]
                     - med["full-batch"]["test_auc"]})
    rep = {"settings": vars(a), "runs": runs, "medians": rows}
    Path(a.report).parent.mkdir(parents=True, exist_ok=True)
    Path(a.report).write_text(json.dumps(rep, indent=1))
    print("| model | full-batch test AUC | ooc.LinkLoader test AUC | difference |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['full-batch test_auc']:.4f} | "
              f"{r['ooc.LinkLoader test_auc']:.4f} | {r['test_auc difference']:+.4f} |")
    return 0
