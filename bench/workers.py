"""``NodeLoader(num_workers=...)``: epochs with 0, 1 and 2 gather threads, side by side.

    python -m bench workers --nodes 1000000 --feature-dim 128 --rounds 3 \\
        --step-ms 50 --report bench_out/workers.json

Builds (once, under ``--work``) a synthetic graph with ``ooc.prepare synthetic``'s
generator, then for each preset and each worker count runs one epoch of
``ooc.NodeLoader`` (fanouts 15,10,5, batch 1024, the training split, shuffled),
building each ``Data`` and throwing it away, with an optional stand-in for the
model's step (``--step-ms``: a busy matrix product of about that many
milliseconds per batch, on the consumer's thread). The rounds interleave the
worker counts (order rotated per round), all in one process and on a page
cache warmed by the first round; the table gives the median epoch seconds and
the ratio to ``num_workers=1`` (ooc's default).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import ooc

from . import harness as H


def _step(ms: float):
    """A consumer-side CPU load of about ``ms`` milliseconds (a stand-in for the model)."""
    import torch

    if ms <= 0:
        return lambda data: None
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.2:
        a @ a
        n += 1
    reps = max(1, round(n * ms / 200))

    def step(data) -> None:
        for _ in range(reps):
            a @ a
    return step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench workers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--avg-degree", type=float, default=15)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--train-fraction", type=float, default=0.01)
    ap.add_argument("--presets", default="static,ooc")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--work", default="bench_out/workers")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    ooc.configure_process()
    from ooc.storage.ingest.synthetic import generate_synthetic

    path = Path(a.work) / f"syn_{a.nodes}_{a.avg_degree:g}_{a.feature_dim}_{a.train_fraction:g}"
    if not path.exists():
        generate_synthetic(path, nodes=a.nodes, avg_degree=a.avg_degree,
                           feature_dim=a.feature_dim, train_fraction=a.train_fraction,
                           community_size=128)
    ds = ooc.open_dataset(path)
    step = _step(a.step_ms)
    workers = [int(w) for w in a.workers.split(",")]
    runs: dict[str, dict[int, list[float]]] = {}
    for preset in a.presets.split(","):
        runs[preset] = {w: [] for w in workers}
        for r in range(a.rounds):
            order = workers[r % len(workers):] + workers[:r % len(workers)]
            for w in order:
                with ooc.NodeLoader(ds, [15, 10, 5], input_nodes="train", batch_size=1024,
                                    shuffle=True, preset=preset, num_workers=w) as loader:
                    loader.set_epoch(r + 1)
                    t0 = time.perf_counter()
                    for data in loader:
                        step(data)
                    runs[preset][w].append(time.perf_counter() - t0)
    print(f"{ds.num_nodes:,} nodes x {ds.feature_dim}, {len(ds.train_idx):,} seeds, "
          f"step {a.step_ms:g} ms, medians of {a.rounds}")
    print("| preset | num_workers | epoch s | vs 1 worker |")
    print("|---|---:|---:|---:|")
    table = {}
    for preset, by_w in runs.items():
        base = statistics.median(by_w[1]) if 1 in by_w else None
        for w, ts in by_w.items():
            med = statistics.median(ts)
            ratio = med / base if base else float("nan")
            table[f"{preset}.{w}"] = {"epoch_s": med, "vs_one_worker": ratio, "runs": ts}
            print(f"| {preset} | {w} | {med:.2f} | {ratio:.2f} |")
    if a.report:
        H.write_report(a.report, "workers", {"nodes": ds.num_nodes, "feature_dim": ds.feature_dim,
                                             "step_ms": a.step_ms, "rounds": a.rounds,
                                             "table": table}, data_path=ds.path, args=a)


if __name__ == "__main__":
    main()
