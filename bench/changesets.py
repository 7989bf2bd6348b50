"""Belady changesets of one superbatch: numba on the CPU, torch on the CPU, torch on CUDA.

    python tools/bench_changesets.py --nodes 2000000 --superbatches 16,64 \
        --report bench_out/changesets.json

Samples the largest superbatch's batches once with ooc's sampler (batch 1024,
fanouts 15,10,5 by default: papers100M's recipe) from the synthetic generator's
graph at papers100M's average degree (``tools/bench_scale.py``'s), then computes
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
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ooc.inspector import NeighborSampler, derive_seed, precompute_changesets  # noqa: E402
from ooc.storage.atomic import write_json  # noqa: E402
from ooc.storage.ingest.synthetic import SyntheticEdges, communities_of  # noqa: E402
from scale_graph import PAPERS100M_EDGES, PAPERS100M_NODES  # noqa: E402  (tools/scale_graph.py)


def papers_like_csc(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """In-neighbour CSC (``indptr`` int64 [n + 1], ``indices`` int64 [2E]) of the synthetic
    generator's graph at papers100M's average degree (R-MAT power-law degrees, communities of
    128 hidden by an id permutation: ``tools/bench_scale.py``'s graph), stored both ways."""
    e = int(round(n * PAPERS100M_EDGES / PAPERS100M_NODES))
    source = SyntheticEdges(n, e, 172, 0.7, seed, communities=communities_of(n, 172, 128))
    src, dst = (np.concatenate(x) for x in zip(*((s, d) for s, d, _, _ in source.chunks(1 << 22, n))))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--superbatches", default="16,64", help="comma-separated batch counts S")
    ap.add_argument("--cache-fraction", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report")
    a = ap.parse_args()
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
    ids = [b.node_ids for b in sampler.sample_many(seeds, [derive_seed(a.seed, 0, i)
                                                            for i in range(len(seeds))])]
    print(f"graph {a.nodes:,} nodes, {indices.shape[0]:,} edges; {len(ids)} batches of "
          f"{statistics.mean(len(b) for b in ids):,.0f} ids sampled in {time.perf_counter() - t0:.1f} s")
    cap = int(a.cache_fraction * a.nodes)
    ms = methods()
    for kw in ms.values():  # compile (numba) / start CUDA before timing
        precompute_changesets([np.array([0, 1]), np.array([1, 2])], 4, 1, **kw)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    rows = []
    for S in sizes:
        batches = ids[:S]
        secs: dict[str, list[float]] = {m: [] for m in ms}
        misses = None
        for r in range(a.rounds):
            ref = None
            for m, kw in ms.items():
                s, cs = timed(batches, a.nodes, cap, kw)
                secs[m].append(s)
                if ref is None:
                    ref, misses = cs, cs.num_misses
                elif not cs.equals(ref):
                    raise SystemExit(f"bench_changesets: {m}'s changesets differ from numba's at S={S}")
        accesses = int(sum(len(b) for b in batches))
        med = {m: statistics.median(v) for m, v in secs.items()}
        row = {"superbatch": S, "accesses": accesses, "capacity": cap, "misses": int(misses),
               "seconds": secs, "median_s": med,
               "accesses_per_s": {m: accesses / v for m, v in med.items()},
               "speed_vs_numba": {m: med["numba"] / v for m, v in med.items()}}
        rows.append(row)
        print(f"S={S}: {accesses:,} accesses, misses {misses:,}; " + ", ".join(
            f"{m} {v:.3f} s ({row['speed_vs_numba'][m]:.2f}x)" for m, v in med.items()))
    cols = list(ms) + (["torch-cuda"] if "torch-cuda" not in ms else [])
    print("\n| S | accesses | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols))
    for row in rows:
        cells = [f"{row['median_s'][m]:.3f} s ({row['speed_vs_numba'][m]:.2f}x)"
                 if m in row["median_s"] else "absent" for m in cols]
        print(f"| {row['superbatch']} | {row['accesses']:,} | " + " | ".join(cells) + " |")
    if a.report:
        write_json(a.report, {"nodes": a.nodes, "edges": int(indices.shape[0]),
                              "batch_size": a.batch_size, "fanouts": a.fanouts,
                              "cache_fraction": a.cache_fraction, "cuda_device": device,
                              "cpu_threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
