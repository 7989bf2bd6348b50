"""Side-by-side benchmark of the training modes: baseline (PyG+), static (Ali+PG), ooc (Ginex).

One invocation, the same seeds for every mode::

    python -m bench modes --report bench.json            # default config (~10 min here)
    python -m bench modes --nodes 200000 --budget 256MiB --report small.json   # quick

What it does:

1. Generates (once) or reuses a synthetic power-law dataset at least 4× the
   memory budget on disk, mostly features. Default: 1,100,000 nodes,
   average degree 10, 1024 float32 features (4 KiB rows: one page per row,
   like fio's 4 KiB reads), 2% training nodes → 4.2 GiB (4.2x) for a 1 GiB budget.
   Batches of 256 seeds with fanouts 10,5 touch about 1% of the nodes
   (printed).
2. Measures fio 4 KiB random-read IOPS (O_DIRECT, io_uring, the same queue
   depth) on ``features.bin`` — the physical limit of a gather.
3. For each mode: drops every dataset file from the page cache
   (``posix_fadvise(DONTNEED)``), then runs ``python -m ooc.train`` in a
   subprocess inside a cgroup-v1 memory cgroup limited to the budget (the
   child joins it before exec; the group is removed after), with
   ``--memory-budget`` set to the same size. The page cache counts against a
   v1 cgroup, so the baseline's only cache — the page cache — gets what the
   process leaves of the budget, as the application caches of static/ooc do.
4. ``in_ram`` (last): the compute floor. The dataset is copied to tmpfs
   (``--in-ram-dir``, default ``/dev/shm``; removed afterwards), then the
   training loop runs on that copy with no budget and no cgroup, every
   feature row and every neighbour list held in the process: the static
   preset with a feature cache and a neighbor cache of the whole graph
   (filled before the first epoch), so a batch's gather is the cache's
   in-memory copy and no I/O competes with the model for the cores. (The
   page cache is not enough on a shared machine: other processes' reclaim
   and cache drops take part of a warmed dataset back during an epoch; and a
   memmap gather on tmpfs still takes a page fault per row, which made the
   "floor" slower than the O_DIRECT presets on 2 cores: ``docs/benchmarks.md``.)
5. The disk's bound: for each mode with a feature cache, the fewest rows any
   cache of its size could read in the last epoch (``fewest_reads``: Belady with
   every batch of the run known in advance, the run's own batches) and, where a
   row is a whole page (one read each, as fio's), the epoch those reads take at
   the disk's IOPS (``disk_bound``: at least the in-RAM epoch): the higher of fio's
   and the fastest a mode read at in this run (a shared disk's fio sample can be
   below what the modes got).
6. Writes ``--report`` (JSON, :func:`bench.harness.write_report`) with per-mode epoch times, stage breakdowns,
   miss ratio, read ops, bytes read, achieved gather IOPS, speedups,
   ``gather_iops_vs_fio`` and ``ooc_over_in_ram`` (ooc epoch / in-RAM epoch;
   every mode's in ``over_in_ram``), every run (``samples``; ``--rounds`` alternating
   rounds, medians), and a PNG chart of the time breakdown. ``python -m bench table
   REPORT`` prints the README's table.

The headline epoch is the last one (``--epochs``, default 2): epoch 1 also
pays one-off costs (JIT compilation, the first superbatch's sampling before
training can start).
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from ooc.core.sizes import format_size, parse_size
from ooc.executor.sizing import memcg
from ooc.storage.pagecache import drop_page_cache

from . import data as D
from . import fio
from . import harness as H

MODES = ("baseline", "static", "ooc")
#: The in-RAM reference run: the baseline loop with every file in the page cache, no budget.
IN_RAM = "in_ram"
#: Default dataset (``generate_synthetic`` arguments).
DEFAULT_DATASET = dict(nodes=1_100_000, avg_degree=10, feature_dim=1024, classes=8,
                       train_fraction=0.02, val_fraction=0.005, test_fraction=0.005, seed=0)


log = memcg.log


# -- dataset ---------------------------------------------------------------------------------


def batch_fraction(path: Path, batch_size: int, fanouts: list[int], probes: int = 4) -> float:
    """Mean fraction of the nodes one batch touches (sampled with the memmap)."""
    import ooc
    from ooc.sampling import NeighborSampler

    d = ooc.open_dataset(path)
    s = NeighborSampler(d.indptr, d.indices, fanouts)
    sb, seeds = H.epoch_plan(d.train_idx, batch_size, 0, 1)
    bs = s.sample_many(sb[:probes], seeds[:probes])
    return sum(b.num_nodes for b in bs) / len(bs) / d.num_nodes


def fewest_reads(path: Path, batch_size: int, fanouts: list[int], seed: int, epochs: int,
                 capacities: dict[str, int]) -> dict[str, dict]:
    """Per mode, the fewest feature rows a cache of its ``capacities[mode]`` rows could
    read in the last of ``epochs``: Belady over the run's own batches (the trainer's seeds)
    with every batch of every epoch known in advance, the cache changing between batches
    (:func:`ooc.caches.miss_curves.belady_batch_misses`). No policy reads fewer."""
    import ooc
    from ooc.caches.miss_curves import belady_batch_misses
    from ooc.sampling import NeighborSampler

    d = ooc.open_dataset(path)
    sampler = NeighborSampler(d.indptr, d.indices, fanouts)
    trace: list = []
    last = 0
    for e in range(1, epochs + 1):
        bs = sampler.sample_many(*H.epoch_plan(d.train_idx, batch_size, seed, e))
        trace += [b.node_ids for b in bs]
        last = len(bs)
    lookups = int(sum(ids.shape[0] for ids in trace[len(trace) - last:]))
    out = {}
    for mode, cap in capacities.items():
        rows = int(belady_batch_misses(trace, cap)[len(trace) - last:].sum())
        out[mode] = {"capacity_rows": int(cap), "rows": rows, "lookups": lookups,
                     "miss_ratio": rows / lookups if lookups else None}
    return out


def disk_iops(fio_iops: float | None, modes: dict[str, dict]) -> float | None:
    """The disk's 4 KiB reads a second: the higher of fio's and the fastest a mode read at
    (``gather_iops`` of each summary in ``modes``); None if neither was measured."""
    rates = [fio_iops or 0.0] + [s.get("gather_iops") or 0.0 for s in modes.values()
                                 if "error" not in s]
    return max(rates) or None


def disk_bound(fewest: dict, row_bytes: int, iops: float | None,
               in_ram_s: float | None) -> dict:
    """The fastest epoch this disk allows a cache of ``fewest["capacity_rows"]`` rows: its
    fewest reads at ``iops`` (the disk's 4 KiB reads a second; one read a row: rows of a
    whole page or more), and never under the in-RAM epoch (the model's step)."""
    from ooc.storage.layout import PAGE

    if row_bytes < PAGE:
        return {"epoch_s": None, "why": f"rows of {row_bytes} B share pages: a read is not a row"}
    if not iops:
        return {"epoch_s": None, "why": "no measurement of the disk's IOPS"}
    reads_s = fewest["rows"] / iops
    res: dict = {"iops": iops, "reads_s": reads_s, "epoch_s": max(reads_s, in_ram_s or 0.0)}
    if in_ram_s:
        res["over_in_ram"] = res["epoch_s"] / in_ram_s
    return res


# -- one mode ------------------------------------------------------------------------------


def copy_to_ram(data: Path, parent: Path) -> Path:
    """A copy of the dataset folder in a new folder under ``parent`` (tmpfs: RAM that no
    page-cache reclaim or other process's cache drop can take back)."""
    dst = Path(tempfile.mkdtemp(prefix="ooc-bench-in-ram-", dir=parent)) / data.name
    shutil.copytree(data, dst, ignore=shutil.ignore_patterns("runtime", "neighbor_cache"))
    return dst


def run_mode(mode: str, args, data: Path, workdir: Path) -> dict:
    """One training run of ``mode`` (or :data:`IN_RAM`: every row and neighbour list in the
    process's caches, from a copy of the dataset on tmpfs, no budget, no cgroup)."""
    in_ram = mode == IN_RAM
    ram_copy = None
    if in_ram:
        t0 = time.perf_counter()
        ram_copy = copy_to_ram(data, args.in_ram_dir)
        log(f"{IN_RAM}: copied {data} to {ram_copy} in {time.perf_counter() - t0:.0f}s")
        data = ram_copy
    else:
        drop_page_cache(data)
    try:
        return _train(mode, in_ram, args, data, workdir)
    finally:
        if ram_copy is not None:
            shutil.rmtree(ram_copy.parent, ignore_errors=True)


def _train(mode: str, in_ram: bool, args, data: Path, workdir: Path) -> dict:
    rep_path = workdir / f"{mode}.json"
    train = ["-m", "ooc.train", "--data", str(data), "--mode", "static" if in_ram else mode,
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
             "--fanouts", args.fanouts, "--hidden", str(args.hidden), "--seed", str(args.seed),
             "--queue-depth", str(args.queue_depth),
             "--runtime-dir", str(workdir / "runtime"), "--no-progress", "--no-eval",
             "--device", "cpu", "--report", str(rep_path)]
    if in_ram:   # the whole graph in the process's caches: no I/O during the epochs
        train += ["--feature-cache-size", "1TiB", "--neighbor-cache-size", "1TiB"]
    else:
        train += ["--memory-budget", str(args.budget)]
    if args.superbatch_size:
        train += ["--superbatch-size", str(args.superbatch_size)]
    limit = None if (args.no_cgroup or in_ram) else args.budget
    run = memcg.run(mode, train, limit)
    res: dict = {"mode": mode, "rc": run["rc"], "wall_s": run["wall_s"],
                 "child_peak_rss_bytes": run["child_peak_rss_bytes"]}
    if "cgroup" in run:
        res["cgroup"] = run["cgroup"]
    if run["rc"] != 0 or not rep_path.exists():
        res["error"] = "\n".join(run["lines"][-5:]) or memcg.exit_words(run["rc"])
        return res
    res["train_report"] = json.loads(rep_path.read_text())
    return res


def summarize(res: dict, fio_iops: float | None) -> dict:
    rep = res.get("train_report")
    if not rep:
        return {"mode": res["mode"], "error": res.get("error", "failed")}
    hist = rep["epochs"]
    last = hist[-1]
    io = last.get("io", {})
    t = last["timers"]
    reads = io.get("feature_pages", io.get("feature_rows", 0))
    read_s = t.get("read", 0.0)
    out = {
        "mode": res["mode"],
        "epoch_time_s": last["time_s"],
        "epoch_times_s": [h["time_s"] for h in hist],
        "stages_s": t,
        "miss_ratio": 1.0 - io.get("feature_hit_ratio", 0.0),
        "feature_lookups": io.get("feature_lookups"),
        "read_ops": io.get("feature_read_ops", io.get("feature_rows")),
        "pages_read": reads,
        "bytes_read": io.get("feature_bytes_read", io.get("proc_read_bytes")),
        "proc_read_bytes": io.get("proc_read_bytes"),
        "neighbor_cache_hit_ratio": io.get("neighbor_cache_hit_ratio"),
        "gather_iops": (reads / read_s) if read_s > 0 else None,
        "peak_rss_bytes": rep.get("peak_rss_bytes"),
        "child_peak_rss_bytes": res.get("child_peak_rss_bytes"),
        "cgroup": res.get("cgroup"),
        "memory_plan": rep.get("memory_plan"),
        "mode_info": rep.get("mode_info"),
        "loss": [h["loss"] for h in hist],
        "wall_s": res["wall_s"],
    }
    if fio_iops and out["gather_iops"]:
        out["gather_iops_vs_fio"] = out["gather_iops"] / fio_iops
    upd = t.get("update", 0.0) + t.get("switch", 0.0)
    out["update_switch_fraction"] = upd / last["time_s"] if last["time_s"] else None
    return out


# -- chart ------------------------------------------------------------------------------------


def chart(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in (*MODES, IN_RAM) if m in summary and "epoch_time_s" in summary[m]]
    main_stages = ["compute", "transfer", "convert", "stall"]
    bg_stages = ["sample", "inspect_sample", "inspect_changesets", "load", "switch", "gather",
                 "read", "update"]
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, stages, title in ((axes[0], main_stages, "training thread (sums to the epoch)"),
                              (axes[1], bg_stages, "pipeline threads (overlap the training)")):
        for i, m in enumerate(modes):
            left = 0.0
            for j, s in enumerate(stages):
                v = summary[m]["stages_s"].get(s, 0.0)
                if s == "read":
                    continue  # read is inside gather; drawn as a hatch below
                ax.barh(i, v, left=left, color=colors[j % len(colors)],
                        label=s if i == 0 else None)
                if s == "gather":
                    r = summary[m]["stages_s"].get("read", 0.0)
                    ax.barh(i, r, left=left, color="none", edgecolor="k", hatch="//",
                            label="read (in gather)" if i == 0 else None)
                left += v
            if stages is main_stages:
                ax.plot([summary[m]["epoch_time_s"]] * 2, [i - 0.4, i + 0.4], "k-", lw=2)
        ax.set_yticks(range(len(modes)), modes)
        ax.set_xlabel("seconds (last epoch)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    sp = summary.get("speedup", {})
    fig.suptitle("epoch time breakdown; ooc vs baseline "
                 f"{sp.get('ooc_vs_baseline', float('nan')):.2f}x, vs static "
                 f"{sp.get('ooc_vs_static', float('nan')):.2f}x", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The dataset, budget and sampling options (shared with ``python -m bench loader``)."""
    p.add_argument("--data", type=Path, default=None,
                   help="dataset folder (generated there if absent; default "
                        "$OOC_CACHE/bench-<nodes>-<dim>)")
    p.add_argument("--budget", type=parse_size, default=parse_size("1GiB"), help="memory budget")
    p.add_argument("--nodes", type=int, default=DEFAULT_DATASET["nodes"])
    p.add_argument("--feature-dim", type=int, default=DEFAULT_DATASET["feature_dim"])
    p.add_argument("--avg-degree", type=float, default=DEFAULT_DATASET["avg_degree"])
    p.add_argument("--train-fraction", type=float, default=DEFAULT_DATASET["train_fraction"])
    p.add_argument("--community-size", type=int, default=None, metavar="K",
                   help="many small communities of about K nodes hidden by the id permutation "
                        "(default: one community per class)")
    p.add_argument("--reorder", choices=("auto", "locality", "none"), default="auto",
                   help="row order of the generated dataset's features (ooc.prepare --reorder)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--queue-depth", type=int, default=64)
    p.add_argument("--no-cgroup", action="store_true")
    p.add_argument("--allow-small", action="store_true",
                   help="do not require the dataset to be 4x the budget")


def open_bench_dataset(args) -> tuple[Path, dict, int, float] | None:
    """Generate or reuse the dataset of ``args``: ``(folder, spec, disk bytes, disk / budget)``,
    or None (logged) when it is under 4x the budget without ``--allow-small``."""
    import ooc

    spec = dict(DEFAULT_DATASET, nodes=args.nodes, feature_dim=args.feature_dim,
                avg_degree=args.avg_degree, train_fraction=args.train_fraction,
                community_size=args.community_size, reorder=args.reorder)
    data = D.synthetic(spec, args.data or D.cache_root() / f"bench-{args.nodes}-{args.feature_dim}")
    if data is None:
        return None
    d = ooc.open_dataset(data)
    disk = d.disk_bytes()
    ratio = disk / args.budget
    log(f"dataset {data}: {d.num_nodes:,} nodes, {d.num_edges:,} edges, {d.feature_dim} x "
        f"{d.feature_dtype} features, {format_size(disk)} on disk = {ratio:.1f}x the "
        f"{format_size(args.budget)} budget; {len(d.train_idx):,} training nodes")
    if ratio < 4 and not args.allow_small:
        log("the dataset must be at least 4x the budget (use --allow-small to override)")
        return None
    return data, spec, disk, ratio


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench modes", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_run_args(p)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--superbatch-size", type=int, default=None)
    p.add_argument("--modes", default=",".join((*MODES, IN_RAM)),
                   help=f"modes to run; {IN_RAM}: the whole graph in the process's caches, from "
                        f"a copy of the dataset on tmpfs, no budget (the compute floor)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternating rounds of the modes (each a fresh process whose first "
                        "epoch is its warm-up); the medians are reported")
    p.add_argument("--fio-seconds", type=int, default=15)
    p.add_argument("--in-ram-dir", type=Path, default=Path("/dev/shm"),
                   help=f"tmpfs folder for the {IN_RAM} run's copy of the dataset")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--report", type=Path, default=Path("bench.json"))
    p.add_argument("--chart", type=Path, default=None, help="PNG (default: report with .png)")
    args = p.parse_args(argv)
    # the report's folder (bench_out/ in the README's command) is made before the run, so
    # a missing one does not lose the measurements at the end
    args.report.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so an interrupted run removes its cgroup
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in (*MODES, IN_RAM):
            p.error(f"unknown mode {m!r}")
    opened = open_bench_dataset(args)
    if opened is None:
        return 2
    data, spec, disk, ratio = opened
    frac = batch_fraction(data, args.batch_size, [int(f) for f in args.fanouts.split(",")])
    log(f"one batch ({args.batch_size} seeds, fanouts {args.fanouts}) touches {frac:.2%} of the "
        f"nodes")
    drop_page_cache(data)
    fio_res = fio.run_fio(data / "features.bin", args.queue_depth, args.fio_seconds)
    if fio_res is None:
        log("fio not installed (apt-get install -y fio) or failed: gather_iops_vs_fio omitted")
        fio_res = {"available": False}
    else:
        fio_res["available"] = True
        log(f"fio 4 KiB random read, QD {args.queue_depth} ({fio_res['engine']}): "
            f"{fio_res['iops']:,.0f} IOPS, {fio_res['lat_mean_us']:.0f} us mean latency")
    cg_ok = (not args.no_cgroup) and memcg.available()
    if not cg_ok:
        log("no memory cgroup (cgroup v1 memory controller not writable or --no-cgroup): "
            "the budget is enforced only by the trainer's own plan")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ooc-bench-", dir=data.parent))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    fio_iops = fio_res.get("iops")

    def case(m: str):
        return lambda: summarize(run_mode(m, args, data, workdir), fio_iops)

    try:
        rounds = H.run_rounds({m: case(m) for m in modes}, args.rounds, warmup=0)
    except BaseException:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    meds = H.medians(rounds)
    # the last run of each mode, its numbers the medians over the rounds
    summary = {m: {**rounds.measured(m)[-1].values, **meds[m]} for m in modes}
    sp = H.ratios(summary, (("ooc", "baseline"), ("ooc", "static"), ("static", "baseline")),
                  "epoch_time_s")

    def et(m):
        return summary.get(m, {}).get("epoch_time_s")

    over_ram = {f"{m}_over_in_ram": et(m) / et(IN_RAM) for m in MODES if et(m) and et(IN_RAM)}
    summary["speedup"] = sp
    caps = {m: summary[m]["mode_info"]["feature_cache_rows"] for m in ("static", "ooc")
            if isinstance((summary.get(m, {}).get("mode_info") or {}).get("feature_cache_rows"),
                          int)}
    bound: dict = {}
    if caps:
        fewest = fewest_reads(data, args.batch_size, [int(f) for f in args.fanouts.split(",")],
                              args.seed, args.epochs, caps)
        import ooc

        row_bytes = ooc.open_dataset(data).layout.row_bytes
        rate = disk_iops(fio_iops, {m: summary[m] for m in modes})
        for m, f in fewest.items():
            summary[m]["fewest_reads"] = f
            if summary[m].get("read_ops"):
                f["measured_over_fewest"] = summary[m]["read_ops"] / max(f["rows"], 1)
            bound[m] = disk_bound(f, row_bytes, rate, et(IN_RAM))
    report = {
        "dataset": {"path": str(data), "spec": spec, "disk_bytes": disk,
                    "disk_vs_budget": ratio, "batch_node_fraction": frac},
        "budget_bytes": args.budget, "cgroup": cg_ok, "fio": fio_res,
        "modes": summary, "speedup": sp, "over_in_ram": over_ram,
        "ooc_over_in_ram": over_ram.get("ooc_over_in_ram"), "disk_bound": bound,
        "gather_iops_vs_fio": summary.get("ooc", {}).get("gather_iops_vs_fio"),
    }
    H.write_report(args.report, "modes", report, spec=spec, samples=rounds, data_path=data,
                   args=args)
    png = args.chart or args.report.with_suffix(".png")
    chart(summary, png)
    shutil.rmtree(workdir, ignore_errors=True)
    # table
    print()
    print(f"{'mode':<9} {'epoch s':>8} {'miss':>6} {'reads':>9} {'MiB read':>9} "
          f"{'read IOPS':>10} {'vs fio':>7} {'upd+sw':>7} {'peak RSS':>9}")
    for m in modes:
        s = summary[m]
        if "error" in s:
            print(f"{m:<9} failed: {s['error'][:200]}")
            continue
        gi = s.get("gather_iops")
        print(f"{m:<9} {s['epoch_time_s']:>8.2f} {s['miss_ratio']:>6.3f} {s['read_ops'] or 0:>9,} "
              f"{(s['bytes_read'] or 0) / 2**20:>9.0f} {gi or 0:>10,.0f} "
              f"{s.get('gather_iops_vs_fio') or 0:>7.2f} "
              f"{(s['update_switch_fraction'] or 0):>7.1%} "
              f"{format_size(s['child_peak_rss_bytes'] or 0):>9}")
    print("speedup: " + ", ".join(f"{k} {v:.2f}x" for k, v in sp.items()))
    if over_ram:
        print("epoch / in-RAM epoch: " + ", ".join(f"{k.split('_')[0]} {v:.2f}"
                                                   for k, v in over_ram.items()))
    for m, b in bound.items():
        f = summary[m]["fewest_reads"]
        line = (f"{m}: the fewest reads a cache of {f['capacity_rows']:,} rows makes in the last "
                f"epoch: {f['rows']:,} (read {summary[m].get('read_ops') or 0:,})")
        if b.get("epoch_s") is not None:
            line += (f"; at {b['iops']:,.0f} IOPS (fio's or a mode's, the higher) an epoch "
                     f"of at least {b['epoch_s']:.2f} s"
                     + (f" ({b['over_in_ram']:.2f}x in-RAM)" if "over_in_ram" in b else ""))
        print(line)
    print(f"report {args.report}, chart {png}")
    return 0


#: The README's row labels of the modes.
LABELS = {"baseline": "baseline (memmap, 16 I/O threads)",
          "static": "static (neighbor cache + degree-ordered feature cache)",
          "ooc": "ooc (neighbor cache + Belady feature cache)",
          IN_RAM: "in_ram (every row and list in the process)"}


def table(rep: dict) -> str:
    """The README's table of a report: per mode its last epoch, miss ratio, reads, read
    IOPS, gather and compute seconds, cache rows, peak RSS and epoch / in-RAM epoch."""
    f = H.fmt
    rows = []
    for m in (x for x in (*MODES, IN_RAM) if x in rep["modes"]):
        s = rep["modes"][m]
        if "error" in s:
            rows.append([LABELS.get(m, m), "failed", *[""] * 8])
            continue
        st = s.get("stages_s") or {}
        cache = (s.get("mode_info") or {}).get("feature_cache_rows")
        rows.append([LABELS.get(m, m), f(s["epoch_time_s"], ".2f"), f(s.get("miss_ratio"), ".3f"),
                     f(s.get("read_ops"), ","), f(s.get("gather_iops"), ",.0f"),
                     f(st.get("gather"), ".2f"), f(st.get("compute"), ".2f"),
                     f(cache, ",") if isinstance(cache, int) else "page cache",
                     format_size(s.get("child_peak_rss_bytes") or 0),
                     f(rep.get("over_in_ram", {}).get(f"{m}_over_in_ram",
                                                      1.0 if m == IN_RAM else None), ".2f")])
    return H.markdown(["mode", "epoch s", "miss ratio", "reads", "read IOPS", "gather s",
                       "compute s", "cache rows", "peak RSS", "epoch / in-RAM"], rows)


if __name__ == "__main__":
    sys.exit(main())
