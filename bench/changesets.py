"""Belady changesets of one superbatch: numba on the CPU, torch on the CPU, torch on CUDA.

    python -m bench changesets --nodes 2000000 --superbatches 16,64 \
        --report bench_out/changesets.json

Samples the largest superbatch's batches once with ooc's sampler (batch 1024,
fanouts 15,10,5 by default: papers100M's recipe) from the synthetic generator's
graph at papers100M's average degree (``python -m bench scale``'s), then computes
the changesets of the first S batches for each S, at a cache of
``--cache-fraction`` of the nodes and with ``keep_unused`` (the training
pipeline's call), every method side by side, ``--rounds`` times. Every method's
result must equal numba's (the same initial set, ins, outs and misses) or the
run fails. Reports each method's median seconds, accesses per second and its
speed as a multiple of numba's. ``torch-cuda`` runs where
``torch.cuda.is_available()``; elsewhere it is listed as absent.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ooc.caches.changesets import precompute_changesets
from ooc.sampling import EpochPlan, NeighborSampler
from ooc.storage.ingest.synthetic import SyntheticEdges, communities_of

from . import harness as H
from .scale_graph import PAPERS100M_EDGES, PAPERS100M_NODES


def papers_like_csc(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """In-neighbour CSC (``indptr`` int64 [n + 1], ``indices`` int64 [2E]) of the synthetic
    generator's graph at papers100M's average degree (R-MAT power-law degrees, communities of
    128 hidden by an id permutation: ``python -m bench scale``'s graph), stored both ways."""
    e = int(round(n * PAPERS100M_EDGES / PAPERS100M_NODES))
    source = SyntheticEdges(n, e, 172, 0.7, seed, communities=communities_of(n, 172, 128))
    src, dst = (np.concatenate(x)
                for x in zip(*((s, d) for s, d, _, _ in source.chunks(1 << 22, n)), strict=True))
    src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order]


def methods() -> dict[str, dict]:
    """Method name -> precompute_changesets keyword arguments, numba first."""
    out = {"numba": {"method": "numba"}, "torch-cpu": {"method": "torch", "device": "cpu"}}
    if torch.cuda.is_available():
        out["torch-cuda"] = {"method": "torch", "device": "cuda"}
    return out


def timed(batches, n: int, cap: int, kw: dict):
    if kw.get("device") == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    # the training pipeline's call (BeladyCache): entries dropped after their last use are
    # kept until their slot is needed; the host arrays' copy back is timed
    cs = precompute_changesets(batches, n, cap, keep_unused=True, **kw)
    return time.perf_counter() - t, cs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench changesets", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--superbatches", default="16,64", help="comma-separated batch counts S")
    ap.add_argument("--cache-fraction", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    try:
        sizes = sorted(int(s) for s in a.superbatches.split(","))
        fanouts = [int(f) for f in a.fanouts.split(",")]
    except ValueError:
        ap.error("--superbatches and --fanouts take comma-separated integers")
    if min(sizes) < 1 or min(fanouts) < 0 or a.rounds < 1 or not 0 <= a.cache_fraction <= 1 \
            or not 0 < a.batch_size <= a.nodes:
        ap.error("--superbatches and --rounds must be >= 1, --fanouts >= 0, --cache-fraction in "
                 "[0, 1] and --batch-size in [1, --nodes]")
    t0 = time.perf_counter()
    indptr, indices = papers_like_csc(a.nodes, a.seed)
    sampler = NeighborSampler(indptr, indices, fanouts)
    rng = np.random.default_rng(a.seed + 1)
    seeds = [rng.choice(a.nodes, a.batch_size, replace=False) for _ in range(sizes[-1])]
    # in order, one batch of the plan per draw: its batches are ``seeds``
    plan = EpochPlan(np.concatenate(seeds), a.batch_size, a.seed, 0, shuffle=False)
    ids = [b.node_ids for b in sampler.sample_many(*plan.first())]
    print(f"graph {a.nodes:,} nodes, {indices.shape[0]:,} edges; {len(ids)} batches of "
          f"{statistics.mean(len(b) for b in ids):,.0f} ids sampled in {time.perf_counter() - t0:.1f} s")
    cap = int(a.cache_fraction * a.nodes)
    ms = methods()
    for kw in ms.values():  # compile (numba) / start CUDA before timing
        precompute_changesets([np.array([0, 1]), np.array([1, 2])], 4, 1, **kw)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    rows = []
    samples = []
    for S in sizes:
        batches = ids[:S]
        got: dict = {}

        def case(m: str, kw: dict, batches: list, got: dict, S: int):
            def run() -> float:
                s, cs = timed(batches, a.nodes, cap, kw)
                ref = got.setdefault("ref", cs)
                if not cs.equals(ref):
                    raise SystemExit(f"bench changesets: {m}'s changesets differ from "
                                     f"{next(iter(ms))}'s at S={S}")
                return s
            return run

        rounds = H.run_rounds({m: case(m, kw, batches, got, S) for m, kw in ms.items()}, a.rounds, warmup=0)
        samples += [dict(x, superbatch=S) for x in rounds.as_list()]
        misses = got["ref"].num_misses
        accesses = int(sum(len(b) for b in batches))
        med = {m: v["s"] for m, v in H.medians(rounds).items()}
        row = {"superbatch": S, "accesses": accesses, "capacity": cap, "misses": int(misses),
               "seconds": {m: rounds.values(m, "s") for m in ms}, "median_s": med,
               "accesses_per_s": {m: accesses / v for m, v in med.items()},
               "speed_vs_numba": {m: med["numba"] / v for m, v in med.items()}}
        rows.append(row)
        print(f"S={S}: {accesses:,} accesses, misses {misses:,}; " + ", ".join(
            f"{m} {v:.3f} s ({row['speed_vs_numba'][m]:.2f}x)" for m, v in med.items()))
    rep = {"nodes": a.nodes, "edges": int(indices.shape[0]), "batch_size": a.batch_size,
           "fanouts": a.fanouts, "cache_fraction": a.cache_fraction, "cuda_device": device,
           "cpu_threads": torch.get_num_threads(), "methods": list(ms), "rows": rows}
    print("\n" + table(rep))
    if a.report:
        H.write_report(a.report, "changesets", rep, spec={"nodes": a.nodes, "seed": a.seed},
                       samples=samples, args=a)


def table(rep: dict) -> str:
    """Per superbatch size: each method's median seconds and its speed against numba's."""
    ms = rep.get("methods") or list(rep["rows"][0]["median_s"])
    cols = ms + (["torch-cuda"] if "torch-cuda" not in ms else [])
    rows = [[row["superbatch"], f"{row['accesses']:,}",
             *(f"{row['median_s'][m]:.3f} s ({row['speed_vs_numba'][m]:.2f}x)"
               if m in row["median_s"] else "absent" for m in cols)] for row in rep["rows"]]
    return H.markdown(["S", "accesses", *cols], rows, ["l"] * (2 + len(cols)))


if __name__ == "__main__":
    main()
