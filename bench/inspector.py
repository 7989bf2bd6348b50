"""What changeset precomputation adds to superbatch sampling when pipelined (issue 3).

    python -m bench inspector --data bench_out/cache_policies/synthetic_1000000_10 \
        --report bench_out/inspector.json

Runs the inspector (``ooc.sampling.pipeline.Inspector``) over the same
superbatches twice per round, side by side: sampling alone, and sampling with
Belady changesets computed for superbatch k while k+1 is sampled (Ginex
Fig. 9). The consumer only loads and releases the runtime files. Reports the
median wall time of each and the added fraction (Ginex: under 20%).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ooc import open_dataset
from ooc.caches.changesets import precompute_changesets
from ooc.sampling import NeighborSampler
from ooc.sampling.pipeline import Inspector

from . import harness as H


def run(inspector: Inspector, seeds, bseeds) -> float:
    t0 = time.perf_counter()
    for sb in inspector.epoch(seeds, bseeds):
        sb.load()
        sb.release()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench inspector",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dataset folder (e.g. from bench_cache_policies)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--fanouts", default="10,10,10")
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--superbatch-size", type=int, default=100)
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    ds = open_dataset(a.data)
    fan = [int(f) for f in a.fanouts.split(",")]
    sampler = NeighborSampler(ds.indptr, ds.indices, fan)
    seeds, bseeds = (x[:a.batches] for x in H.epoch_plan(ds.train_idx, a.batch_size, 0, 0))
    cap = int(a.cache_fraction * ds.num_nodes)
    cs_time = [0.0]

    def cs(ids):
        t = time.perf_counter()
        out = precompute_changesets(ids, ds.num_nodes, cap)
        cs_time[0] += time.perf_counter() - t
        return out
    # JIT warm-up of both paths
    precompute_changesets([sampler.sample(seeds[0], bseeds[0]).node_ids], ds.num_nodes, cap)
    with tempfile.TemporaryDirectory(dir=Path(a.data).parent) as rt:
        def sample_only() -> float:
            return run(Inspector(sampler, Path(rt) / "a", a.superbatch_size), seeds, bseeds)

        def pipelined() -> dict[str, float]:
            cs_time[0] = 0.0
            t = run(Inspector(sampler, Path(rt) / "b", a.superbatch_size, changesets=cs),
                    seeds, bseeds)
            return {"s": t, "changeset_call_s": cs_time[0]}

        rounds = H.run_rounds({"sample_only": sample_only, "pipelined": pipelined}, a.rounds,
                              on_sample=lambda x: print(f"round {x.round}: {x.case} {x.values}"))
    med = H.medians(rounds)
    mp, mq = med["sample_only"]["s"], med["pipelined"]["s"]
    out = {"batches": len(seeds), "superbatch_size": a.superbatch_size, "capacity": cap,
           "sample_only_s": rounds.values("sample_only", "s"),
           "sample_and_changesets_s": rounds.values("pipelined", "s"),
           "median_sample_only_s": mp, "median_pipelined_s": mq, "added_fraction": mq / mp - 1,
           "changeset_call_s": rounds.values("pipelined", "changeset_call_s"),
           "median_changeset_call_s": med["pipelined"]["changeset_call_s"]}
    print(table(out))
    if a.report:
        H.write_report(a.report, "inspector", out, spec={"data": a.data}, samples=rounds,
                       data_path=ds.path, args=a)


def table(rep: dict) -> str:
    """Batches, superbatch size, the two medians and the time the changesets add."""
    mp, mq = rep["median_sample_only_s"], rep["median_pipelined_s"]
    return H.markdown(["batches", "S", "sample only (median)", "sample + changesets, pipelined",
                       "added"], [[rep["batches"], rep["superbatch_size"], f"{mp:.2f} s",
                                   f"{mq:.2f} s", f"{100 * (mq / mp - 1):+.0f}%"]],
                      ["l"] * 5)


if __name__ == "__main__":
    main()
