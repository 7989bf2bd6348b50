"""Model averaging against single-worker training (SDT-GNN Fig. 10), and Q = 1 vs Q = 2 time.

For Cora and a synthetic power-law graph it runs ``python -m ooc.train``:

* ``single``: one process, the whole graph, validation accuracy after every epoch;
* ``P=4 Q=1``: four SPRING partitions, local models averaged every epoch, one process;
* ``P=4 Q=2``: the same with two gloo workers (same weights as Q = 1; wall time differs).

and prints a markdown table of validation accuracy per epoch and wall time per
epoch (mean over epochs 2.., the first one includes JIT and cache warm-up),
and writes everything to ``--out`` (JSON).

    python -m bench averaging --epochs 20 --out bench_out/averaging.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import harness as H

REPO = H.REPO
SHARED = REPO.parent / "shared"


#: The synthetic dataset's ``generate_synthetic`` arguments.
SYNTHETIC = dict(nodes=20_000, avg_degree=10, feature_dim=64, classes=8, train_fraction=0.1,
                 val_fraction=0.05, test_fraction=0.1, seed=0)


def prepare(work: Path, which: str) -> Path:
    out = work / which
    if (out / "meta.json").is_file():
        return out
    if which == "cora":
        cmd = [sys.executable, "-m", "ooc.prepare", "planetoid", "--root",
               str(SHARED / "data" / "planetoid"), "--name", "Cora", "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
    else:
        from ooc.storage.ingest import generate_synthetic

        generate_synthetic(out, **SYNTHETIC, progress=False)
    return out


def train(data: Path, report: Path, extra: list[str], args) -> dict:
    cmd = [sys.executable, "-m", "ooc.train", "--data", str(data), "--epochs", str(args.epochs),
           "--mode", args.mode, "--no-progress", "--report", str(report), "--seed", "0",
           *args.train_args.split(), *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    rep = json.loads(report.read_text())
    rep["wall_s"] = time.perf_counter() - t0
    rep["cmd"] = cmd
    return rep


def per_epoch(rep: dict) -> tuple[list, list]:
    acc = [e.get("val_acc") for e in rep["epochs"]]
    t = [e["time_s"] + e.get("eval_time_s", 0.0) for e in rep["epochs"]]
    return acc, t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench averaging",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--mode", default="ooc")
    ap.add_argument("--datasets", default="cora,synthetic")
    ap.add_argument("--train-args", default="--batch-size 256 --fanouts 10,10 --hidden 128",
                    help="extra ooc.train options for every run")
    ap.add_argument("--work", help="dataset/partition folder (default: a temp folder)")
    ap.add_argument("--out", default="bench_out/averaging.json")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_avg_"))
    work.mkdir(parents=True, exist_ok=True)
    results = {"epochs": args.epochs, "mode": args.mode, "train_args": args.train_args,
               "cpus": os.cpu_count(), "datasets": {}}
    for which in args.datasets.split(","):
        data = prepare(work, which)
        runs = {
            "single": [],
            "P=4 Q=1": ["--workers", "1", "--partitions", "4", "--sync-every", "1"],
            "P=4 Q=2": ["--workers", "2", "--partitions", "4", "--sync-every", "1"],
        }
        res = {}
        for name, extra in runs.items():
            rep = train(data, work / f"{which}-{name.replace(' ', '_')}.json", extra, args)
            acc, t = per_epoch(rep)
            res[name] = {"val_acc": acc, "epoch_time_s": t, "test_acc": rep.get("test_acc"),
                         "wall_s": rep["wall_s"], "cmd": rep["cmd"],
                         "peak_rss_bytes": rep.get("peak_rss_bytes_max_worker",
                                                   rep.get("peak_rss_bytes"))}
            print(f"{which} {name}: final val {acc[-1]:.4f} test {rep.get('test_acc') or 0:.4f} "
                  f"wall {rep['wall_s']:.1f}s", file=sys.stderr)
        results["datasets"][which] = res
    H.write_report(args.out, "averaging", results, spec={"synthetic": SYNTHETIC}, args=args,
                   data_path=work)
    print(table(results))
    return 0


def table(results: dict) -> str:
    lines = []
    for which, res in results["datasets"].items():
        names = list(res)
        lines.append(f"\n**{which}** (mode {results['mode']}, {results['train_args']}, "
                     f"{results['cpus']} cores): validation accuracy after each epoch\n")
        lines.append("| epoch | " + " | ".join(names) + " |")
        lines.append("|---:|" + "---:|" * len(names))
        n = len(res[names[0]]["val_acc"])
        for e in range(n):
            cells = [res[k]["val_acc"][e] if e < len(res[k]["val_acc"]) else None for k in names]
            lines.append(f"| {e + 1} | " + " | ".join("–" if c is None else f"{c:.3f}"
                                                      for c in cells) + " |")
        lines.append("| test (final) | " + " | ".join(
            "–" if res[k]["test_acc"] is None else f"{res[k]['test_acc']:.3f}" for k in names)
            + " |")
        lines.append("| s/epoch (epochs 2..) | " + " | ".join(
            f"{sum(res[k]['epoch_time_s'][1:]) / max(1, n - 1):.3f}" for k in names) + " |")
        lines.append("| wall s (whole run) | " + " | ".join(f"{res[k]['wall_s']:.1f}"
                                                           for k in names) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
