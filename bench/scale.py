"""Every stage of ooc on a graph of papers100M's shape, scaled, as a user runs them.

    python -m bench scale --scale 0.01 --memory-budget 2GiB --report bench_out/scale.json

writes a graph of papers100M's shape scaled by S (111,059,956·S nodes, 1,615,685,872·S
directed edges that ingest stores both ways, 128-dim float32 features, 172 classes, train /
val / test 1.09% / 0.11% / 0.19% of the nodes, power-law degrees, many small communities
hidden by a random permutation of the ids: ``bench/scale_graph.py``) in OGB's binary raw
layout, then runs each stage as its own process in a memory cgroup of the budget (v1 or v2,
``ooc.executor.sizing.memcg``), with the page cache dropped first:

- ingest: ``ooc.prepare ogb --undirected``
- train: ``ooc.train`` (2 epochs, GraphSAGE, fanouts 15,10,5, batch 1024, hidden 256;
  ``--epochs`` and ``--batch-size`` change the first two)
- infer: ``ooc.infer`` (every node, all layers)
- partition: ``ooc.partition --parts 8 --features link`` (the partitions read the dataset's
  feature file: copies with their halos would take several times its features)

``--task link`` predicts edges instead: ingest holds out 1% of the edges each for validation
and test (``--link-split 0.01,0.01``, one negative each), train runs ``--task link`` (the
same GraphSAGE as the encoder, a dot-product decoder, ``--link-edges`` positives an epoch
in batches of 512, learning rate 0.0005)
and reports the split's AUC, MRR and Hits@K from every node's embedding computed layer-wise
inside the stage; the default workdir is ``bench_tmp/scale-S-link``.

The report has ``graph.{nodes,edges,feature_dim}``, ``budget_bytes``,
``stages.<stage>.{wall_s,peak_rss_bytes,planned_peak_bytes,bytes_read,bytes_written,
disk_bytes,...}`` and ``train.val_acc`` (``--task link``: ``train.{val,test}_auc``,
``train.test_mrr``, ``train.test_hits@K``). ``peak_rss_bytes`` is the stage process's own
peak (its rusage, children included when they are larger); ``cgroup_peak_bytes`` is the group's,
page cache included; ``bytes_read`` / ``bytes_written`` are block I/O of the process tree
(rusage); ``planned_peak_bytes`` is what the stage's own report says it planned, where it
says. Before writing anything the disk is checked for what the run will write. The raw
folder is kept (``--workdir``) and reused by a later run with the same parameters; each
stage's output is removed after it is measured unless ``--keep``, except what later stages
read (the dataset, the checkpoint).

``--plan-only`` writes nothing: it prints each stage's memory plan for the shape from the
planners' own formulas (``bench/scale_plan.py``), e.g. ``--scale 1 --memory-budget 4GiB``
for papers100M's full shape, and exits 1 when a stage does not fit the budget.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from ooc.core.sizes import format_size, parse_size
from ooc.executor.inference.store import partial_path
from ooc.executor.sizing import memcg

from . import harness as H
from . import scale_graph as sg

STAGES = ("ingest", "train", "infer", "partition")
HIDDEN = 256
FANOUTS = "15,10,5"
#: ``--task link``: the edges held out for validation and test (fractions)
LINK_SPLIT = "0.01,0.01"
#: ``--task link``: the learning rate (GraphSAGE with a dot-product decoder collapses to
#: equal scores, AUC 0.5, at the node task's default 0.005)
LINK_LR = "0.0005"
#: ``--task link``: the final metrics the report keeps
LINK_METRICS = ("val_auc", "val_mrr", "test_auc", "test_mrr", "test_hits@20", "test_hits@50",
                "test_hits@100")


def log(msg: str) -> None:
    print(f"bench_scale: {msg}", flush=True)


def feature_bytes(shape: sg.Shape) -> int:
    """``features.bin``'s size: float32 rows in whole pages."""
    from ooc.storage.layout import FeatureLayout

    return FeatureLayout(shape.nodes, shape.feature_dim, "float32").file_bytes


def dataset_bytes(shape: sg.Shape) -> int:
    """The ooc dataset's size: page-aligned features, int32 in-neighbours of both directions,
    indptr, labels, splits."""
    return feature_bytes(shape) + 4 * 2 * shape.edges + 16 * shape.nodes + (16 << 20)


def outputs_bytes(shape: sg.Shape, stages: list[str]) -> dict[str, int]:
    """What each stage writes beside the dataset (upper estimates)."""
    from ooc.executor.inference.store import disk_bytes
    from ooc.executor.inference.streamed import BUCKET_BYTES

    n = shape.nodes
    dims = [shape.feature_dim, HIDDEN, HIDDEN, shape.classes]  # a layer beside its input
    return {"train": 64 << 20,                                  # checkpoints, runtime files
            # as ooc.infer checks it (float32 layers, the most): the layers and a streamed
            # layer's edge buckets
            "infer": disk_bytes(n, dims, [4, 4, 4], False, True)
            + BUCKET_BYTES * 2 * shape.edges,
            # linked features: the adjacency, its offsets, row maps, labels and ids of the
            # nodes with their replicas (a factor below 2)
            "partition": 2 * (dataset_bytes(shape) - feature_bytes(shape) + 24 * n)}
    # (not every stage runs: the caller sums the ones it runs)


def check_disk(workdir: Path, shape: sg.Shape, stages: list[str], have_raw: bool,
               reclaimed: int = 0) -> dict:
    """Refuse (exit 2) when the disk under ``workdir`` cannot hold what the run writes:
    the raw graph unless ``have_raw``, the dataset and ingest's temporary files when the
    run ingests, and the largest output of the stages it runs. ``reclaimed``: bytes of
    earlier outputs the run removes before writing its own (a dataset ingested again)."""
    out = outputs_bytes(shape, stages)
    raw = 0 if have_raw else shape.raw_bytes()
    data = dataset_bytes(shape) if "ingest" in stages else 0
    # ingest places the features in a locality order through bucket files, each removed
    # once written to the file: the buckets' row ids (8 B a node) and one bucket on top;
    # before that, with several scatter windows, it routes the stored entries through
    # files of two int32 ids an entry while no feature is written yet
    extra = max(8 * shape.nodes + (512 << 20), 2 * 4 * 2 * shape.edges - feature_bytes(shape))
    largest = max([out[s] for s in stages if s in out] or [0])
    need = raw + (data + extra if data else 0) + largest
    probe = workdir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free + int(reclaimed)
    facts = {"need_bytes": need, "free_bytes": free}
    if need > free:
        log(f"error: {workdir}: the run writes about {format_size(need)} (raw graph "
            f"{format_size(raw)}, dataset {format_size(data)}, largest stage output "
            f"{format_size(largest)}) but {format_size(free)} is free")
        raise SystemExit(2)
    return facts


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def ingest_buffer(budget: int) -> int:
    """The ingest ``--buffer`` of a budget: a quarter of it, at least 64 MiB."""
    return max(64, (budget >> 20) // 4) << 20


def stage_argv(stage: str, w: dict[str, Path], budget: int, epochs: int,
               batch_size: int = 1024, way: str | None = None,
               link_edges: int | None = None, layer_dtype: str = "float32") -> list[str]:
    """The stage's command (``python ARGV``); ``way``: train's ``--mode`` (default ooc),
    infer's ``--aggregate`` (default auto); ``link_edges``: the link task, its positives
    an epoch (None: node classification); ``layer_dtype``: infer's ``--layer-dtype``."""
    b = f"{budget >> 20}MiB"
    link = link_edges is not None
    if stage == "ingest":
        return ["-m", "ooc.prepare", "ogb", "--root", str(w["raw"]), "--out", str(w["data"]),
                "--undirected", "--buffer", f"{ingest_buffer(budget) >> 20}MiB",
                *(["--link-split", LINK_SPLIT] if link else []),
                "--no-progress", "--report", str(w["reports"] / "ingest.json")]
    if stage == "train":
        return ["-m", "ooc.train", "--data", str(w["data"]), "--model", "sage",
                *(["--task", "link", "--edges-per-epoch", str(link_edges), "--lr", LINK_LR]
                  if link else []),
                "--fanouts", FANOUTS, "--batch-size", str(batch_size), "--hidden", str(HIDDEN),
                "--epochs", str(epochs), "--mode", way or "ooc",
                "--memory-budget", b, "--checkpoint-dir", str(w["ckpt"]),
                "--runtime-dir", str(w["runtime"]), "--no-progress",
                "--report", str(w["reports"] / "train.json")]
    if stage == "infer":
        return ["-m", "ooc.infer", "--data", str(w["data"]), "--checkpoint", str(w["ckpt"]),
                "--out", str(w["emb"]), "--memory-budget", b, "--no-progress",
                "--aggregate", way or "auto", "--layer-dtype", layer_dtype,
                "--report", str(w["reports"] / "infer.json")]
    return ["-m", "ooc.partition", "--data", str(w["data"]), "--parts", "8",
            "--features", "link", "--out",
            str(w["parts"]), "--quiet", "--report", str(w["reports"] / "partition.json")]


def _planned(rep: dict) -> int | None:
    """The peak a stage's report says it planned for (``planned_peak_bytes``; the training
    plan's budget less its reserve where that is all it says)."""
    if isinstance(rep.get("planned_peak_bytes"), int):
        return rep["planned_peak_bytes"]
    plan = rep.get("memory_plan") or rep.get("memory") or {}
    if isinstance(plan, dict) and isinstance(plan.get("planned_peak_bytes"), int):
        return plan["planned_peak_bytes"]
    return None


def run_stage(stage: str, w: dict[str, Path], budget: int, epochs: int, batch_size: int,
              seconds: float | None = None, way: str | None = None,
              link_edges: int | None = None, layer_dtype: str = "float32") -> dict:
    rep_path = w["reports"] / f"{stage}.json"
    rep_path.unlink(missing_ok=True)  # an earlier run's: what this one writes, or nothing
    dropped = memcg.drop_page_cache()
    r = memcg.run(stage, stage_argv(stage, w, budget, epochs, batch_size, way, link_edges,
                                    layer_dtype), budget, seconds)
    try:
        rep = json.loads(rep_path.read_text())
    except (OSError, ValueError):
        rep = {}
    cg = r.get("cgroup", {})
    res = {"rc": r["rc"], "wall_s": r["wall_s"], "peak_rss_bytes": r["child_peak_rss_bytes"],
           "planned_peak_bytes": _planned(rep), "bytes_read": r["bytes_read"],
           "bytes_written": r["bytes_written"], "cgroup_peak_bytes": cg.get("max_usage_in_bytes"),
           "cgroup_limit_hits": cg.get("failcnt"), "page_cache_dropped": dropped,
           "stopped": r["stopped"], "report": rep}
    if r["stopped"]:
        res["error"] = f"stopped by --stage-limit after {seconds:g} s"
    elif r["rc"] != 0:
        res["error"] = next((ln for ln in reversed(r["lines"]) if ln.strip()),
                            memcg.exit_words(r["rc"]))
    return res


def _table(rep: dict) -> str:
    rows = ["| stage | wall s | peak RSS | planned | read | written | on disk | rate |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    e2 = 2 * rep["graph"]["edges"]
    for name, s in rep["stages"].items():
        rate = f"{e2 / s['wall_s'] / 1e6:.1f}M edges/s" if s["rc"] == 0 and s["wall_s"] else "–"
        fmt = lambda v: format_size(v) if isinstance(v, int) else "–"  # noqa: E731
        state = "" if s["rc"] == 0 else " (stopped)" if s.get("stopped") else " (failed)"
        rows.append(f"| {name}{state} | {s['wall_s']:.1f} | "
                    f"{fmt(s['peak_rss_bytes'])} | {fmt(s['planned_peak_bytes'])} | "
                    f"{fmt(s['bytes_read'])} | {fmt(s['bytes_written'])} | "
                    f"{fmt(s.get('disk_bytes'))} | {rate} |")
    return "\n".join(rows)


def plan_only(args: argparse.Namespace, shape: sg.Shape, stages: list[str]) -> int:
    """``--plan-only``: every stage's plan for the shape (:mod:`scale_plan`); exit 1 when
    one does not fit the budget."""
    from . import scale_plan

    budget = args.memory_budget
    log(f"plan for scale {args.scale:g}: {shape.nodes:,} nodes, {shape.edges:,} directed "
        f"edges ({2 * shape.edges:,} stored), {shape.feature_dim} dims; budget "
        f"{format_size(budget)}; nothing is written")
    try:
        plans = scale_plan.plan_all(shape, budget, stages, HIDDEN,
                                    [int(f) for f in FANOUTS.split(",")], args.batch_size,
                                    ingest_buffer(budget), log=log,
                                    layer_dtype=args.layer_dtype)
    except (RuntimeError, MemoryError, OSError) as e:  # a stage's baseline child, memory
        log(f"error: --plan-only: {e}")
        raise SystemExit(2) from None
    table = scale_plan.plan_table(plans, budget)
    print(table)
    fits = {s: scale_plan.fits(p, budget, s) for s, p in plans.items()}
    if args.report:
        H.write_report(args.report, "scale",
                       {"graph": {"nodes": shape.nodes, "edges": shape.edges,
                                  "feature_dim": shape.feature_dim, "classes": shape.classes},
                        "budget_bytes": budget, "plan_only": True, "fits": fits,
                        "stages": plans, "table": table},
                       spec={"scale": args.scale}, args=args)
    return 0 if all(fits.values()) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, required=True, help="share of papers100M's size")
    ap.add_argument("--memory-budget", type=parse_size, required=True, metavar="SIZE",
                    help="memory cgroup of every stage, e.g. 4GiB")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the raw graph, the dataset and the outputs go "
                         "(default bench_tmp/scale-S)")
    ap.add_argument("--stages", default=",".join(STAGES),
                    help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None,
                    help="seeds a batch (default 1024; --task link: 512 positive edges, "
                         "each with a negative: about 2,048 seeds)")
    ap.add_argument("--task", choices=("node", "link"), default="node",
                    help="link: hold out 1%% of the edges each for validation and test and "
                         "train link prediction (metrics in the train stage's report)")
    ap.add_argument("--link-edges", type=int, default=65536, metavar="N",
                    help="--task link: positive edges an epoch trains on (default 65536)")
    ap.add_argument("--compress", action="store_true", help="deflate the raw npz members")
    ap.add_argument("--keep", action="store_true", help="keep every stage's output")
    ap.add_argument("--aggregate", default="auto",
                    help="ooc.infer's --aggregate; several, comma-separated (e.g. "
                         "auto,streamed), run the infer stage once each, in that order")
    ap.add_argument("--presets", default="ooc",
                    help="ooc.train's --mode; several, comma-separated (e.g. ooc,packed), run "
                         "the train stage once each, in that order, from the same data (infer "
                         "reads the last one's checkpoint)")
    ap.add_argument("--layer-dtype", default="float32", choices=("float32", "float16"),
                    help="ooc.infer's --layer-dtype (the layers before the last), planned "
                         "so with --plan-only")
    ap.add_argument("--report", type=Path, help="write the JSON report here")
    ap.add_argument("--plan-only", action="store_true",
                    help="print each stage's memory plan for the shape from the planners' "
                         "formulas (bench/scale_plan.py) and write nothing but --report")
    ap.add_argument("--stage-limit", type=float, default=None, metavar="SECONDS",
                    help="stop a stage after this long (reported as stopped, its peak and "
                         "bytes so far kept)")
    args = ap.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 512 if args.task == "link" else 1024
    stages = [s for s in args.stages.split(",") if s]
    if args.stage_limit is not None and not args.stage_limit > 0:
        ap.error(f"--stage-limit must be a positive number of seconds, got {args.stage_limit}")
    if args.link_edges < 1:
        ap.error(f"--link-edges must be a positive number of edges, got {args.link_edges}")
    if not 0 < args.scale <= 1 or any(s not in STAGES for s in stages):
        ap.error(f"--scale must be in (0, 1] and --stages a subset of {STAGES}")
    from ooc.executor.inference.runner import AGGREGATIONS

    if not args.aggregate or any(a not in AGGREGATIONS for a in args.aggregate.split(",")):
        ap.error(f"--aggregate: comma-separated of {', '.join(AGGREGATIONS)}")
    from ooc.executor.settings import PRESET_NAMES as modes

    if not args.presets or any(m not in modes for m in args.presets.split(",")):
        ap.error(f"--presets: comma-separated of {', '.join(modes)}")
    shape = sg.Shape.of(args.scale)
    if args.plan_only:
        return plan_only(args, shape, stages)
    link_edges = args.link_edges if args.task == "link" else None
    wd = args.workdir or H.REPO / "bench_tmp" / (f"scale-{args.scale:g}"
                                                  + ("-link" if link_edges else ""))
    w = {"raw": wd / "ogb", "data": wd / "data", "ckpt": wd / "ckpt", "runtime": wd / "runtime",
         "emb": wd / "emb.zarr", "parts": wd / "parts", "reports": wd / "reports"}
    facts = sg.written(w["raw"], shape, args.compress)
    # stages over an ingested dataset need no raw graph (it may have been removed for room)
    raw_needed = "ingest" in stages or not (w["data"] / "meta.json").is_file()
    outputs = {"ingest": w["data"], "train": w["ckpt"], "infer": w["emb"], "partition": w["parts"]}
    disk = check_disk(wd, shape, stages, facts is not None or not raw_needed,
                      reclaimed=sum(du(outputs[s]) for s in stages))
    w["reports"].mkdir(parents=True, exist_ok=True)
    log(f"scale {args.scale:g}: {shape.nodes:,} nodes, {shape.edges:,} directed edges "
        f"({2 * shape.edges:,} stored), {shape.feature_dim} dims; budget "
        f"{format_size(args.memory_budget)}; disk {format_size(disk['need_bytes'])} needed, "
        f"{format_size(disk['free_bytes'])} free; cgroup root {memcg.CGROUP_ROOT}")
    if facts is None and not raw_needed:
        log(f"no raw graph in {w['raw']}: the stages run over the dataset in {w['data']}")
        facts = {}
    if facts is None:
        t0 = time.perf_counter()
        shutil.rmtree(w["raw"], ignore_errors=True)
        facts = sg.write_ogb_binary(w["raw"], shape, args.compress, log=log)
        facts["write_s"] = round(time.perf_counter() - t0, 1)
        log(f"raw graph written in {facts['write_s']} s ({format_size(du(w['raw']))})")
    rep: dict = {"graph": {"nodes": shape.nodes, "edges": shape.edges,
                           "stored_edges": 2 * shape.edges, "feature_dim": shape.feature_dim,
                           "classes": shape.classes, **facts},
                 "budget_bytes": args.memory_budget, "disk": disk, "stages": {}}
    ways = {"infer": [a for a in args.aggregate.split(",") if a],
            "train": [m for m in args.presets.split(",") if m]}
    runs = [(s, a) for s in stages for a in ways.get(s, [None])]
    for stage, way in runs:
        name = f"{stage} ({way})" if len(ways.get(stage, ())) > 1 else stage
        if stage == "ingest":
            shutil.rmtree(w["data"], ignore_errors=True)
        elif stage in ("train", "infer", "partition"):
            shutil.rmtree(outputs[stage], ignore_errors=True)
        if stage == "infer":  # a run stopped at the stage limit leaves one to resume
            shutil.rmtree(partial_path(w["emb"]), ignore_errors=True)
        res = run_stage(stage, w, args.memory_budget, args.epochs, args.batch_size,
                        args.stage_limit, way, link_edges, args.layer_dtype)
        res["disk_bytes"] = du(outputs[stage])
        rep["stages"][name] = res
        log(f"{name}: exit {res['rc']}, {res['wall_s']} s, peak RSS "
            f"{format_size(res['peak_rss_bytes'])}" + (f": {res['error']}" if "error" in res else ""))
        if stage == "train":
            got = res["report"]
            rep["train"] = ({k: got.get(k) for k in LINK_METRICS} if link_edges else
                            {"val_acc": got.get("val_acc", got.get("final", {}).get("val_acc"))})
            epochs = got.get("epochs") or [{}]
            rep["train"]["last_epoch_s"] = epochs[-1].get("time_s")
            rep.setdefault("train_by_preset", {})[way] = rep["train"]
        if not args.keep and stage in ("infer", "partition"):
            shutil.rmtree(outputs[stage], ignore_errors=True)
        if res["rc"] != 0 and stage in ("ingest", "train"):
            log(f"{stage} failed: the stages after it need its output; stopping")
            break
    table = _table(rep)
    print(table)
    rep["table"] = table
    if args.report:
        H.write_report(args.report, "scale", rep,
                       spec={"scale": args.scale, "task": args.task, **shape_spec(shape),
                             **({"link_edges": link_edges} if link_edges else {})},
                       data_path=wd, args=args)
    return 0 if all(s["rc"] == 0 for s in rep["stages"].values()) else 1


def shape_spec(shape: sg.Shape) -> dict:
    """The generated graph's shape as the report's data spec."""
    from dataclasses import asdict

    return asdict(shape)


def table(rep: dict) -> str:
    """The README's table of a report (the plans' table with ``--plan-only``)."""
    return rep["table"] if rep.get("plan_only") else _table(rep)


if __name__ == "__main__":
    sys.exit(main())
