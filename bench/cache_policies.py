#!/usr/bin/env python
"""Feature-cache misses of Belady, LRU and the static degree-ordered cache (issue 3).

Builds (once, in ``--work``) or reuses (``--data DIR``) a power-law synthetic
dataset (``ooc.storage.ingest.generate_synthetic``: R-MAT), samples a
superbatch of mini-batches with fanouts 10,10,10 (``NeighborSampler``), and
prints, for cache sizes of 5/10/20/40% of the nodes, the misses and miss
ratios of

* Belady (Ginex; ``ooc.caches.changesets.precompute_changesets`` semantics),
* LRU at batch granularity (``ooc.caches.miss_curves``),
* static: PaGraph's highest-out-degree nodes.

The graph and batch size are chosen so that one batch touches a few percent of
the nodes (DESIGN.md §8); the measured share is printed. Belady with more
misses than another policy at any size is a bug: the tool then exits 1.

It also measures changeset precomputation throughput (ids per second) on
the CPU for the numba and torch paths over the superbatch, next to the time
to sample that superbatch.

Usage::

    python -m bench cache_policies --work bench_out/cache_policies \\
        --report bench_out/cache_policies.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ooc import open_dataset
from ooc.caches.changesets import precompute_changesets
from ooc.caches.miss_curves import miss_curve_belady, miss_curve_lru, miss_curve_static, order_by_degree
from ooc.cli import main_wrapper
from ooc.sampling import NeighborSampler

from . import data as D
from . import harness as H

FRACTIONS = (0.05, 0.10, 0.20, 0.40)


def _dataset(args) -> Path:
    if args.data:
        return Path(args.data)
    path = D.synthetic(_spec(args), Path(args.work) / f"synthetic_{args.nodes}_{args.avg_degree:g}")
    if path is None:
        raise SystemExit(2)
    return path


def _spec(args) -> dict:
    return dict(nodes=args.nodes, avg_degree=args.avg_degree, feature_dim=4,
                train_fraction=args.train_fraction, seed=args.seed)


def _best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@main_wrapper
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench cache_policies",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="an existing dataset folder (default: generate one)")
    ap.add_argument("--work", default="bench_out/cache_policies")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--avg-degree", type=float, default=10)
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--fanouts", default="10,10,10")
    ap.add_argument("--batches", type=int, default=400, help="superbatch size S (batches in the trace)")
    ap.add_argument("--throughput-batches", type=int, default=200,
                    help="batches for the changeset throughput runs (torch is per-step Python)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--report")
    args = ap.parse_args(argv)
    fanouts = [int(f) for f in args.fanouts.split(",")]

    d = open_dataset(_dataset(args))
    N = d.num_nodes
    sampler = NeighborSampler(d.indptr, np.asarray(d.indices), fanouts)
    seeds, bseeds = (x[:args.batches] for x in H.epoch_plan(d.train_idx, args.batch_size,
                                                               args.seed, 0))
    sampler.sample_many(seeds[:2], bseeds[:2])  # JIT warm-up
    t = time.perf_counter()
    batches = [b.node_ids for b in sampler.sample_many(seeds, bseeds)]
    sample_s = time.perf_counter() - t
    S = len(batches)
    sizes = np.array([len(b) for b in batches])
    T = int(sizes.sum())
    touched = sizes / N
    distinct = len(np.unique(np.concatenate(batches)))
    print(f"graph: {N:,} nodes, {d.num_edges:,} edges; {S} batches of {args.batch_size} seeds, "
          f"fanouts {args.fanouts}")
    print(f"one batch touches {sizes.mean():,.0f} nodes on average = {100 * touched.mean():.2f}% "
          f"of the nodes (max {100 * touched.max():.2f}%); the superbatch touches {distinct:,} "
          f"({100 * distinct / N:.1f}%), {T:,} accesses; sampled in {sample_s:.2f}s")

    caps = [int(round(f * N)) for f in FRACTIONS]
    t = time.perf_counter()
    belady = miss_curve_belady(batches, caps)
    t_b = time.perf_counter() - t
    t = time.perf_counter()
    lru = miss_curve_lru(batches, caps)
    t_l = time.perf_counter() - t
    order = order_by_degree(d.out_degrees())
    static = miss_curve_static(batches, order, caps)
    print(f"\n(curves: belady {t_b:.2f}s for {len(caps)} sizes, lru {t_l:.2f}s for all sizes)")
    print("\n| cache | entries | Belady misses | LRU misses | static (PaGraph) misses | "
          "Belady ratio | LRU ratio | static ratio |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for f, c, b, lr, s in zip(FRACTIONS, caps, belady, lru, static, strict=True):
        rows.append({"fraction": f, "capacity": c, "belady": int(b), "lru": int(lr), "static": int(s),
                     "belady_ratio": b / T, "lru_ratio": lr / T, "static_ratio": s / T})
        print(f"| {100 * f:.0f}% | {c:,} | {b:,} | {lr:,} | {s:,} | {b / T:.3f} | {lr / T:.3f} | "
              f"{s / T:.3f} |")
    bad = [r for r in rows if r["belady"] > min(r["lru"], r["static"])]

    # changeset precomputation throughput (CPU) at 10% of the nodes
    tb = batches[:args.throughput_batches]
    tT = int(sum(len(b) for b in tb))
    cap = caps[1]
    precompute_changesets(tb[:3], N, cap, method="numba")  # JIT warm-up
    ref = precompute_changesets(tb, N, cap, method="numba")
    tor = precompute_changesets(tb, N, cap, method="torch")
    if not ref.equals(tor):
        print("BUG: the torch and numba changesets differ")
        return 1
    tput = {}
    for m in ("numba", "torch"):
        s = _best_of(lambda m=m: precompute_changesets(tb, N, cap, method=m), args.repeat)
        tput[m] = {"seconds": s, "ids_per_s": tT / s,
                   "fraction_of_sample_time": s / (sample_s * len(tb) / S)}
    print(f"\nchangeset precomputation, {len(tb)} batches ({tT:,} ids), capacity {cap:,}, "
          f"{torch.get_num_threads()} torch threads:")
    for m, r in tput.items():
        print(f"  {m:5s}: {r['seconds']:.3f}s = {r['ids_per_s'] / 1e6:.2f}M ids/s, "
              f"{100 * r['fraction_of_sample_time']:.0f}% of the time to sample those batches")
    print(f"  misses at 10%: {ref.num_misses:,} (= Belady curve on this prefix: "
          f"{int(miss_curve_belady(tb, [cap])[0]):,})")

    if args.report:
        rep = {"dataset": str(d.path), "num_nodes": N, "num_edges": d.num_edges,
               "batch_size": args.batch_size, "fanouts": fanouts, "batches": S, "accesses": T,
               "batch_touch_fraction_mean": float(touched.mean()),
               "batch_touch_fraction_max": float(touched.max()),
               "superbatch_distinct_fraction": distinct / N, "sample_s": sample_s,
               "misses": rows, "changesets": {"batches": len(tb), "ids": tT, "capacity": cap, **tput},
               "belady_optimal": not bad}
        H.write_report(args.report, "cache_policies", rep,
                       spec=_spec(args) if not args.data else {"data": args.data},
                       data_path=d.path, args=args)
    if bad:
        print(f"BUG: Belady has more misses than another policy: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
