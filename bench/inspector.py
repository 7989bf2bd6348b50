"""What changeset precomputation adds to superbatch sampling when pipelined (issue 3).

    python tools/bench_inspector.py --data bench_out/cache_policies/synthetic_1000000_10 \
        --report bench_out/inspector.json

Runs the inspector (``ooc.inspector.pipeline.Inspector``) over the same
superbatches twice per round, side by side: sampling alone, and sampling with
Belady changesets computed for superbatch k while k+1 is sampled (Ginex
Fig. 9). The consumer only loads and releases the runtime files. Reports the
median wall time of each and the added fraction (Ginex: under 20%).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ooc.inspector import (NeighborSampler, derive_seed, epoch_batches,  # noqa: E402
                           precompute_changesets)
from ooc.inspector.pipeline import Inspector  # noqa: E402
from ooc.storage import open_dataset  # noqa: E402
from ooc.storage.atomic import write_json  # noqa: E402


def run(inspector: Inspector, seeds, bseeds) -> float:
    t0 = time.perf_counter()
    for sb in inspector.epoch(seeds, bseeds):
        sb.load()
        sb.release()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dataset folder (e.g. from bench_cache_policies)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--fanouts", default="10,10,10")
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--superbatch-size", type=int, default=100)
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--report")
    a = ap.parse_args()
    ds = open_dataset(a.data)
    fan = [int(f) for f in a.fanouts.split(",")]
    sampler = NeighborSampler(ds.indptr, ds.indices, fan)
    seeds = epoch_batches(ds.train_idx, a.batch_size, 0, 0)[: a.batches]
    bseeds = [derive_seed(0, 0, i) for i in range(len(seeds))]
    cap = int(a.cache_fraction * ds.num_nodes)
    cs_time = [0.0]

    def cs(ids):
        t = time.perf_counter()
        out = precompute_changesets(ids, ds.num_nodes, cap)
        cs_time[0] += time.perf_counter() - t
        return out
    # JIT warm-up of both paths
    precompute_changesets([sampler.sample(seeds[0], bseeds[0]).node_ids], ds.num_nodes, cap)
    plain, piped, cs_secs = [], [], []
    cs_time[0] = 0.0
    with tempfile.TemporaryDirectory(dir=Path(a.data).parent) as rt:
        for r in range(a.rounds):
            plain.append(run(Inspector(sampler, Path(rt) / "a", a.superbatch_size), seeds, bseeds))
            piped.append(run(Inspector(sampler, Path(rt) / "b", a.superbatch_size, changesets=cs),
                             seeds, bseeds))
            print(f"round {r}: sample only {plain[-1]:.2f}s, sample + changesets {piped[-1]:.2f}s "
                  f"(precompute_changesets calls: {cs_time[0]:.2f}s)")
            cs_secs.append(cs_time[0])
            cs_time[0] = 0.0
    mp, mq = statistics.median(plain), statistics.median(piped)
    out = {"batches": len(seeds), "superbatch_size": a.superbatch_size, "capacity": cap,
           "sample_only_s": plain, "sample_and_changesets_s": piped,
           "median_sample_only_s": mp, "median_pipelined_s": mq, "added_fraction": mq / mp - 1,
           "changeset_call_s": cs_secs, "median_changeset_call_s": statistics.median(cs_secs)}
    print(f"\n| batches | S | sample only (median) | sample + changesets, pipelined | added |\n"
          f"|---|---|---|---|---|\n| {len(seeds)} | {a.superbatch_size} | {mp:.2f} s | {mq:.2f} s | "
          f"{100 * (mq / mp - 1):+.0f}% |")
    if a.report:
        write_json(a.report, out)


if __name__ == "__main__":
    main()
