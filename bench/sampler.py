"""Sampling throughput with the neighbor cache at 0%, 25% and 100% of the
adjacency, the rest read with O_DIRECT (issue 3), beside an in-memory array.

    python -m bench sampler --nodes 4000000 --edges 60000000 --report bench_out/sampler.json

Builds (once, under --work) a power-law graph, samples the same batches from
every source, checks they are bit-identical, and prints batches/s and edges/s.
The page cache is dropped before each O_DIRECT run so the numbers come from
the disk; the reader's backend (``auto``: the native io_uring engine where it
works) is printed and reported.
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numba
import numpy as np

from ooc import open_dataset, write_dataset
from ooc.caches.neighbor_cache import CachedNeighbors, build_neighbor_cache, full_cache_bytes
from ooc.sampling import NeighborSampler
from ooc.storage import csc_from_edges
from ooc.storage.direct import DirectReader
from ooc.storage.neighbors import DirectNeighbors
from ooc.storage.pagecache import drop_page_cache

from . import harness as H


def power_law_graph(path: Path, n: int, e: int, seed: int = 0) -> None:
    """Power-law in- and out-degrees: skewed ids, then a random relabel."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    src = perm[(n * rng.random(e) ** 2.2).astype(np.int64)]
    dst = perm[(n * rng.random(e) ** 1.8).astype(np.int64)]
    indptr, indices = csc_from_edges(src, dst, n)
    del src, dst
    write_dataset(path, indptr, indices.astype(np.int32), np.zeros((n, 1), np.float32),
                  labels=np.zeros(n, np.int64), num_classes=2,
                  train_idx=rng.choice(n, n // 10, replace=False))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench sampler",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4_000_000)
    ap.add_argument("--edges", type=int, default=60_000_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batches", type=int, default=128)
    ap.add_argument("--queue-depth", type=int, default=64)
    ap.add_argument("--work", default="bench_out/sampler")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    path = Path(a.work) / f"pl_{a.nodes}_{a.edges}"
    if not path.exists():
        t = time.time()
        power_law_graph(path, a.nodes, a.edges)
        print(f"generated {path} in {time.time() - t:.1f}s")
    ds = open_dataset(path)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    batches, seeds = (x[:a.batches] for x in H.epoch_plan(ds.train_idx, a.batch_size, 0, 0))
    indices_mem = np.fromfile(ds.file("indices.bin"), dtype=ds.index_dtype, count=ds.num_edges)
    NeighborSampler(ds.indptr, indices_mem, fanouts).sample_many(batches[:2], seeds[:2])  # JIT
    outdeg = np.bincount(indices_mem, minlength=ds.num_nodes)
    full = full_cache_bytes(ds.indptr, ds.index_dtype.itemsize)
    rows = []

    def run(name, src, extra=None):
        s = NeighborSampler(ds.indptr, src, fanouts, group_size=64)
        t = time.perf_counter()
        out = s.sample_many(batches, seeds)
        dt = time.perf_counter() - t
        nodes = sum(b.num_nodes for b in out)
        edges = sum(b.num_edges for b in out)
        row = {"source": name, "batches_per_s": len(out) / dt, "edges_per_s": edges / dt,
               "nodes_per_batch": nodes / len(out), "touched_fraction": nodes / len(out) / ds.num_nodes,
               **(extra() if extra else {})}
        rows.append(row)
        print(f"{name:26s} {row['batches_per_s']:8.1f} batches/s {edges / dt / 1e6:7.2f} M edges/s "
              f"({row['touched_fraction']:.2%} of N per batch) "
              + " ".join(f"{k}={v}" for k, v in row.items() if k not in
                         ("source", "batches_per_s", "edges_per_s", "nodes_per_batch", "touched_fraction")))
        return out

    ref = run("in-memory array", indices_mem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = DirectReader(ds.file("indices.bin"), queue_depth=a.queue_depth)
    print(f"O_DIRECT reads of indices.bin: {reader.backend_label}, queue depth {a.queue_depth}")
    for frac in (0.0, 0.25, 1.0):
        cache = build_neighbor_cache(ds.indptr, indices_mem, int(frac * full),
                                     out_degrees=outdeg)
        drop_page_cache(ds.file("indices.bin"))
        d = DirectNeighbors(ds.file("indices.bin"), ds.indptr, reader=reader)
        c = CachedNeighbors(cache, d)
        got = run(f"cache {frac:.0%} + O_DIRECT", c,
                  lambda c=c, d=d, cache=cache: {"hit_ratio": round(c.stats()["neighbor_cache_hit_ratio"], 3),
                           "pages_read": int(d.pages_read), "submissions": int(d.submissions),
                           "cache_mib": round(cache.nbytes / 2**20, 1)})
        assert all(x.equals(y) for x, y in zip(got, ref, strict=True)), "sources disagree: a bug"
    print("all sources gave bit-identical batches")
    rep = {"threads": numba.get_num_threads(), "reader_backend": reader.backend,
           "dataset": {"nodes": ds.num_nodes, "edges": ds.num_edges}, "rows": rows}
    print("\n" + table(rep))
    if a.report:
        H.write_report(a.report, "sampler", rep, spec={"nodes": a.nodes, "edges": a.edges},
                       data_path=path, args=a)


def table(rep: dict) -> str:
    """Per neighbour source: batches and edges a second, the neighbor cache's hit ratio."""
    return H.markdown(["source", "batches/s", "M edges/s", "hit ratio"],
                      [[r["source"], f"{r['batches_per_s']:.1f}", f"{r['edges_per_s'] / 1e6:.2f}",
                        r.get("hit_ratio", "")] for r in rep["rows"]], ["l"] * 4)


if __name__ == "__main__":
    main()
