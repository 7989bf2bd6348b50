"""Benchmark the direct reader against fio: 4 KiB random-read IOPS and feature gather.

    python tools/bench_reader.py --file /var/tmp/ooc_bench.bin --size 2GiB \
        --depths 1,16,64,128 --seconds 5 --report bench_out/reader.json

Creates the file when missing (random bytes), drops it from the page cache
(``posix_fadvise(DONTNEED)``) before every run, then for every queue depth
measures ``DirectReader.read_pages`` (io_uring, preadv, mmap backends) on
batches of random unique pages, and ``fio --ioengine=io_uring --direct=1``
when fio is installed; ``ratio`` is ours / fio at the same depth. Then
``DirectFeatures.read`` throughput on batches of random row ids, the same
file viewed as a dim-128 float32 feature table. Prints a markdown table;
``--report`` writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ooc.storage import PAGE, DirectFeatures, DirectReader, FeatureLayout, aligned_empty  # noqa: E402
from ooc.storage.pagecache import drop_page_cache  # noqa: E402


def parse_size(s: str) -> int:
    s = s.strip()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = s.lower().rstrip("ib").rstrip("b") if s.lower().endswith(("ib", "b")) else s.lower()
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(float(t))


def make_file(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size >= size:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    chunk = 64 << 20
    with open(path, "wb") as f:
        done = 0
        while done < size:
            n = min(chunk, size - done)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            done += n
        f.flush()
        os.fsync(f.fileno())
    print(f"created {path} ({size >> 20} MiB)", file=sys.stderr)


def bench_reader(path: Path, backend: str, qd: int, seconds: float, batch: int,
                 seed: int) -> dict:
    drop_page_cache(path)
    rng = np.random.default_rng(seed)
    with DirectReader(path, queue_depth=qd, backend=backend) as r:
        npages = r.num_pages
        out = aligned_empty(batch * PAGE)
        # warm-up (numba kernels, ring)
        r.read_pages(np.unique(rng.integers(0, npages, 64)), out)
        r.stats.reset()
        t0 = time.perf_counter()
        c0 = time.process_time()
        t_plan = 0.0
        while True:
            a = time.perf_counter()
            pages = np.unique(rng.integers(0, npages, batch))
            t_plan += time.perf_counter() - a
            r.read_pages(pages, out)
            if time.perf_counter() - t0 >= seconds:
                break
        dt = time.perf_counter() - t0 - t_plan  # page-id generation is not the reader's cost
        cpu = time.process_time() - c0 - t_plan
        s = r.stats
        return {"backend": r.backend, "queue_depth": qd, "o_direct": r.o_direct,
                "seconds": dt, "pages": s.pages, "read_ops": s.read_ops,
                "iops": s.read_ops / dt, "pages_per_s": s.pages / dt,
                "mb_per_s": s.bytes_read / dt / 1e6,
                "cpu_us_per_op": cpu / max(1, s.read_ops) * 1e6, "cpu_util": cpu / dt}


def bench_fio(path: Path, qd: int, seconds: float) -> dict | None:
    fio = shutil.which("fio")
    if fio is None:
        return None
    drop_page_cache(path)
    cmd = [fio, "--name=r", f"--filename={path}", "--rw=randread", "--bs=4k", "--direct=1",
           "--ioengine=io_uring", f"--iodepth={qd}", f"--runtime={seconds:g}", "--time_based",
           "--output-format=json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"fio failed: {res.stderr.strip()[:200]}", file=sys.stderr)
        return None
    j = json.loads(res.stdout[res.stdout.index("{"):])
    job = j["jobs"][0]
    rd = job["read"]
    cpu_s = (job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) / 100 * job.get("job_runtime", 0) / 1e3
    return {"iops": rd["iops"], "mb_per_s": rd["bw_bytes"] / 1e6,
            "cpu_us_per_op": cpu_s / max(1, rd["total_ios"]) * 1e6, "cmd": " ".join(cmd)}


def bench_features(path: Path, qd: int, seconds: float, rows: int, dim: int,
                   backend: str, seed: int) -> dict:
    drop_page_cache(path)
    size = path.stat().st_size
    lay = FeatureLayout(size // PAGE * (PAGE // (dim * 4)), dim, "float32")
    rng = np.random.default_rng(seed)
    with DirectFeatures(path, lay, queue_depth=qd, backend=backend) as f:
        out = np.empty((rows, dim), np.float32)
        f.read(rng.integers(0, lay.num_rows, 16))
        f.stats.reset()
        t0 = time.perf_counter()
        t_gen = 0.0
        n = 0
        while True:
            a = time.perf_counter()
            ids = rng.integers(0, lay.num_rows, rows)
            t_gen += time.perf_counter() - a
            f.read(ids, out=out)
            n += rows
            if time.perf_counter() - t0 >= seconds:
                break
        dt = time.perf_counter() - t0 - t_gen
        s = f.stats
        return {"backend": f.backend, "queue_depth": qd, "batch_rows": rows, "dim": dim,
                "rows_per_s": n / dt, "row_mb_per_s": n * dim * 4 / dt / 1e6,
                "iops": s.read_ops / dt, "disk_mb_per_s": s.bytes_read / dt / 1e6,
                "ms_per_batch": dt / (n / rows) * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default="/var/tmp/ooc_bench_reader.bin", type=Path,
                    help="benchmark file (created when missing; default %(default)s)")
    ap.add_argument("--size", default="2GiB", help="file size (default %(default)s)")
    ap.add_argument("--depths", default="1,16,64,128", help="queue depths (default %(default)s)")
    ap.add_argument("--backends", default="io_uring,preadv,mmap")
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    ap.add_argument("--batch", type=int, default=4096, help="random pages per read_pages call")
    ap.add_argument("--feature-rows", type=int, default=10000)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved fio/ours rounds per depth; medians are reported "
                         "(the disk's speed drifts, so single runs mislead; default 3)")
    ap.add_argument("--report", type=Path, help="write the results as JSON here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError:
        print(f"bench_reader: bad --size {args.size!r}", file=sys.stderr)
        return 2
    depths = [int(x) for x in args.depths.split(",") if x]
    backends = [b for b in args.backends.split(",") if b]
    make_file(args.file, size)

    rows = []
    for qd in depths:
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        for rep in range(args.repeat):
            fio = None if args.no_fio else bench_fio(args.file, qd, args.seconds)
            for b in backends:
                r = bench_reader(args.file, b, qd, args.seconds, args.batch,
                                 args.seed + 1000 * rep + qd)
                r["fio_iops"] = fio["iops"] if fio else None
                r["fio_cpu_us_per_op"] = fio["cpu_us_per_op"] if fio else None
                r["ratio_vs_fio"] = r["iops"] / fio["iops"] if fio else None
                runs[b].append(r)
                print(f"qd={qd:4d} {b:9s} {r['iops']:10.0f} IOPS"
                      + (f"  fio {fio['iops']:10.0f}  ratio {r['ratio_vs_fio']:.2f}"
                         if fio else ""), file=sys.stderr)
        for b in backends:
            rs = runs[b]
            med = {k: float(np.median([r[k] for r in rs]))
                   for k in ("iops", "pages_per_s", "mb_per_s", "cpu_us_per_op", "cpu_util")}
            fio_l = [r["fio_iops"] for r in rs if r["fio_iops"]]
            fcpu = [r["fio_cpu_us_per_op"] for r in rs if r["fio_cpu_us_per_op"]]
            rat_l = [r["ratio_vs_fio"] for r in rs if r["ratio_vs_fio"]]
            rows.append({"backend": rs[0]["backend"], "queue_depth": qd,
                         "o_direct": rs[0]["o_direct"], **med,
                         "fio_iops": float(np.median(fio_l)) if fio_l else None,
                         "ratio_vs_fio": float(np.median(rat_l)) if rat_l else None,
                         "fio_cpu_us_per_op": float(np.median(fcpu)) if fcpu else None,
                         "runs": rs})
    feats = []
    for qd in depths:
        if qd < 16:
            continue
        feats.append(bench_features(args.file, qd, args.seconds, args.feature_rows,
                                    args.feature_dim, "io_uring" if "io_uring" in backends
                                    else backends[0], args.seed))

    print(f"\n4 KiB random reads, {args.file} ({size >> 20} MiB), batches of {args.batch} "
          f"random pages, page cache dropped before each run; medians of {args.repeat} "
          f"interleaved rounds of {args.seconds:g} s (ratio: median of per-round ratios)\n")
    print("| backend | QD | IOPS | MB/s | fio IOPS | ours/fio | CPU µs/op | fio CPU µs/op "
          "| CPU util |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fio_s = f"{r['fio_iops']:.0f}" if r["fio_iops"] else "-"
        rat = f"{r['ratio_vs_fio']:.2f}" if r["ratio_vs_fio"] else "-"
        print(f"| {r['backend']} | {r['queue_depth']} | {r['iops']:.0f} | {r['mb_per_s']:.1f} "
              f"| {fio_s} | {rat} | {r['cpu_us_per_op']:.1f} | "
              f"{r['fio_cpu_us_per_op'] or float('nan'):.1f} | {r['cpu_util']:.0%} |")
    print(f"\nDirectFeatures.read, batches of {args.feature_rows} random rows, "
          f"dim {args.feature_dim} float32\n")
    print("| backend | QD | rows/s | row MB/s | read IOPS | disk MB/s | ms/batch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for f in feats:
        print(f"| {f['backend']} | {f['queue_depth']} | {f['rows_per_s']:.0f} | "
              f"{f['row_mb_per_s']:.1f} | {f['iops']:.0f} | {f['disk_mb_per_s']:.1f} | "
              f"{f['ms_per_batch']:.1f} |")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"file": str(args.file), "size": size,
                                           "batch_pages": args.batch, "random_reads": rows,
                                           "features": feats}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
