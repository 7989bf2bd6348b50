"""Benchmark: layer-wise vs sample-wise full-neighbour inference, and cache orders.

    python -m bench inference [--nodes 100000] [--avg-degree 10] [--dim 64]
        [--layers 2 3] [--out bench_out/inference.json]

Graph: a synthetic power-law-ish graph with community structure and shuffled
node ids (so node id order carries no locality): edge targets and sources are
drawn with skewed (power-law-like) popularity, ``--p-in`` (90%) inside the
target's community. Model: GraphSAGE (untrained, fixed seed), hidden = dim.

1. Layer-wise (``ooc.executor.layerwise_inference``) against sample-wise
   inference: every batch of ``--batch`` targets builds its full L-hop
   in-neighbourhood (no sampling, NeighborLoader layout, trimmed per layer as
   PyG's trim_to_layer does) and runs the whole model on it; features are read
   through the same reader. Sample-wise runs on an evenly spread subset of the
   batches until ``--samplewise-budget`` seconds are spent and is extrapolated
   to all batches (the table says how many ran). Outputs of both are checked
   equal on the batches that ran.
2. Previous-layer chunk cache hit ratios for the processing orders (natural =
   shuffled ids, DS = degree, PS = partition then id, PDS = partition then
   degree), with Belady, LRU and FIFO, at a cache of ``--cache-frac`` of the
   chunks; the partition is SPRING's (``ooc.partition``) when it runs, else
   the generator's communities grouped into ``--parts`` parts.

``--compare-tree DIR`` instead times layer-wise inference alone, this checkout
against another one (e.g. an older commit's ``git worktree``), side by side:
``--repeat`` rounds after one warm-up round (numba caches, page cache), each
running both trees once in a child process (order alternating), on the same
dataset and partition; the table gives the medians and the ratio other / this.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ooc.caches.chunk_cache import simulate
from ooc.executor.inference._kernels import access_plan
from ooc.executor.inference.layerwise import _feature_reader, layerwise_inference, read_embeddings
from ooc.executor.training.models import build_model
from ooc.storage import csc_from_edges, open_dataset, write_dataset
from ooc.storage.features import read_counted

from . import harness as H


def make_graph(n: int, avg_degree: float, dim: int, comm_size: int, p_in: float = 0.9,
               seed: int = 0):
    """Undirected power-law-ish graph with communities, ids shuffled.

    Each of ``n * avg_degree / 2`` edges picks a community uniformly and an
    endpoint in it with a skewed rank (``size * u**2.5``); the other endpoint
    is in the same community (skewed again) with probability ``p_in``, else a
    global hub (``n * u**3`` over a random popularity order). Both directions
    are stored.
    """
    rng = np.random.default_rng(seed)
    e = int(n * avg_degree / 2)
    ncomm = max(1, n // comm_size)
    comm_of_pos = np.minimum(np.arange(n) // comm_size, ncomm - 1)
    starts = np.searchsorted(comm_of_pos, np.arange(ncomm))
    sizes = np.diff(np.append(starts, n))
    c = rng.integers(0, ncomm, e)
    a = starts[c] + (sizes[c] * rng.random(e) ** 2.5).astype(np.int64)
    b_in = starts[c] + (sizes[c] * rng.random(e) ** 2.5).astype(np.int64)
    hubs = rng.permutation(n)[(n * rng.random(e) ** 3).astype(np.int64)]
    b = np.where(rng.random(e) < p_in, b_in, hubs)
    relabel = rng.permutation(n)            # shuffle ids: node id order has no locality
    src = relabel[np.concatenate([a, b])]
    dst = relabel[np.concatenate([b, a])]
    community = np.empty(n, dtype=np.int64)
    community[relabel] = comm_of_pos
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = community % 10
    return indptr, indices, x, y, community


# ------------------------------------------------------------------ sample-wise
def gather_slices(indptr, indices, nodes):
    starts, ends = indptr[nodes], indptr[nodes + 1]
    lens = ends - starts
    tot = int(lens.sum())
    off = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(tot)
    return np.asarray(indices[off], dtype=np.int64), np.repeat(nodes, lens)


def samplewise_batch(ds, model, reader, targets, L, local):
    """Full L-hop in-neighbourhood of ``targets``, model on it (trimmed per layer)."""
    indptr, indices = ds.indptr, ds.indices
    hops = [targets]
    local[targets] = np.arange(targets.shape[0])
    nn = targets.shape[0]
    srcs, dsts, ne = [], [], []
    for k in range(L):
        nbr, dst = gather_slices(indptr, indices, hops[k])
        new = np.unique(nbr[local[nbr] < 0])
        local[new] = np.arange(nn, nn + new.shape[0])
        nn += new.shape[0]
        hops.append(new)
        srcs.append(local[nbr])
        dsts.append(local[dst])
        ne.append(nbr.shape[0])
    nodes = np.concatenate(hops)
    local[nodes] = -1
    o = np.argsort(nodes)
    x = np.empty((nodes.shape[0], ds.feature_dim), dtype=np.float32)
    x[o], nbytes = read_counted(reader, nodes[o], ds.layout.row_bytes)
    ei = torch.from_numpy(np.stack([np.concatenate(srcs), np.concatenate(dsts)]))
    with torch.inference_mode():
        h = model(torch.from_numpy(x), ei, [len(h_) for h_ in hops], ne)
    return h[:targets.shape[0]].numpy(), nbytes, nodes.shape[0], int(sum(ne))


def run_samplewise(ds, model, L, batch, budget_s, reader):
    n = ds.num_nodes
    nb = -(-n // batch)
    local = np.full(n, -1, dtype=np.int64)
    order = np.linspace(0, nb - 1, num=min(nb, 64)).astype(np.int64)
    order = np.unique(order)
    ran, t_tot, b_tot, nodes_tot, edges_tot, outs = 0, 0.0, 0, 0, 0, {}
    for bi in order:
        t0 = time.perf_counter()
        tg = np.arange(bi * batch, min(n, (bi + 1) * batch), dtype=np.int64)
        h, nbytes, nn, ne = samplewise_batch(ds, model, reader, tg, L, local)
        t_tot += time.perf_counter() - t0
        b_tot += nbytes
        nodes_tot += nn
        edges_tot += ne
        outs[int(bi)] = h
        ran += 1
        if t_tot > budget_s and ran >= 2:
            break
    scale = nb / ran
    return {"batches_total": nb, "batches_run": ran, "time_s_run": t_tot,
            "time_s": t_tot * scale, "bytes_read": int(b_tot * scale),
            "nodes_per_batch": nodes_tot / ran, "edges_per_batch": edges_tot / ran}, outs


# ------------------------------------------------------------------ two trees
#: run in a child process whose PYTHONPATH is a checkout's root: one layer-wise run of its code
CHILD = r"""
import json, sys, time
data, owner, out, L, dim, classes, chunk_rows, budget = sys.argv[1:]
import numpy as np, torch
torch.set_num_threads(1)
from ooc.executor.inference.layerwise import layerwise_inference
from ooc.executor.training.models import build_model
torch.manual_seed(0)
model = build_model("sage", int(dim), int(dim), int(classes), num_layers=int(L)).eval()
rep = layerwise_inference(data, model, out, memory_budget=budget, chunk_rows=int(chunk_rows),
                          order=np.load(owner), overwrite=True)
print(json.dumps({"time_s": rep["time_s"], "peak_rss": rep["peak_rss_bytes"],
                  "bytes_read": rep["bytes_read"],
                  "layers": [la["time_s"] for la in rep["layers"]]}))
"""


def compare_trees(args, dpath: Path, owner_path: Path, work: Path) -> dict:
    """Median layer-wise time of this checkout and ``args.compare_tree``, run alternately."""
    trees = {"this": str(Path(__file__).resolve().parents[1]),
             "other": str(Path(args.compare_tree).resolve())}
    rows = []
    for r in range(-1, args.repeat):  # round -1 warms up (numba caches, page cache), not kept
        for name in (("this", "other") if r % 2 == 0 else ("other", "this")):
            for L in args.layers:
                out = work / f"cmp_{name}_L{L}.zarr"
                p = subprocess.run([sys.executable, "-c", CHILD, str(dpath),
                                    str(owner_path), str(out), str(L), str(args.dim),
                                    str(args.classes), str(args.chunk_rows),
                                    str(args.memory_budget)],
                                   capture_output=True, text=True, check=True,
                                   env=dict(os.environ, PYTHONPATH=trees[name]))
                res = json.loads(p.stdout.strip().splitlines()[-1])
                if r >= 0:
                    rows.append({"round": r, "tree": name, "L": L, **res})
                shutil.rmtree(out, ignore_errors=True)
    med = {L: {k: statistics.median(x["time_s"] for x in rows if x["tree"] == k and x["L"] == L)
               for k in trees} for L in args.layers}
    lines = [f"Layer-wise inference, {args.repeat} rounds, medians (this = "
             f"{trees['this']}, other = {trees['other']})", "",
             "| L | this | other | other / this |", "|---|---|---|---|"]
    for L, m in med.items():
        lines.append(f"| {L} | {m['this']:.2f} s | {m['other']:.2f} s | "
                     f"{m['other'] / m['this']:.2f} |")
    return {"trees": trees, "runs": rows, "median_s": med, "table": "\n".join(lines)}


# ------------------------------------------------------------------ cache orders
def order_perms(ds, owners: dict):
    deg = ds.in_degrees()
    n = ds.num_nodes
    perms = {"natural (shuffled ids)": np.arange(n, dtype=np.int64),
             "DS (degree)": np.argsort(-deg, kind="stable").astype(np.int64)}
    for name, owner in owners.items():
        perms[f"PS ({name})"] = np.argsort(owner, kind="stable").astype(np.int64)
        perms[f"PDS ({name})"] = np.lexsort((-deg, owner)).astype(np.int64)
    return perms


def cache_study(ds, perms, chunk_rows, block_rows, cache_frac):
    n = ds.num_nodes
    nch = -(-n // chunk_rows)
    cap = max(1, int(round(cache_frac * nch)))
    rows = []
    indices = np.asarray(ds.indices)
    for name, perm in perms.items():
        rowof = np.empty(n, dtype=np.int64)
        rowof[perm] = np.arange(n)
        starts = np.union1d(np.arange(0, n, block_rows), np.arange(0, n, chunk_rows))
        starts = np.append(starts, n).astype(np.int64)
        ptr, seq = access_plan(ds.indptr, indices, perm, rowof, starts, chunk_rows, nch, True)
        r = {"order": name, "chunks": nch, "capacity": cap, "blocks": int(starts.shape[0] - 1),
             "accesses": int(seq.shape[0])}
        for pol in ("belady", "lru", "fifo"):
            s = simulate(seq, cap, pol, num_keys=nch)
            r[pol] = s["hit_ratio"]
            r[pol + "_reads"] = s["misses"]
        _, cyc = access_plan(ds.indptr, indices, perm, rowof, starts, chunk_rows, nch, False)
        r["lru_sorted"] = simulate(cyc, cap, "lru", num_keys=nch)["hit_ratio"]
        rows.append(r)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench inference",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--comm-size", type=int, default=500)
    p.add_argument("--p-in", type=float, default=0.9, help="share of intra-community edges")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both methods)")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 3])
    p.add_argument("--batch", type=int, default=1024, help="sample-wise targets per batch")
    p.add_argument("--chunk-rows", type=int, default=4096, help="layer-wise run")
    p.add_argument("--block-rows", type=int, default=None, help="layer-wise run (default: budget)")
    p.add_argument("--study-chunk-rows", type=int, default=256, help="cache study")
    p.add_argument("--study-block-rows", type=int, default=256, help="cache study")
    p.add_argument("--cache-frac", type=float, default=0.1)
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--memory-budget", default="2GiB")
    p.add_argument("--samplewise-budget", type=float, default=60.0, help="seconds per L")
    p.add_argument("--workdir", default=None)
    p.add_argument("--compare-tree", default=None,
                   help="another checkout: time layer-wise inference of both, side by side")
    p.add_argument("--repeat", type=int, default=5, help="rounds of --compare-tree")
    p.add_argument("--out", default="bench_out/inference.json")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_inference_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    indptr, indices, x, y, community = make_graph(args.nodes, args.avg_degree, args.dim,
                                                  args.comm_size, args.p_in)
    dpath = work / "graph"
    if not dpath.exists():
        write_dataset(dpath, indptr, indices, x, labels=y, num_classes=args.classes,
                      test_idx=np.arange(0, args.nodes, 10))
    ds = open_dataset(dpath)
    gen_s = time.perf_counter() - t0
    del indptr, indices, x
    print(f"graph: {ds.num_nodes} nodes, {ds.num_edges} edges, dim {args.dim} ({gen_s:.1f}s)",
          file=sys.stderr)

    # partitions: SPRING (ooc.partition) when it runs, and the generator's
    # communities grouped into parts (what an ideal partitioner would find)
    ncomm = community.max() + 1
    owners = {"communities": (community * args.parts) // ncomm}
    try:
        from ooc.partition import partition

        a = partition(ds, args.parts, "spring")
        owners = {"SPRING": np.asarray(a.owner, dtype=np.int64), **owners}
    except Exception as e:  # noqa: BLE001
        print(f"SPRING unavailable ({type(e).__name__}: {e})", file=sys.stderr)
    part_name, owner = next(iter(owners.items()))
    part_src = f"{', '.join(owners)}; {args.parts} parts; the layer-wise run uses {part_name}"
    if args.compare_tree:
        np.save(work / "owner.npy", owner)
        res = compare_trees(args, dpath, work / "owner.npy", work)
        res["partition"] = part_src
        print(res["table"])
        H.write_report(args.out, "inference", res, args=args)
        return 0

    res = {"graph": {"nodes": ds.num_nodes, "edges": ds.num_edges, "dim": args.dim,
                     "avg_degree": args.avg_degree, "comm_size": args.comm_size,
                     "max_in_degree": int(ds.in_degrees().max())},
           "partition": part_src, "args": vars(args), "compare": [], "cache": []}

    # 1. layer-wise vs sample-wise
    for L in args.layers:
        torch.manual_seed(0)
        model = build_model("sage", args.dim, args.dim, args.classes, num_layers=L).eval()
        out = work / f"lw_L{L}.zarr"
        shutil.rmtree(out, ignore_errors=True)
        rep = layerwise_inference(ds, model, out, memory_budget=args.memory_budget,
                                  chunk_rows=args.chunk_rows, order=owner,
                                  block_rows=args.block_rows)
        reader, rname = _feature_reader(ds, "auto")
        sw, outs = run_samplewise(ds, model, L, args.batch, args.samplewise_budget, reader)
        hl = None
        maxdiff = 0.0
        for bi, h in outs.items():
            ids = np.arange(bi * args.batch, min(ds.num_nodes, (bi + 1) * args.batch))
            hl = read_embeddings(out, f"h{L}", ids)
            maxdiff = max(maxdiff, float(np.abs(hl - h).max()))
        row = {"L": L, "layerwise_s": rep["time_s"], "layerwise_bytes": rep["bytes_read"],
               "layerwise_peak_rss": rep["peak_rss_bytes"],
               "layerwise_hit_ratio": rep["cache_hit_ratio"], "samplewise": sw,
               "speedup": sw["time_s"] / rep["time_s"],
               "bytes_ratio": sw["bytes_read"] / max(rep["bytes_read"], 1),
               "max_abs_diff": maxdiff, "reader": rname, "layerwise_report": rep}
        res["compare"].append(row)
        print(f"L={L}: layer-wise {rep['time_s']:.1f}s, sample-wise {sw['time_s']:.1f}s "
              f"(from {sw['batches_run']}/{sw['batches_total']} batches), "
              f"max diff {maxdiff:.2e}", file=sys.stderr)

    # 2. cache orders
    res["cache"] = cache_study(ds, order_perms(ds, owners), args.study_chunk_rows,
                               args.study_block_rows, args.cache_frac)

    gb = 1 << 30
    lines = ["| L | layer-wise time | sample-wise time | speed-up | layer-wise read | "
             "sample-wise read | read ratio | sample-wise nodes/batch | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["compare"]:
        sw = r["samplewise"]
        lines.append(f"| {r['L']} | {r['layerwise_s']:.1f} s | {sw['time_s']:.0f} s "
                     f"({sw['batches_run']}/{sw['batches_total']} batches run) | "
                     f"{r['speedup']:.0f}x | {r['layerwise_bytes'] / gb:.2f} GiB | "
                     f"{sw['bytes_read'] / gb:.2f} GiB | {r['bytes_ratio']:.0f}x | "
                     f"{sw['nodes_per_batch']:.0f} | {r['max_abs_diff']:.1e} |")
    lines += ["", f"Previous-layer cache, chunk {args.study_chunk_rows} rows, block "
              f"{args.study_block_rows} "
              f"targets, capacity {res['cache'][0]['capacity']} of {res['cache'][0]['chunks']} "
              f"chunks; partition: {part_src}", "",
              "| order | chunk accesses | Belady hit | LRU hit | FIFO hit | LRU hit, ascending scan | "
              "chunk reads (Belady) | chunk reads (LRU) |", "|---|---|---|---|---|---|---|---|"]
    for r in res["cache"]:
        lines.append(f"| {r['order']} | {r['accesses']} | {r['belady']:.1%} | {r['lru']:.1%} | "
                     f"{r['fifo']:.1%} | {r['lru_sorted']:.1%} | {r['belady_reads']} | "
                     f"{r['lru_reads']} |")
    table = "\n".join(lines)
    print(table)
    res["table"] = table
    H.write_report(args.out, "inference", res, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
