"""The data path alone: sample, gather and build the ``Data`` of every batch, no model.

    python -m bench loader --report bench_out/loader.json   # the modes benchmark's dataset, 1 GiB

What a GPU user's loader costs, without the model's compute on the same two
cores hiding it. For each preset (``baseline``: memmaps with 16 copy threads,
``static``: neighbor cache + static feature cache + O_DIRECT reads, ``ooc``:
neighbor cache + inspector + Belady feature cache + O_DIRECT reads) a child
process builds the same pipeline as ``python -m ooc.train --memory-budget``
(same memory plan, cache sizes and superbatch size, a model built only so the
plan measures what training would hold), then runs ``--epochs`` epochs of
``batches(epoch)`` → ``to_data`` and throws each ``Data`` away. Every child
runs in its own memory cgroup of the budget with the dataset dropped from
the page cache first; ``--rounds`` rounds run the presets interleaved (the
order rotated each round), and the table gives medians of the last epoch.
fio (4 KiB random reads of ``features.bin`` at the same queue depth, see
``bench/fio.py``) runs before and after.

Columns: epoch seconds; batches/s; device MiB (bytes the process read from the disk,
``/proc/self/io``: every file, io_uring workers included) and MB/s over the epoch; read
IOPS inside the loader (feature reads /
seconds spent in the feature source's ``read``, page planning and row
extraction included; the O_DIRECT presets); engine IOPS (the same reads /
seconds inside the native io_uring engine: the rate while the ring reads,
comparable with fio at the same depth); CPU seconds of the epoch
(every thread of the child) and CPU µs per feature row read from the disk. ``--report`` writes
``speedup.ooc_vs_baseline``, ``speedup.ooc_vs_static`` (epoch-time ratios),
``read_efficiency.<preset>`` (bytes of the feature rows the O_DIRECT reader delivered, to a
batch or to the cache, / feature bytes it read from the device; the baseline's memmaps leave
what is read to the page cache, so it has none),
``reads_vs_fio.<preset>`` (read IOPS inside the loader / fio's IOPS, for the
O_DIRECT presets; ``read_iops_vs_fio`` is the ooc one), ``engine_vs_fio.<preset>``,
the per-preset medians (with the seconds in the feature source's ``read`` and
in the engine, and the rows read straight into the batch vs copied out of a
page buffer) and every run (``samples``); ``python -m bench table REPORT`` prints the
README's table from it. Each child is its own warm-up (its first epoch; the last is
measured), so no round is dropped.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from ooc.core.memory import peak_rss_bytes
from ooc.core.sizes import format_size, parse_size
from ooc.executor.sizing import memcg
from ooc.storage.pagecache import drop_page_cache

from . import fio
from . import harness as H
from .modes import add_run_args, open_bench_dataset

PRESETS = ("baseline", "static", "ooc", "packed")
#: Variants for A/B runs: a name -> (the preset it changes, its cache policy's fields,
#: its ``ModeOptions`` fields). ``ooc-mates``: ooc whose changesets also insert page-mates
#: (rows on the pages a batch's misses read that the superbatch uses later;
#: ``BeladyCache(page_mates=0.25)``). ``<preset>-pages``: the preset reading whole 4 KiB
#: pages where it would read a small row's 512 B sectors (``page_reads``);
#: ``<preset>-nogap``: the preset reading only what it wants (a small row's sectors, a
#: list's pages), never through a gap (``read_gap`` 0); ``<preset>-gap<N>k`` (any N, e.g.
#: ``ooc-gap4k``): through gaps of up to N KiB.
VARIANTS: dict[str, tuple[str, dict, dict]] = {
    "ooc-mates": ("ooc", {"page_mates": 0.25}, {}),
    "ooc-pages": ("ooc", {}, {"page_reads": True}),
    "static-pages": ("static", {}, {"page_reads": True}),
}
_GAP_VARIANT = re.compile(r"(baseline|static|ooc|packed)-(?:nogap|gap(\d+)k)")


def variant(name: str) -> tuple[str, dict, dict] | None:
    """(preset, policy fields, ``ModeOptions`` fields) of a preset or variant name; None if
    it names neither."""
    if name in PRESETS:
        return name, {}, {}
    if name in VARIANTS:
        return VARIANTS[name]
    m = _GAP_VARIANT.fullmatch(name)
    return (m.group(1), {}, {"read_gap": int(m.group(2) or 0) << 10}) if m else None


log = memcg.log


# -- the child: one preset's data path --------------------------------------------------------


def engine_counters(trainer) -> dict:
    """Runs read and seconds spent by the native io_uring engine of the feature reader
    (``DirectReader.engine_stats``; empty for other readers)."""
    src = getattr(trainer.features, "inner", trainer.features)
    reader = getattr(src, "reader", None)
    return reader.engine_stats() if hasattr(reader, "engine_stats") else {}


def child(spec: dict) -> int:
    """Run ``spec["epochs"]`` data-path epochs of one preset; write the JSON report."""
    from dataclasses import replace

    import ooc
    from ooc.executor.loader.presets import resolve_preset
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.training.link import LinkTrainer
    from ooc.executor.training.trainer import TrainConfig, Trainer, io_delta

    d = ooc.open_dataset(spec["data"])
    found = variant(spec["preset"])
    assert found is not None, spec["preset"]
    mode, fields, options = found
    preset = resolve_preset(mode)
    preset = replace(preset, policy=replace(preset.policy, **fields))  # a variant's policy
    cfg = TrainConfig(mode=mode, task=spec["task"], fanouts=spec["fanouts"], batch_size=spec["batch_size"],
                      hidden=spec["hidden"], seed=spec["seed"], epochs=spec["epochs"],
                      device="cpu", progress=False, eval_final=False)
    opts = ModeOptions(queue_depth=spec["queue_depth"], memory_budget=spec["budget"],
                       runtime_dir=spec["runtime_dir"], io_backend=spec["io_backend"],
                       feature_cache_size=spec.get("feature_cache_size"),
                       neighbor_cache_size=spec.get("neighbor_cache_size"),
                       runtime_disk_budget=spec["runtime_disk_budget"], **options)
    extra = {}
    if spec["task"] == "link":  # --link-edges stored edges, drawn once with the seed
        extra["edge_label_index"] = link_edges(d, spec["link_edges"], spec["seed"])
    t = (LinkTrainer if spec["task"] == "link" else Trainer)(
        d, cfg, options=opts, log=lambda m: None, preset=preset, **extra)
    epochs = []
    try:
        for e in range(1, spec["epochs"] + 1):
            prod = t.train_producer
            io0 = t.io_counters()
            io0.update(engine_counters(t))
            c0 = time.process_time()
            w0 = time.perf_counter()
            nb = nodes = 0
            for data in t.train_loader.batches(e):
                nb += 1
                nodes += int(data.num_nodes)
            wall = time.perf_counter() - w0
            cpu = time.process_time() - c0
            io1 = t.io_counters()
            io1.update(engine_counters(t))
            io = io_delta(io0, io1)
            rec = {"epoch": e, "time_s": wall, "cpu_s": cpu, "batches": nb, "nodes": nodes,
                   "stages_s": prod.stage_times(), "io": io}
            epochs.append(rec)
            print(f"epoch {e}: {wall:.2f}s, {nb} batches, cpu {cpu:.2f}s, "
                  f"device {io.get('proc_read_bytes', 0) / 2**20:,.0f} MiB", flush=True)
    finally:
        t.close()
    rep = {"preset": spec["preset"], "mode_info": t.mode_info, "row_bytes": d.layout.row_bytes,
           "memory_plan": t.memory_plan.as_dict() if t.memory_plan else None,
           "epochs": epochs,
           "peak_rss_bytes": peak_rss_bytes()}
    tmp = Path(spec["report"] + ".tmp")
    tmp.write_text(json.dumps(rep, default=str))
    os.replace(tmp, spec["report"])
    return 0


def link_edges(dataset, count: int, seed: int):
    """``count`` stored edges of ``dataset`` drawn with ``seed`` (int64 [2, count])."""
    import numpy as np

    from ooc.sampling.link_plan import EdgeSeeds

    pos = np.random.default_rng(seed).integers(0, dataset.num_edges, count)
    return np.stack(EdgeSeeds(dataset.num_nodes, indptr=dataset.indptr,
                              indices=dataset.indices).ends(pos))


# -- the parent ------------------------------------------------------------------------------


#: The device reads of an epoch by kind: (bytes key, reads key) of the child's counters.
KINDS = {"sweep": ("packed_sweep_bytes_read", "packed_sweep_read_ops"),
         "packed_segments": ("packed_segment_bytes", "packed_segment_reads"),
         "direct_misses": ("feature_bytes_read", "feature_read_ops"),
         "lists": ("direct_bytes_read", "direct_read_ops")}


def device_by_kind(io: dict, epoch_s: float) -> dict:
    """The epoch's device bytes and reads by kind (:data:`KINDS`; ``direct_misses``: the
    feature reader's, switches included) and the bytes written."""
    out: dict = {k: {"bytes": int(io.get(b) or 0), "reads": int(io.get(r) or 0)}
                 for k, (b, r) in KINDS.items()}
    out["written"] = {"bytes": int(io.get("packed_bytes_written") or 0),
                      "writes": int(io.get("packed_write_ops") or 0)}
    return out


def disk_bound_s(kinds: dict, seq_read: float | None, seq_write: float | None) -> float | None:
    """The disk's bound on a packed epoch: its sweep and segment bytes at the sequential
    read rate plus its bytes written at the sequential write rate (None without packing
    or rates)."""
    packed = kinds["sweep"]["bytes"] + kinds["packed_segments"]["bytes"]
    if not packed or not seq_read or not seq_write:
        return None
    return packed / seq_read + kinds["written"]["bytes"] / seq_write


def packing_overlap(io: dict, stages: dict) -> dict | None:
    """Seconds the packer worked in the epoch, seconds training waited for it, and the
    share hidden behind the rest of the epoch (None without packing)."""
    pack = io.get("packed_pack_s")
    if not pack:
        return None
    wait = float(io.get("packed_wait_s") or 0.0)
    return {"pack_s": pack, "wait_s": wait, "hidden": max(0.0, 1 - wait / pack)}


def run_preset(preset: str, rnd: int, args, data: Path, workdir: Path) -> dict:
    drop_page_cache(data)
    report = workdir / f"{preset}-{rnd}.json"
    spec = {"preset": preset, "data": str(data), "epochs": args.epochs,
            "fanouts": [int(f) for f in args.fanouts.split(",")],
            "batch_size": args.batch_size, "hidden": args.hidden, "seed": args.seed,
            "queue_depth": args.queue_depth, "budget": args.budget,
            "io_backend": args.io_backend, "runtime_dir": str(workdir / "runtime"),
            "feature_cache_size": args.feature_cache_size,
            "neighbor_cache_size": args.neighbor_cache_size,
            "runtime_disk_budget": args.runtime_disk_budget, "report": str(report),
            "task": args.task, "link_edges": args.link_edges}
    limit = None if args.no_cgroup else args.budget
    run = memcg.run(f"{preset}-{rnd}", ["-m", "bench.loader", "--child", json.dumps(spec)],
                    limit)
    res = {"preset": preset, "round": rnd, "rc": run["rc"], "wall_s": run["wall_s"],
           "child_peak_rss_bytes": run["child_peak_rss_bytes"], "cgroup": run.get("cgroup")}
    if run["rc"] != 0 or not report.exists():
        res["error"] = "\n".join(run["lines"][-5:]) or memcg.exit_words(run["rc"])
        return res
    rep = json.loads(report.read_text())
    last = rep["epochs"][-1]
    io = last["io"]
    ep = last["time_s"]
    dev_bytes = io.get("proc_read_bytes", 0)
    # rows the O_DIRECT feature reader delivered (batch misses and cache fills) against the
    # bytes it read from the device; memmaps leave that to the page cache: not measured
    rows_read = (io.get("feature_rows_direct") or 0) + (io.get("feature_rows_copied") or 0)
    feature_dev = io.get("feature_bytes_read")
    fr_ops = io.get("feature_read_ops")
    fr_s = io.get("feature_read_s")
    kinds = device_by_kind(io, ep)
    res.update({
        "by_kind": kinds, "bytes_written": io.get("packed_bytes_written", 0),
        "packing": packing_overlap(io, last["stages_s"]),
        "epoch_s": ep, "epoch_times_s": [e["time_s"] for e in rep["epochs"]],
        "batches_per_s": last["batches"] / ep, "batches": last["batches"],
        "device_bytes": dev_bytes, "device_mb_s": dev_bytes / ep / 1e6,
        "feature_read_ops": fr_ops, "feature_read_s": fr_s,
        "engine_busy_s": io.get("engine_busy_s"),
        "engine_reads_plain": io.get("engine_reads_plain"),
        "engine_registrations": io.get("engine_registrations"),
        "feature_rows_direct": io.get("feature_rows_direct"),
        "feature_rows_copied": io.get("feature_rows_copied"),
        "feature_page_mates_read": io.get("feature_page_mates_read"),
        "read_iops": (fr_ops / fr_s) if fr_ops and fr_s else None,
        "engine_iops": (io["engine_runs"] / io["engine_busy_s"])
        if io.get("engine_busy_s") else None,
        "feature_hit_ratio": io.get("feature_hit_ratio"),
        "read_efficiency": rows_read * rep["row_bytes"] / feature_dev if feature_dev else None,
        "neighbor_cache_hit_ratio": io.get("neighbor_cache_hit_ratio"),
        "cpu_s": last["cpu_s"], "cpu_us_per_row": last["cpu_s"] / rows_read * 1e6
        if rows_read else None,
        "stages_s": last["stages_s"], "mode_info": rep["mode_info"],
        "peak_rss_bytes": rep["peak_rss_bytes"]})
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--child":
        return child(json.loads(argv[1]))
    p = argparse.ArgumentParser(prog="python -m bench loader", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_run_args(p)
    p.add_argument("--epochs", type=int, default=2, help="per child; the last is reported")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the presets")
    p.add_argument("--io-backend", default="auto", help="of the O_DIRECT presets")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma-separated; also the variants {', '.join(VARIANTS)} (ooc-mates: "
                        "ooc with page-mates; -pages: whole-page reads of small rows) and "
                        "<preset>-gap<N>k / <preset>-nogap (read gaps of up to N KiB / none)")
    p.add_argument("--feature-cache-size", type=parse_size, default=None, metavar="SIZE",
                   help="every preset's feature cache (default: the memory plan's): an A/B "
                        "of two readers at the same caches")
    p.add_argument("--neighbor-cache-size", type=parse_size, default=None, metavar="SIZE",
                   help="every preset's neighbor cache (default: the memory plan's)")
    p.add_argument("--task", choices=("node", "link"), default="node",
                   help="link: the link loader's batches (ooc.LinkLoader, one uniform negative "
                        "pair per positive; --batch-size positives a batch) over "
                        "--link-edges stored edges")
    p.add_argument("--link-edges", type=int, default=20000,
                   help="--task link: positives per epoch, stored edges drawn with --seed")
    p.add_argument("--runtime-disk-budget", type=parse_size, default=parse_size("1GiB"),
                   metavar="SIZE", help="every preset's runtime files (packed: its segments too)")
    p.add_argument("--fio-seconds", type=int, default=10)
    p.add_argument("--report", type=Path, default=Path("loader.json"))
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    presets = [m.strip() for m in args.presets.split(",") if m.strip()]
    for m in presets:
        if variant(m) is None:
            p.error(f"unknown preset {m!r} (choose from {', '.join(PRESETS + tuple(VARIANTS))}"
                    ", <preset>-gap<N>k or <preset>-nogap)")
    if args.epochs < 1 or args.rounds < 1:
        p.error("--epochs and --rounds must be >= 1")
    opened = open_bench_dataset(args)
    if opened is None:
        return 2
    data, spec, disk, _ = opened
    feats = data / "features.bin"

    def run_fio(when: str) -> dict | None:
        drop_page_cache(feats)
        f = fio.run_fio(feats, args.queue_depth, args.fio_seconds)
        if f:
            log(f"fio {when}: {f['iops']:,.0f} IOPS at QD {args.queue_depth} ({f['engine']})")
        else:
            log("fio not installed (apt-get install -y fio) or failed: no fio ratio")
        return f

    fio_before = run_fio("before")
    workdir = Path(tempfile.mkdtemp(prefix="ooc-bench-loader-", dir=data.parent))
    seq_read = fio.run_fio_seq(feats, False, args.fio_seconds)
    seq_write = fio.run_fio_seq(workdir / "fio-seq-write", True, args.fio_seconds)
    log(f"fio sequential: read {H.fmt(seq_read and seq_read / 1e6, ',.0f')} MB/s, write "
        f"{H.fmt(seq_write and seq_write / 1e6, ',.0f')} MB/s (4 MiB, O_DIRECT)")
    count = itertools.count()

    def case(preset: str):
        return lambda: run_preset(preset, next(count) // len(presets), args, data, workdir)

    try:
        rounds = H.run_rounds({m: case(m) for m in presets}, args.rounds, warmup=0)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    fio_after = run_fio("after")
    fio_iops = H.median([f["iops"] for f in (fio_before, fio_after) if f])

    keys = ("epoch_s", "batches_per_s", "device_bytes", "device_mb_s", "read_iops",
            "engine_iops", "cpu_s", "cpu_us_per_row", "feature_hit_ratio", "read_efficiency",
            "peak_rss_bytes",
            "feature_read_s", "engine_busy_s", "feature_rows_direct", "feature_rows_copied",
            "feature_page_mates_read")
    meds = H.medians(rounds, keys)
    summary: dict[str, dict] = {}
    for m in presets:
        ok = [s.values for s in rounds.measured(m) if "error" not in s.values]
        if not ok:
            summary[m] = {"error": rounds.measured(m)[0].values["error"]}
            continue
        summary[m] = {k: meds[m].get(k) for k in keys}
        summary[m]["rounds"] = len(ok)
        summary[m]["read_gap"] = variant(m)[2].get("read_gap")   # None: the default
        summary[m]["reader"] = ok[0]["mode_info"].get("reader_backend", "mmap")
        summary[m]["read_align"] = ok[0]["mode_info"].get("read_align")
        for k in ("read_iops", "engine_iops"):
            if summary[m][k] and fio_iops:
                summary[m][f"{k}_vs_fio"] = summary[m][k] / fio_iops
        mid = sorted(ok, key=lambda v: v["epoch_s"])[(len(ok) - 1) // 2]   # the median epoch's
        summary[m]["by_kind"] = mid["by_kind"]
        summary[m]["bytes_written"] = mid["bytes_written"]
        summary[m]["packing"] = mid["packing"]
        summary[m]["disk_bound_s"] = disk_bound_s(mid["by_kind"], seq_read, seq_write)

    sp = H.ratios(summary, (("ooc", "baseline"), ("ooc", "static"), ("static", "baseline"),
                            ("ooc-mates", "ooc"), ("packed", "ooc")), "epoch_s")
    report = {"dataset": str(data), "disk_bytes": disk, "budget_bytes": args.budget,
              "fio": {"before": fio_before, "after": fio_after, "iops": fio_iops,
                      "seq_read_bytes_per_s": seq_read, "seq_write_bytes_per_s": seq_write},
              "presets": summary, "speedup": sp,
              "read_efficiency": {m: s["read_efficiency"] for m, s in summary.items()
                                  if s.get("read_efficiency") is not None},
              "reads_vs_fio": {m: s["read_iops_vs_fio"] for m, s in summary.items()
                               if s.get("read_iops_vs_fio") is not None},
              "engine_vs_fio": {m: s["engine_iops_vs_fio"] for m, s in summary.items()
                                if s.get("engine_iops_vs_fio") is not None},
              "read_iops_vs_fio": summary.get("ooc", {}).get("read_iops_vs_fio"),
              "engine_iops_vs_fio": summary.get("ooc", {}).get("engine_iops_vs_fio")}
    H.write_report(args.report, "loader", report, spec=spec, samples=rounds, data_path=data,
                   args=args)
    f = H.fmt

    print(f"\nData path alone (sample, gather, to_data; no model), last of {args.epochs} "
          f"epochs, medians of {args.rounds} interleaved rounds, {format_size(args.budget)} "
          f"cgroup each; fio {f(fio_iops, ',.0f')} IOPS (QD {args.queue_depth}, median of "
          f"before/after)\n")
    print("| preset | reader | epoch s | batches/s | device MiB | device MB/s | read IOPS "
          "in loader | vs fio | engine IOPS | vs fio | CPU s | CPU µs/row | feature hit "
          "| read efficiency | peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in presets:
        s = summary[m]
        if "error" in s:
            print(f"| {m} | failed: {s['error'][:120]} |")
            continue
        unit = f" ({s['read_align']} B)" if s.get("read_align") else ""
        print(f"| {m} | {s['reader']}{unit} | {s['epoch_s']:.2f} | {s['batches_per_s']:.1f} | "
              f"{s['device_bytes'] / 2**20:,.0f} | {s['device_mb_s']:,.0f} | {f(s['read_iops'], ',.0f')} "
              f"| {f(s.get('read_iops_vs_fio'), '.2f')} | {f(s['engine_iops'], ',.0f')} | "
              f"{f(s.get('engine_iops_vs_fio'), '.2f')} | {s['cpu_s']:.2f} | "
              f"{f(s['cpu_us_per_row'], '.1f')} | {f(s['feature_hit_ratio'], '.3f')} | "
              f"{f(s['read_efficiency'], '.3f')} | {format_size(s['peak_rss_bytes'] or 0)} |")
    print("\nspeedup: " + ", ".join(f"{k} {v:.2f}x" for k, v in sp.items()))
    print("reads inside the loader vs fio: " + (", ".join(
        f"{m} {v:.2f}x" for m, v in report["reads_vs_fio"].items()) or "–"))
    for m in presets:
        s = summary[m]
        if s.get("feature_read_s") is not None and s.get("engine_busy_s") is not None:
            print(f"{m}: {s['feature_read_s']:.2f} s in feature reads, {s['engine_busy_s']:.2f} s "
                  f"of them in the engine; rows read into the batch "
                  f"{f(s['feature_rows_direct'], ',.0f')}, copied from a page buffer "
                  f"{f(s['feature_rows_copied'], ',.0f')}")
    print("\nDevice reads by kind (MiB / reads) and bytes written, last epoch:\n")
    print(kinds_table(summary))
    print(f"report {args.report}")
    return 0


def kinds_table(summary: dict) -> str:
    """Per preset: MiB and reads of each kind of device read, MiB written, the packer's
    share hidden behind the epoch, and the disk's bound beside the epoch."""
    f = H.fmt
    rows = []
    for m, s in summary.items():
        if "error" in s:
            continue
        k = s["by_kind"]
        cell = [f"{k[n]['bytes'] / 2**20:,.0f} / {k[n]['reads']:,}" for n in KINDS]
        pk = s.get("packing") or {}
        rows.append([m, *cell, f(k["written"]["bytes"] / 2**20, ",.0f"),
                     f(pk.get("pack_s"), ".1f"), f(pk.get("wait_s"), ".1f"),
                     f(pk.get("hidden"), ".2f"), f(s["epoch_s"], ".1f"),
                     f(s.get("disk_bound_s"), ".1f")])
    return H.markdown(["preset", *KINDS, "written MiB", "packer s", "training waited s",
                       "packing hidden", "epoch s", "disk bound s"], rows)


def table(rep: dict) -> str:
    """The README's table of a report: per preset its read gap, epoch, device MiB, read
    efficiency, feature hit ratio, peak RSS and speed against the baseline."""
    f = H.fmt
    presets = rep["presets"]
    base = presets.get("baseline", {}).get("epoch_s")
    rows = []
    for m, s in presets.items():
        if "error" in s:
            rows.append([m, "failed", "", "", "", "", "", ""])
            continue
        gap = "–" if s.get("reader") == "mmap" else (
            "default" if s.get("read_gap") is None else format_size(s["read_gap"]))
        rows.append([m, gap, f(s["epoch_s"], ".2f"), f(s["device_bytes"] / 2**20, ",.0f"),
                     f(s.get("read_efficiency"), ".3f"), f(s.get("feature_hit_ratio"), ".3f"),
                     format_size(s.get("peak_rss_bytes") or 0),
                     f(H.ratio(base, s["epoch_s"]), ".2f")])
    return H.markdown(["preset", "read gap", "epoch s", "device MiB", "read efficiency",
                       "feature hit", "peak RSS", "vs baseline"], rows)


if __name__ == "__main__":
    sys.exit(main())
