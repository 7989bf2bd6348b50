"""Pages read for small rows: row- vs page-granular Belady, and the node order, side by side.

    python -m bench page_cache --nodes 3000000 --feature-dim 128 --community-size 128 \\
        --report bench_out/page_cache.json

Rows smaller than a page (128 float32 = 512 B: 8 rows a page) are read a page at a time, so
what a feature cache saves is pages, not rows. For the same sampled batches (ooc's sampler,
the first ``--batches`` batches of epoch 1) and the same cache bytes, this counts the 4 KiB
pages each policy reads from ``features.bin``:

- ``row-belady``: the Belady cache of rows (changesets with the cache carried across
  superbatches); a batch reads the distinct pages of its missed rows;
- ``row-belady + page-mates``: ``BeladyCache(page_mates=0.25)``: the same, and each step
  also inserts rows that share a page with the batch's misses and are used later in the
  superbatch (no extra page read; :mod:`ooc.caches.changesets`);
- ``page-belady``: Belady over pages (a batch's trace is the distinct pages it touches; the
  cache holds ``bytes / 4096`` pages), so a page read serves every row on it;
- ``static``: the degree-ordered static row cache (PaGraph);

under the dataset's own node order and under :func:`ooc.storage.reorder.locality_order`
(size-capped label propagation). ``read_efficiency`` = bytes of missed rows / bytes of
pages read. With ``--data`` an existing dataset is used; otherwise a synthetic graph with
small communities hidden by an id permutation is generated (``--nodes`` etc.).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ooc import open_dataset
from ooc.caches.changesets import MATE_FRACTION, precompute_changesets
from ooc.sampling import NeighborSampler
from ooc.storage.layout import PAGE
from ooc.storage.reorder import OrderStats, locality_order

from . import data as D
from . import harness as H


def _rows_read_pages(trace: list[np.ndarray], rank: np.ndarray, rpp: int, cached) -> tuple[int, int]:
    """(missed rows, pages read) when batch i misses ``t[~cached(i, t)]``."""
    miss_rows = pages = 0
    for i, t in enumerate(trace):
        miss = t[~cached(i, t)]
        miss_rows += len(miss)
        pages += int(np.unique(rank[miss] // rpp).shape[0])
    return miss_rows, pages


def row_belady(trace, n, capacity_rows, rank, rpp, superbatch, mates=0.0):
    """Row-granular Belady over superbatches of ``superbatch`` batches (the cache carried);
    with ``mates`` > 0, page-mates up to that fraction of a batch."""
    incache = np.zeros(n, dtype=bool)
    total_miss = total_pages = 0
    pages = (lambda ids: rank[ids] // rpp) if mates else None
    for s in range(0, len(trace), superbatch):
        part = trace[s:s + superbatch]
        cs = precompute_changesets(part, n, capacity_rows, cached=np.flatnonzero(incache),
                                   keep_unused=True, pages=pages, mate_fraction=mates)
        incache[:] = False
        incache[cs.init_ids] = True

        def cached(i, t, cs=cs):
            hit = incache[t]
            step = cs.step(i)
            incache[step.out_ids] = False
            incache[step.in_ids] = True
            return hit
        m, p = _rows_read_pages(part, rank, rpp, cached)
        total_miss, total_pages = total_miss + m, total_pages + p
    return total_miss, total_pages


def page_belady(trace, n, capacity_pages, rank, rpp, superbatch):
    """Page-granular Belady: a batch's trace is its distinct pages."""
    npages = n // rpp + 1
    ptrace = [np.unique(rank[t] // rpp) for t in trace]
    cached_pages = np.zeros(0, np.int64)
    pages = 0
    miss_rows = 0
    for s in range(0, len(ptrace), superbatch):
        part = ptrace[s:s + superbatch]
        cs = precompute_changesets(part, npages, capacity_pages, cached=cached_pages,
                                   keep_unused=True)
        incache = np.zeros(npages, dtype=bool)
        incache[cs.init_ids] = True
        for i, (pt, t) in enumerate(zip(part, trace[s:s + superbatch], strict=True)):
            hit = incache[pt]
            pages += int((~hit).sum())
            miss_rows += int((~incache[rank[t] // rpp]).sum())
            step = cs.step(i)
            incache[step.out_ids] = False
            incache[step.in_ids] = True
        cached_pages = np.flatnonzero(incache)
    return miss_rows, pages


def static_rows(trace, n, capacity_rows, rank, rpp, hot):
    incache = np.zeros(n, dtype=bool)
    incache[hot[:capacity_rows]] = True
    return _rows_read_pages(trace, rank, rpp, lambda i, t: incache[t])


def _spec(args) -> dict:
    return dict(nodes=args.nodes, avg_degree=args.avg_degree, feature_dim=args.feature_dim,
                classes=32, community_size=args.community_size,
                train_fraction=args.train_fraction)


def _dataset(args) -> Path:
    if args.data:
        return Path(args.data)
    out = H.REPO / "bench_tmp" / (f"page-cache-{args.nodes}-{args.feature_dim}-"
                                  f"{args.community_size}-{args.avg_degree:g}")
    path = D.synthetic(_spec(args), out)
    if path is None:
        raise SystemExit(2)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench page_cache",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="an existing dataset (default: generate one)")
    ap.add_argument("--nodes", type=int, default=3_000_000)
    ap.add_argument("--avg-degree", type=float, default=10)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--community-size", type=int, default=128)
    ap.add_argument("--train-fraction", type=float, default=0.01)
    ap.add_argument("--fanouts", default="10,10")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=32)
    ap.add_argument("--superbatch", type=int, default=16)
    ap.add_argument("--cache-fractions", default="0.05,0.1,0.2",
                    help="cache bytes as fractions of the feature table")
    ap.add_argument("--cap", type=int, default=1024, help="largest group of the locality order")
    ap.add_argument("--report", type=Path)
    args = ap.parse_args(argv)
    ds = open_dataset(_dataset(args))
    n, rpp = ds.num_nodes, ds.layout.rows_per_page
    if not rpp or rpp < 2:
        ap.error(f"rows of {ds.layout.row_bytes} B do not share pages: nothing to compare")
    indptr = np.asarray(ds.indptr)
    indices = np.fromfile(ds.file("indices.bin"), dtype=ds.index_dtype, count=ds.num_edges)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    seeds, bseeds = H.epoch_plan(ds.train_idx, args.batch_size, 0, 1)
    batches = NeighborSampler(indptr, indices, fanouts).sample_many(
        seeds[:args.batches], bseeds[:args.batches])
    trace = [np.asarray(b.node_ids, np.int64) for b in batches]
    rows = sum(len(t) for t in trace)
    t0 = time.perf_counter()
    st = OrderStats(0, [], 0, 0)
    order = locality_order(indptr, indices, cap=args.cap, stats=st)
    order_s = time.perf_counter() - t0
    locality = np.empty(n, np.int64)
    locality[order] = np.arange(n)
    out_deg = np.bincount(indices, minlength=n)
    hot = np.argsort(-out_deg, kind="stable")
    del indices
    report: dict = {"dataset": str(ds.path), "nodes": n, "rows_per_page": rpp,
                    "row_bytes": ds.layout.row_bytes, "batches": len(trace),
                    "rows_per_batch": rows / len(trace), "batch_node_fraction": rows / len(trace) / n,
                    "superbatch": args.superbatch,
                    "locality_order": {"seconds": round(order_s, 2), "sweeps": st.sweeps,
                                       "moved": st.moved, "groups": st.groups,
                                       "largest_group": st.largest_group},
                    "results": []}
    print(f"bench_page_cache: {n:,} nodes, {rpp} rows a page, {len(trace)} batches of "
          f"{rows / len(trace):,.0f} rows ({rows / len(trace) / n:.2%} of the nodes); locality "
          f"order in {order_s:.1f} s ({st.groups:,} groups, largest {st.largest_group})")
    print("| order | cache | policy | missed rows | pages read | pages per missed row | "
          "read_efficiency |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for oname, rank in (("input", np.arange(n, dtype=np.int64)), ("locality", locality)):
        touched = sum(int(np.unique(rank[t] // rpp).shape[0]) for t in trace)
        for frac in (float(f) for f in args.cache_fractions.split(",")):
            cap_rows = int(frac * n)
            runs = {"row-belady": row_belady(trace, n, cap_rows, rank, rpp, args.superbatch),
                    "row-belady + page-mates": row_belady(trace, n, cap_rows, rank, rpp,
                                                          args.superbatch, MATE_FRACTION),
                    "page-belady": page_belady(trace, n, cap_rows // rpp, rank, rpp,
                                               args.superbatch),
                    "static": static_rows(trace, n, cap_rows, rank, rpp, hot)}
            for policy, (miss, pages) in runs.items():
                eff = miss * ds.layout.row_bytes / max(1, pages * PAGE)
                report["results"].append({"order": oname, "cache_fraction": frac,
                                          "policy": policy, "missed_rows": miss,
                                          "pages_read": pages, "pages_touched": touched,
                                          "read_efficiency": round(eff, 4)})
                print(f"| {oname} | {frac:.0%} | {policy} | {miss:,} | {pages:,} | "
                      f"{pages / max(miss, 1):.3f} | {eff:.3f} |")
    if args.report:
        H.write_report(args.report, "page_cache", report,
                       spec=_spec(args) if not args.data else {"data": args.data},
                       data_path=ds.path, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
