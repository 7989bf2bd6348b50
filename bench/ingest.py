"""Benchmark note: streaming edge-list ingest keeps memory bounded.

Writes a raw binary int32 pair file of ``--edges`` edges (skewed ids, default
50M edges = 400 MB), then runs ``python -m ooc.prepare edgelist ... --format
bin32`` in a subprocess for each ``--buffer`` size and records its peak RSS
(the child's ``ru_maxrss`` via wait4, and a psutil poll of total and
anonymous resident memory), wall time and passes. Prints a markdown table,
writes JSON, and deletes the big files unless ``--keep``.

    python -m bench ingest --edges 50000000,100000000 --nodes 1000000 \
        --buffers 64MiB,256MiB --json bench_out/ingest.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from ooc.core.sizes import format_size, parse_size

from . import harness as H

REPO = H.REPO


def write_edges(path: Path, edges: int, nodes: int, seed: int = 0, chunk: int = 5_000_000) -> None:
    """Skewed (Zipf-like) int32 (src, dst) pairs, written chunk by chunk."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for a in range(0, edges, chunk):
            c = min(chunk, edges - a)
            pairs = np.empty((c, 2), dtype=np.int32)
            # ids with a power-law-ish popularity: floor(nodes * u^3)
            pairs[:, 0] = (nodes * rng.random(c) ** 3).astype(np.int32)
            pairs[:, 1] = rng.integers(0, nodes, c, dtype=np.int32)
            pairs.tofile(f)


def _rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_one(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = {"rss": 0, "anon": 0}
    done = threading.Event()

    def poll():
        p = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak["rss"] = max(peak["rss"], p.memory_info().rss)
                peak["anon"] = max(peak["anon"], _rss_anon(proc.pid))
            except psutil.Error:
                break
            time.sleep(0.02)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    _, status, ru = os.wait4(proc.pid, 0)
    done.set()
    th.join()
    proc.stdout.read()
    err = proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"ingest failed ({proc.returncode}): {err.strip()}")
    return {"wall_s": time.perf_counter() - t0, "ru_maxrss_bytes": ru.ru_maxrss * 1024,
            "polled_rss_bytes": peak["rss"], "polled_anon_bytes": peak["anon"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench ingest",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", default="50000000,100000000",
                    help="comma-separated edge counts (one edge file each)")
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--buffers", default="64MiB,256MiB", help="comma-separated --buffer sizes")
    ap.add_argument("--dedup", action="store_true", help="also pass --dedup")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=REPO / "bench_out" / "ingest.json")
    ap.add_argument("--keep", action="store_true", help="keep the edge file and datasets")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_ingest-", dir=args.workdir))
    rows = []
    try:
        for num_edges in [int(x) for x in args.edges.split(",")]:
            edges = work / f"edges-{num_edges}.i32"
            t = time.perf_counter()
            write_edges(edges, num_edges, args.nodes)
            print(f"wrote {edges} ({format_size(edges.stat().st_size)}) in {time.perf_counter() - t:.1f} s",
                  file=sys.stderr)
            for buf in args.buffers.split(","):
                out = work / f"ds-{num_edges}-{buf}"
                rep = work / f"report-{num_edges}-{buf}.json"
                cmd = [sys.executable, "-m", "ooc.prepare", "edgelist", str(edges), "--format", "bin32",
                       "--num-nodes", str(args.nodes), "--out", str(out), "--buffer", buf,
                       "--report", str(rep), "--no-progress"] + (["--dedup"] if args.dedup else [])
                m = run_one(cmd)
                r = json.loads(rep.read_text())
                row = {"buffer": buf, "buffer_bytes": parse_size(buf), "edges": num_edges,
                       "nodes": args.nodes,
                       "edge_file_bytes": edges.stat().st_size,
                       "indices_bytes": (out / "indices.bin").stat().st_size,
                       "num_edges_out": r["num_edges"], "passes": r["passes"], "windows": r["windows"],
                       "time_s": r["time_s"], **m, "command": " ".join(cmd)}
                rows.append(row)
                print(f"buffer {buf}: {row['time_s']:.1f} s, peak RSS {format_size(m['ru_maxrss_bytes'])} "
                      f"(anon {format_size(m['polled_anon_bytes'])})", file=sys.stderr)
                if not args.keep:
                    shutil.rmtree(out)
            if not args.keep:
                edges.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)

    print(f"\n{args.nodes:,} nodes (O(N) arrays ~{format_size(32 * args.nodes)}), raw int32 pairs\n")
    print("| edges | edge file | CSC indices | --buffer | passes | time (s) | peak RSS (ru_maxrss) "
          "| peak anon RSS (polled) | peak RSS / edge file |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['edges']:,} | {format_size(r['edge_file_bytes'])} | {format_size(r['indices_bytes'])} "
              f"| {r['buffer']} | {r['passes']} | {r['time_s']:.1f} | {format_size(r['ru_maxrss_bytes'])} "
              f"| {format_size(r['polled_anon_bytes'])} "
              f"| {r['ru_maxrss_bytes'] / r['edge_file_bytes']:.2f} |")
    H.write_report(args.json, "ingest", {"rows": rows},
                   spec={"edges": args.edges, "nodes": args.nodes}, args=args)
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
