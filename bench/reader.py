"""Benchmark the direct reader's backends against fio: 4 KiB random reads, and feature gather.

    python -m bench reader --file /var/tmp/ooc_bench_reader.bin --size 2GiB \
        --depths 1,16,64,128 --seconds 3 --repeat 3 --report bench_out/reader.json

Two files: ``--file`` on the disk, and ``--tmpfs-file`` on tmpfs (RAM; a read
there costs CPU and no device time, so it measures what a backend costs per
read). Both are created when missing (random bytes; the tmpfs one is removed
at the end when this run created it). For every file and queue depth,
``--repeat`` interleaved rounds each run fio (``--direct=1``, io_uring
engine; see ``bench/fio.py``) and every backend (``DirectReader.read_pages``
on batches of ``--batch`` random unique pages, the file dropped from the page
cache first), the order rotated each round; the table gives medians, and the
ratio is the median of the per-round ratios (the disk's speed drifts). CPU
per read counts every thread of the process (io_uring's ``iou-wrk`` workers
and preadv threads included), as fio's does.

A backend whose probe fails here (e.g. the python ``liburing`` wheel dying
of SIGILL on a CPU without AVX-512) is left out of the table, with the
probe's verdict printed and written to the report. Then
``DirectFeatures.read(ids, out=...)`` (native engine) on batches of random
rows of the disk file viewed as float32 tables of ``--feature-dims`` widths:
whole-page rows (dim 1024) twice, read straight into a page-aligned ``out``
and through the page buffer (``out`` off a page boundary, rows copied out).
``--report`` writes JSON with
``native_vs_fio`` (disk IOPS ratio by queue depth), ``native_vs_fio_tmpfs``
and ``native_cpu_vs_fio_tmpfs`` (CPU per read, ours / fio's, on tmpfs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ooc.core.sizes import parse_size
from ooc.storage import PAGE, DirectFeatures, DirectReader, FeatureLayout, aligned_empty, io_backends, probe
from ooc.storage.pagecache import drop_page_cache

from . import fio
from . import harness as H


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
        return {"backend": r.backend, "label": r.backend_label, "queue_depth": qd,
                "o_direct": r.o_direct,
                "seconds": dt, "pages": s.pages, "read_ops": s.read_ops,
                "iops": s.read_ops / dt, "pages_per_s": s.pages / dt,
                "mb_per_s": s.bytes_read / dt / 1e6,
                "cpu_us_per_op": cpu / max(1, s.read_ops) * 1e6, "cpu_util": cpu / dt}


def bench_features(path: Path, qd: int, seconds: float, rows: int, dim: int,
                   backend: str, seed: int, aligned: bool) -> dict:
    """``DirectFeatures.read(ids, out=out)`` of random rows for ``seconds``. ``aligned``:
    ``out`` starts on a page (whole-page rows are then read straight into it), else 64
    bytes past one (every row goes through the page buffer and is copied)."""
    drop_page_cache(path)
    size = path.stat().st_size
    row_bytes = dim * 4
    per_page = PAGE // row_bytes if row_bytes <= PAGE else 1
    pages_per_row = 1 if row_bytes <= PAGE else -(-row_bytes // PAGE)
    lay = FeatureLayout(size // PAGE * per_page // pages_per_row, dim, "float32")
    rng = np.random.default_rng(seed)
    with DirectFeatures(path, lay, queue_depth=qd, backend=backend) as f:
        shift = 0 if aligned else 64
        out = aligned_empty(rows * row_bytes + shift)[shift:].view(np.float32).reshape(rows, dim)
        f.read(rng.integers(0, lay.num_rows, 16))
        f.reader.stats.reset()
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
        s = f.reader.stats
        return {"backend": f.backend, "queue_depth": qd, "batch_rows": rows, "dim": dim,
                "target": "rows" if s.rows_direct else "page buffer + copy",
                "rows_per_s": n / dt, "row_mb_per_s": n * dim * 4 / dt / 1e6,
                "iops": s.read_ops / dt, "disk_mb_per_s": s.bytes_read / dt / 1e6,
                "ms_per_batch": dt / (n / rows) * 1e3}




def usable_backends(names: list[str], path: Path) -> tuple[list[str], dict[str, str]]:
    """The backends that work on ``path`` here, and why each other one does not."""
    ok, excluded = [], {}
    for b in names:
        cls = io_backends.backend_class(b)
        if cls.probe_in_child:
            v = probe.verdict(b, io_backends.REGISTRY[b], str(path))
            if not v.ok:
                excluded[b] = v.reason
                continue
        ok.append(b)
    return ok, excluded


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def measure(path: Path, where: str, depths: list[int], backends: list[str], args) -> list[dict]:
    """Interleaved rounds of fio and every backend at every depth on one file; median rows."""
    rows = []
    for qd in depths:
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        fios: list[dict | None] = []
        for rep in range(args.repeat):
            order = ["fio"] + backends
            k = rep % len(order)
            order = order[k:] + order[:k]
            res: dict[str, dict] = {}
            f = None
            for b in order:
                if b == "fio":
                    if not args.no_fio:
                        drop_page_cache(path)
                        f = fio.run_fio(path, qd, args.seconds)
                    continue
                res[b] = bench_reader(path, b, qd, args.seconds, args.batch,
                                      args.seed + 1000 * rep + qd)
            fios.append(f)
            for b, r in res.items():
                r["fio_iops"] = f["iops"] if f else None
                r["fio_cpu_us_per_op"] = f["cpu_us_per_op"] if f else None
                r["ratio_vs_fio"] = r["iops"] / f["iops"] if f else None
                r["cpu_vs_fio"] = r["cpu_us_per_op"] / f["cpu_us_per_op"] \
                    if f and f["cpu_us_per_op"] > 0 else None
                runs[b].append(r)
                print(f"{where} qd={qd:4d} {b:9s} {r['iops']:9.0f} IOPS "
                      f"{r['cpu_us_per_op']:6.2f} us/op"
                      + (f"  fio {f['iops']:9.0f} IOPS {f['cpu_us_per_op']:6.2f} us/op  "
                         f"ratio {r['ratio_vs_fio']:.2f}" if f else ""), file=sys.stderr)
        for b in backends:
            rs = runs[b]
            med = {k: median([r[k] for r in rs]) for k in
                   ("iops", "pages_per_s", "mb_per_s", "cpu_us_per_op", "cpu_util",
                    "fio_iops", "fio_cpu_us_per_op", "ratio_vs_fio", "cpu_vs_fio")}
            rows.append({"file": where, "backend": b, "label": rs[0]["label"],
                         "queue_depth": qd, "o_direct": rs[0]["o_direct"], **med,
                         "fio_job_cpu_us_per_op": median(
                             [f["job_cpu_us_per_op"] for f in fios if f]),
                         "runs": rs, "fio_runs": fios})
    return rows


def by_depth(rows: list[dict], where: str, key: str) -> dict[str, float]:
    return {str(r["queue_depth"]): r[key] for r in rows
            if r["file"] == where and r["backend"] == "io_uring" and r[key] is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench reader",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default="/var/tmp/ooc_bench_reader.bin", type=Path,
                    help="benchmark file on the disk (created when missing; default %(default)s)")
    ap.add_argument("--size", default="2GiB", help="its size (default %(default)s)")
    ap.add_argument("--tmpfs-file", default="/dev/shm/ooc_bench_reader.bin",
                    help="file on tmpfs for the CPU cost per read ('none' to skip; "
                         "default %(default)s)")
    ap.add_argument("--tmpfs-size", default="1GiB", help="its size (default %(default)s)")
    ap.add_argument("--depths", default="1,16,64,128", help="queue depths (default %(default)s)")
    ap.add_argument("--backends", default="io_uring,liburing,preadv",
                    help="backends to measure (default %(default)s; also: mmap)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    ap.add_argument("--batch", type=int, default=4096, help="random pages per read_pages call")
    ap.add_argument("--feature-rows", type=int, default=10000)
    ap.add_argument("--feature-dims", default="128,1024",
                    help="float32 row widths of the DirectFeatures runs; whole-page rows are "
                         "measured read into the rows and through the page buffer "
                         "(default %(default)s)")
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved rounds per depth; medians are reported (default 3)")
    ap.add_argument("--report", type=Path, help="write the results as JSON here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
        tmpfs_size = parse_size(args.tmpfs_size)
        depths = [int(x) for x in args.depths.split(",") if x]
        dims = [int(x) for x in args.feature_dims.split(",") if x]
    except ValueError as e:
        print(f"bench_reader: {e}", file=sys.stderr)
        return 2
    names = [b for b in args.backends.split(",") if b]
    for b in names:
        if b not in io_backends.REGISTRY:
            print(f"bench_reader: unknown backend {b!r} (choose from "
                  f"{', '.join(io_backends.REGISTRY)})", file=sys.stderr)
            return 2
    if not args.no_fio and not fio.available():
        print("bench_reader: fio is not installed (apt-get install -y fio); fio columns empty",
              file=sys.stderr)
    files = [("disk", args.file, size)]
    tmpfs_created = False
    if args.tmpfs_file != "none":
        tp = Path(args.tmpfs_file)
        tmpfs_created = not tp.exists()
        files.append(("tmpfs", tp, tmpfs_size))
    rows: list[dict] = []
    excluded: dict[str, str] = {}
    try:
        for where, path, sz in files:
            make_file(path, sz)
            backends, why = usable_backends(names, path)
            for b, reason in why.items():
                print(f"bench_reader: {b} left out on {where}: {reason}", file=sys.stderr)
                excluded.setdefault(b, reason)
            rows += measure(path, where, depths, backends, args)
    finally:
        if tmpfs_created:
            Path(args.tmpfs_file).unlink(missing_ok=True)
    feats = []
    if "io_uring" not in excluded and "io_uring" in names:
        for dim in dims:
            for qd in depths:
                if qd < 16:
                    continue
                for aligned in ((True, False) if dim * 4 % PAGE == 0 else (True,)):
                    feats.append(bench_features(args.file, qd, args.seconds,
                                                args.feature_rows, dim, "io_uring", args.seed,
                                                aligned))

    print(f"\n4 KiB random reads, batches of {args.batch} random pages; disk: {args.file} "
          f"({size >> 20} MiB, dropped from the page cache before each run); tmpfs: "
          f"{args.tmpfs_file} ({tmpfs_size >> 20} MiB); medians of {args.repeat} interleaved "
          f"rounds of {args.seconds:g} s; ratios are medians of per-round ratios\n")
    print("| file | backend | QD | IOPS | fio IOPS | ours/fio | CPU µs/read | fio CPU µs/read "
          "| CPU ours/fio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")

    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    for r in rows:
        print(f"| {r['file']} | {r['label']} | {r['queue_depth']} | {r['iops']:,.0f} | "
              f"{f(r['fio_iops'], ',.0f')} | {f(r['ratio_vs_fio'], '.2f')} | "
              f"{r['cpu_us_per_op']:.2f} | {f(r['fio_cpu_us_per_op'], '.2f')} | "
              f"{f(r['cpu_vs_fio'], '.2f')} |")
    for b, reason in excluded.items():
        print(f"\n{b}: left out ({reason})")
    if feats:
        print(f"\nDirectFeatures.read(ids, out=...), batches of {args.feature_rows} random "
              f"float32 rows, disk file\n")
        print("| backend | dim | read into | QD | rows/s | row MB/s | read IOPS | disk MB/s "
              "| ms/batch |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for ft in feats:
            print(f"| {ft['backend']} | {ft['dim']} | {ft['target']} | {ft['queue_depth']} | "
                  f"{ft['rows_per_s']:.0f} | "
                  f"{ft['row_mb_per_s']:.1f} | {ft['iops']:.0f} | {ft['disk_mb_per_s']:.1f} | "
                  f"{ft['ms_per_batch']:.1f} |")
    report = {"command": " ".join([sys.executable, *sys.argv]),
              "file": str(args.file), "size": size, "tmpfs_file": args.tmpfs_file,
              "tmpfs_size": tmpfs_size, "batch_pages": args.batch, "repeat": args.repeat,
              "seconds": args.seconds, "excluded": excluded,
              "native_vs_fio": by_depth(rows, "disk", "ratio_vs_fio"),
              "native_vs_fio_tmpfs": by_depth(rows, "tmpfs", "ratio_vs_fio"),
              "native_cpu_vs_fio_tmpfs": by_depth(rows, "tmpfs", "cpu_vs_fio"),
              "random_reads": rows, "features": feats}
    print("\nnative_vs_fio (disk): " + json.dumps(report["native_vs_fio"]))
    print("native_cpu_vs_fio_tmpfs: " + json.dumps(report["native_cpu_vs_fio_tmpfs"]))
    if args.report:
        H.write_report(args.report, "reader", report, spec={"file": args.file, "size": args.size},
                       data_path=args.file, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
