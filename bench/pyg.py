"""PyG's own loader over ``ooc.pyg`` against ``ooc.NodeLoader``: the data path alone.

    python -m bench pyg --report bench_out/pyg.json          # bench.py's dataset, 1 GiB
    python -m bench pyg --topology --report bench_out/pyg_topology.json

Default: on ``python -m bench modes``'s dataset and budget, one child process per
loader, each in its own memory cgroup of the budget with the dataset dropped
from the page cache first, ``--rounds`` rounds interleaved (order rotated),
``--epochs`` loader-only epochs (every ``Data`` built, no model); the table
gives medians of the last epoch:

* ``pyg+ooc.pyg``: ``torch_geometric.loader.NeighborLoader`` over
  ``ooc.pyg.remote_backend(preset="ooc", memory_budget=...)`` with its batch plan;
* ``ooc.NodeLoader``: the same batches from ``ooc.NodeLoader(preset="ooc")``;
* ``baseline``: ``ooc.NodeLoader(preset="baseline")`` (memmaps, page cache).

``--topology``: the topology stays on disk. A graph whose ``indices.bin`` is
at least ``--min-indices`` (default 1 GiB; generated once) is loaded through
PyG's ``NeighborLoader`` over ``ooc.pyg`` for ``--batches`` batches, with no
cgroup; the child's peak RSS (VmHWM) is compared with the size of
``indices.bin``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ooc.core.sizes import format_size
from ooc.executor.sizing import memcg
from ooc.storage.pagecache import drop_page_cache

from . import data as D
from . import harness as H
from .modes import add_run_args, open_bench_dataset

LOADERS = ("pyg+ooc.pyg", "ooc.NodeLoader", "baseline")
log = memcg.log


# ---------------------------------------------------------------- child side
def _loader(kind: str, data: str, a) -> tuple[object, object]:
    """(the iterable of one epoch, the object whose close() ends it)."""
    import ooc

    fanouts = [int(f) for f in a.fanouts.split(",")]
    kw = dict(num_neighbors=fanouts, input_nodes="train", batch_size=a.batch_size, shuffle=True,
              seed=a.seed, memory_budget=a.budget, queue_depth=a.queue_depth)
    if kind == "pyg+ooc.pyg":
        from torch_geometric.loader import NeighborLoader

        import ooc.pyg

        fs, gs, sampler = ooc.pyg.remote_backend(data, preset="ooc", **kw)
        loader = NeighborLoader((fs, gs), num_neighbors=fanouts, neighbor_sampler=sampler,
                                **sampler.loader_kwargs())
        return loader, sampler
    loader = ooc.NodeLoader(data, preset="ooc" if kind == "ooc.NodeLoader" else "baseline",
                            **kw)
    return loader, loader


def child(kind: str, data: str, a) -> None:
    from ooc.core.memory import peak_rss_bytes

    loader, owner = _loader(kind, data, a)
    epochs = []
    for _ in range(a.epochs):
        t0 = time.perf_counter()
        n = sum(int(d.batch_size) for d in loader)
        epochs.append({"epoch_s": time.perf_counter() - t0, "seeds": n})
    stats = owner.stats() if hasattr(owner, "stats") else {}
    owner.close()
    print("RESULT " + json.dumps({"kind": kind, "epochs": epochs, "stats": stats,
                                  "peak_rss_bytes": peak_rss_bytes()}, default=str))


def topology_child(data: str, a) -> None:
    from torch_geometric.loader import NeighborLoader

    import ooc.pyg
    from ooc.core.memory import peak_rss_bytes

    fanouts = [int(f) for f in a.fanouts.split(",")]
    fs, gs, sampler = ooc.pyg.remote_backend(data, num_neighbors=fanouts, input_nodes="train",
                                             batch_size=a.batch_size, shuffle=True,
                                             preset="ooc", queue_depth=a.queue_depth)
    loader = NeighborLoader((fs, gs), num_neighbors=fanouts, neighbor_sampler=sampler,
                            **sampler.loader_kwargs())
    t0 = time.perf_counter()
    nodes = batches = 0
    for d in loader:
        nodes += int(d.num_nodes)
        batches += 1
        if batches >= a.batches:
            break
    secs = time.perf_counter() - t0
    sampler.close()
    print("RESULT " + json.dumps({"batches": batches, "nodes": nodes, "seconds": secs,
                                  "peak_rss_bytes": peak_rss_bytes()}))


# --------------------------------------------------------------- parent side
def _result(run: dict) -> dict | None:
    for line in reversed(run["lines"]):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


def _child_argv(a, extra: list[str]) -> list[str]:
    return [str(Path(__file__).resolve()), "--batch-size", str(a.batch_size), "--fanouts",
            a.fanouts, "--seed", str(a.seed), "--queue-depth", str(a.queue_depth), "--budget",
            str(a.budget), "--epochs", str(a.epochs), "--batches", str(a.batches), *extra]


def side_by_side(a) -> dict:
    opened = open_bench_dataset(a)
    if opened is None:
        raise SystemExit(2)
    data, _, disk, ratio = opened
    runs: dict[str, list[dict]] = {k: [] for k in LOADERS}
    for r in range(a.rounds):
        order = LOADERS[r % len(LOADERS):] + LOADERS[:r % len(LOADERS)]
        for kind in order:
            drop_page_cache(data)
            run = memcg.run(kind.replace("+", "_"), _child_argv(a, ["--child", kind, "--data",
                                                                   str(data)]),
                            None if a.no_cgroup else a.budget)
            res = _result(run)
            if run["rc"] != 0 or res is None:
                raise SystemExit(f"{kind} failed: {memcg.exit_words(run['rc'])}: "
                                 + "\n".join(run["lines"][-5:]))
            res["cgroup"] = run.get("cgroup")
            runs[kind].append(res)
    med = {k: statistics.median(x["epochs"][-1]["epoch_s"] for x in v) for k, v in runs.items()}
    rows = []
    for k in LOADERS:
        last = runs[k][-1]
        cg = last.get("cgroup") or {}
        rows.append({"loader": k, "epoch_s": round(med[k], 2),
                     "vs_ooc_nodeloader": round(med[k] / med["ooc.NodeLoader"], 3),
                     "peak_rss_bytes": max(x["peak_rss_bytes"] for x in runs[k]),
                     "cgroup_max_usage_bytes": cg.get("max_usage_in_bytes")})
    return {"dataset": str(data), "disk_bytes": disk, "disk_over_budget": round(ratio, 2),
            "budget_bytes": a.budget, "rounds": a.rounds, "epochs": a.epochs, "rows": rows,
            "runs": runs}


def _topology_dataset(a) -> Path | None:
    nodes = a.topology_nodes
    degree = max(1.0, 1.1 * a.min_indices / 4 / nodes)  # 10% margin for deduplicated edges
    spec = dict(nodes=nodes, avg_degree=degree, feature_dim=16, classes=8,
                train_fraction=0.01, val_fraction=0.0, test_fraction=0.0, seed=0)
    return D.synthetic(spec, a.data or D.cache_root() / f"bench-topology-{nodes}-{int(degree)}")


def topology(a) -> dict:
    from ooc.storage import open_dataset

    data = _topology_dataset(a)
    if data is None:
        raise SystemExit(2)
    ds = open_dataset(data)
    ind = ds.file("indices.bin").stat().st_size
    log(f"dataset {data}: {ds.num_nodes:,} nodes, {ds.num_edges:,} edges; indices.bin "
        f"{format_size(ind)}")
    drop_page_cache(data)
    run = memcg.run("topology", _child_argv(a, ["--topology-child", "--data", str(data)]), None)
    res = _result(run)
    if run["rc"] != 0 or res is None:
        raise SystemExit("topology run failed: " + "\n".join(run["lines"][-5:]))
    res.update(indices_bytes=ind, rss_over_indices=round(res["peak_rss_bytes"] / ind, 3),
               dataset=str(data), num_edges=ds.num_edges)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench pyg", description=__doc__.split("\n")[0])
    add_run_args(p)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=200, help="--topology: batches loaded")
    p.add_argument("--topology", action="store_true", help="the topology-on-disk run")
    p.add_argument("--topology-nodes", type=int, default=4_000_000)
    p.add_argument("--min-indices", type=int, default=1 << 30)
    p.add_argument("--report", type=Path)
    p.add_argument("--child", choices=LOADERS, help=argparse.SUPPRESS)
    p.add_argument("--topology-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child, str(a.data), a)
        return 0
    if a.topology_child:
        topology_child(str(a.data), a)
        return 0
    out = topology(a) if a.topology else side_by_side(a)
    if a.topology:
        print(f"\nindices.bin {format_size(out['indices_bytes'])}, {out['num_edges']:,} edges; "
              f"{out['batches']} batches in {out['seconds']:.1f} s; peak RSS "
              f"{format_size(out['peak_rss_bytes'])} = {out['rss_over_indices']:.2f}x indices.bin")
    else:
        print("\n| loader | epoch s (median) | vs ooc.NodeLoader | peak RSS | cgroup peak |")
        print("|---|---:|---:|---:|---:|")
        for r in out["rows"]:
            cg = r["cgroup_max_usage_bytes"]
            print(f"| {r['loader']} | {r['epoch_s']:.2f} | {r['vs_ooc_nodeloader']:.2f} | "
                  f"{format_size(r['peak_rss_bytes'])} | "
                  f"{format_size(cg) if cg else 'n/a'} |")
    if a.report:
        H.write_report(a.report, "pyg", out, args=a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
