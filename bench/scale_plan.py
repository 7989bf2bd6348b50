"""Each stage's memory plan for a graph of papers100M's shape scaled by S, from the planners'
own formulas, without writing data (``python -m bench scale --scale 1 --plan-only``).

Every stage's plan is its planner's function evaluated for the shape:

- ingest: :func:`ooc.storage.ingest.limits.planned_peak` (16 B a node, the buffer's phases,
  the locality reorder of the features) with ``bench_scale``'s ``--buffer``;
- train: :func:`ooc.executor.sizing.plan.compose_plan`, as `plan_memory` composes it, over a
  :class:`~ooc.executor.sizing.plan.DatasetShape` of the shape. The terms that grow with N
  are computed (the node -> row map, 4 B a node, in ``setup_rss``; the sampler's compact
  ``indptr``, :class:`~ooc.storage.offsets.NodeOffsets`; the neighbour cache's build
  transient, :func:`~ooc.caches.neighbor_cache.build_bytes`; the superbatch's id table).
  The loop is what the probe holds: the batches in flight
  (:func:`~ooc.executor.loader.pipelines.batches_in_flight`) with their gathered rows and
  one training step's computed estimate (:func:`~ooc.executor.sizing.step_memory.step_bytes`).
  The batches themselves do not depend on N once the graph is large: 1,024 seeds with
  fanouts 15,10,5 sample 247k nodes at scale 0.01, 331k at 0.05 and 333k at 0.1. They are
  sampled, with ooc's sampler and the run's seeds, from the generator's graph at
  ``min(S, CALIBRATION_SCALE)`` built in memory (34 s and 0.9 GiB at 0.05), the same graph
  ``bench_scale`` writes at that scale. The caches take what the budget leaves;
- infer: every layer's streamed plan (:func:`ooc.executor.inference.streamed.plan_stream`,
  the way layers of this size run) above the RSS the run starts layers with: 12 B a node
  of processing order, its inverse and the local-id map, and 4 of the row map;
- partition: :func:`ooc.partition.memory_plan.planned_peak` (partitions bounded by N).

The constant part of each (interpreter, libraries, numba kernels, the model) is measured
in a child process that imports what the stage imports and loads its kernels, as the
stage's own RSS baseline is.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from ooc.core.sizes import format_size

from . import scale_graph as sg
from .harness import epoch_plan

#: Scale of the generator's graph the batches are sampled from when S is larger: a batch's
#: sampled nodes stop growing from about here (331k at 0.05, 333k at 0.1).
CALIBRATION_SCALE = 0.05
#: Bytes of per-node state ooc.infer holds before a streamed layer over a dataset stored in
#: the locality order it processes: the processing order (int32); its inverse is the
#: dataset's row map on disk, whose pages a pass maps and drops (see
#: :mod:`ooc.executor.inference.layerwise`).
INFER_BYTES_PER_NODE = 4
INFER_CHUNK_ROWS = 32768
#: The share of the edges a column-sliced layer finds local to its blocks of rows (see
#: :mod:`ooc.executor.inference.sliced`) on the generator's graph in its locality order:
#: 0.706 measured at scale 0.01 (blocks of 32,768 rows, halos of 1,025; the generator puts
#: ``p_in`` = 0.7 of the edges inside communities of 128 nodes, which the order keeps
#: together, so the share does not fall with the scale).
INFER_LOCAL_SHARE = 0.70

_BASE_CODE = {
    "ingest": ("import ooc.prepare, ooc.storage.ingest\n"
               "from ooc.storage.ingest.limits import load_kernels\nload_kernels()\n"),
    "partition": ("import numpy as np, ooc.partition\n"
                  "from ooc.partition.base import warm_up\nwarm_up('spring', np.int32)\n"),
    "infer": ("import torch, torch_geometric, zarr, ooc.infer, ooc.executor.inference\n"
              "from ooc.executor.training.models import build_model\n"
              "from ooc.storage.ingest.limits import load_kernels\n"
              "load_kernels()  # numba's runtime, which the layers' kernels load\n"
              "model = build_model('sage', {dim}, {hidden}, {classes}, {layers}).eval()\n"),
    "train": (
        "import ooc.train, numpy as np, torch\n"
        "from ooc.executor.loader.presets import resolve_preset\n"
        "from ooc.executor.sizing.budget import warm_up_kernels\n"
        "from ooc.executor.training.models import build_model\n"
        "warm_up_kernels(resolve_preset('ooc'), {dim}, np.float32, np.int32, {edges})\n"
        "model = build_model('sage', {dim}, {hidden}, {classes}, {layers})\n"),
}
_RSS_CODE = ("\nimport gc; gc.collect()\nfrom ooc.core.memory import current_rss_bytes, trim_malloc\n"
             "trim_malloc(); print(current_rss_bytes())\n")


def base_rss(stage: str, shape: sg.Shape, hidden: int, layers: int) -> int:
    """RSS of a fresh process once it holds what ``stage`` holds before its data: its
    imports, and for training the mode's numba kernels loaded and the model built."""
    code = _BASE_CODE[stage].format(dim=shape.feature_dim, edges=2 * shape.edges, hidden=hidden,
                                    classes=shape.classes, layers=layers) + _RSS_CODE
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"measuring the {stage} baseline failed: "
                           f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return int(p.stdout.split()[-1])


def in_memory_graph(shape: sg.Shape) -> tuple[np.ndarray, np.ndarray]:
    """The generator's graph as ``bench_scale``'s ingest stores it (both directions, no
    dedup, each list sorted): ``(indptr int64 [N+1], indices int32 [2E])`` of in-neighbours,
    built in memory with ingest's kernels."""
    from ooc.storage.ingest import _kernels as K
    from ooc.storage.ingest.edgelist import count_pass
    from ooc.storage.ingest.synthetic import SyntheticEdges, communities_of

    n = shape.nodes
    source = SyntheticEdges(n, shape.edges, shape.classes, shape.p_in, shape.seed,
                            communities=communities_of(n, shape.classes, shape.community_size))
    counts = count_pass(source, n, undirected=True, drop_self=False, progress=False)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    del counts
    cursor = indptr[:-1].copy()
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    for src, dst, _, _ in source.chunks(1 << 22, n):
        K.scatter_window(src, dst, 0, n, cursor, indices, True, False)
    del cursor
    K.sort_segments(indices, indptr, False, np.empty(n, dtype=np.int64))
    return indptr, indices


def sample_batches(shape: sg.Shape, fanouts: list[int], batch_size: int, count: int) -> dict:
    """The first ``count`` training batches of epoch 1 (the run's seeds: the default
    ``--seed``), sampled from :func:`in_memory_graph` of ``shape``; their sizes."""
    from ooc.executor.training.config import TrainConfig
    from ooc.sampling.pipeline import bytes_per_batch
    from ooc.sampling.sampler import NeighborSampler
    from ooc.storage.neighbors import InMemoryNeighbors

    indptr, indices = in_memory_graph(shape)
    train = sg.split_ids(shape)[0]
    seed = TrainConfig().seed
    seeds, bseeds = epoch_plan(train, batch_size, seed, 1)
    sampler = NeighborSampler(indptr, InMemoryNeighbors(indices), fanouts)
    batches = sampler.sample_many(seeds[:count], bseeds[:count])
    big = max(batches, key=lambda b: b.num_nodes)
    return {"scale": shape.scale, "nodes": [b.num_nodes for b in batches],
            "arrays_bytes": [int(b.node_ids.nbytes + b.edge_index.nbytes) for b in batches],
            "largest": {"hop_nodes": list(map(int, big.num_sampled_nodes)),
                        "hop_edges": list(map(int, big.num_sampled_edges)),
                        "seeds": int(big.num_seeds)},
            "runtime_bytes_per_batch": float(bytes_per_batch(batches, len(fanouts))),
            "nonempty_fraction": float(np.count_nonzero(np.diff(indptr))) / shape.nodes}


def train_in_flight() -> int:
    """Batches the training loop holds at once (preset ``ooc``, one gather thread), as many
    as the planner's probe samples."""
    from ooc.executor.loader.pipelines import batches_in_flight, gather_threads
    from ooc.executor.loader.presets import resolve_preset

    return batches_in_flight(gather_threads(resolve_preset("ooc").policy.schedule, 1))


def ingest_plan(shape: sg.Shape, budget: int, base: int, buffer: int) -> dict:
    from ooc.storage.ingest.limits import BYTES_PER_NODE, LABEL_BYTES_PER_NODE, planned_peak
    from ooc.storage.layout import FeatureLayout

    layout = FeatureLayout(shape.nodes, shape.feature_dim, "float32")
    # an OGB ingest writes the labels in pieces (labels_held False)
    peak = planned_peak(base, shape.nodes, 2 * shape.edges, buffer, 4, layout.row_bytes, layout,
                        labels_held=False)
    return {"planned_peak_bytes": peak, "base_bytes": base, "buffer_bytes": buffer,
            "per_node_bytes": BYTES_PER_NODE - LABEL_BYTES_PER_NODE}


def train_plan(shape: sg.Shape, budget: int, base: int, batches: dict, hidden: int,
               fanouts: list[int], batch_size: int) -> dict:
    """The training plan (:func:`~ooc.executor.sizing.plan.compose_plan`, as
    :func:`~ooc.executor.sizing.budget.plan_memory` composes it) for the shape, preset
    ``ooc`` with its defaults, one gather thread; the working memory the planner measures
    is computed here (:func:`train_working`)."""
    from ooc.caches.neighbor_cache import full_bytes
    from ooc.executor.loader.presets import resolve_preset
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.sizing.plan import DatasetShape, build_transient, compose_plan

    n, e = shape.nodes, 2 * shape.edges
    listed = int(batches["nonempty_fraction"] * n)   # a full neighbour cache: every list
    ds = DatasetShape(num_nodes=n, num_edges=e, feature_dim=shape.feature_dim,
                      feature_itemsize=4, index_itemsize=4,
                      train_count=len(sg.split_ids(shape)[0]),
                      full_neighbor_cache_bytes=full_bytes(n, listed, e, 4))
    preset, opts = resolve_preset("ooc"), ModeOptions()
    working, terms = train_working(ds, preset, base, batches, hidden, len(fanouts),
                                   shape.classes)
    plan = compose_plan(ds, working, budget, preset, opts, batch_size=batch_size)
    return {"planned_peak_bytes": plan.planned_peak_bytes, "min_budget": plan.min_budget,
            "reserve": plan.reserve, "working": plan.working,
            "stages": {"setup_rss": working.setup_rss, "row_map": 4 * n, "base": base,
                       "loop_peak": working.loop_peak, **terms,
                       "build_transient": build_transient(ds, preset, opts),
                       "superbatch": plan.stages["superbatch"]},
            "superbatch_size": plan.superbatch_size,
            "feature_cache_rows": plan.feature_cache_rows,
            "feature_cache_bytes": plan.feature_cache_bytes,
            "neighbor_cache_bytes": plan.neighbor_cache_bytes, "batches": batches}


def train_working(ds, preset, base: int, batches: dict, hidden: int, layers: int,
                  classes: int) -> tuple:
    """What :func:`~ooc.executor.sizing.budget.measure_working` would measure for a dataset
    of shape ``ds`` (a :class:`~ooc.executor.sizing.plan.DatasetShape`): ``setup_rss`` is
    the base and the node -> row map (4 B a node, faulted in); the loop holds the sampler's
    compact ``indptr`` (:class:`~ooc.storage.offsets.NodeOffsets`), the batches in flight
    with their gathered rows (and the page-mate rows of one) and one training step's
    computed estimate (a SAGE model of ``hidden``, ``layers`` and ``classes``). Returns
    the :class:`~ooc.executor.sizing.plan.Working` and the loop's terms by name."""
    from ooc.executor.sizing.plan import Working
    from ooc.executor.sizing.step_memory import step_bytes
    from ooc.executor.training.models import build_model
    from ooc.storage.offsets import NodeOffsets

    n, row = ds.num_nodes, ds.row_bytes
    offsets = NodeOffsets.bytes_for(n)                          # 4.125 B a node
    mates = preset.policy.mate_fraction(ds.row_pages())  # page-mate rows, one buffer at a time
    held = sum(k * row + b for k, b in zip(batches["nodes"], batches["arrays_bytes"], strict=True)) \
        + int(mates * max(batches["nodes"])) * row
    model = build_model("sage", ds.feature_dim, hidden, classes, layers)
    big = batches["largest"]
    step = step_bytes(model, big["hop_nodes"], big["hop_edges"], big["seeds"])
    assert step is not None
    working = Working(setup_rss=base + 4 * n, loop_peak=offsets + held + step.total,
                      bytes_per_batch=batches["runtime_bytes_per_batch"],
                      ids_per_batch=float(np.mean(batches["nodes"])))
    return working, {"sampler_offsets": offsets, "batches_in_flight": held,
                     "step_estimate": step.total}


def infer_plan(shape: sg.Shape, budget: int, base: int, hidden: int, layers: int,
               layer_dtype: str = "float32") -> dict:
    """Every layer's plans (SAGE's mean, the layers before the last stored as
    ``layer_dtype``, float32 features) from the RSS the run holds before
    its layers: streamed groups and column slices, the one planned to move fewer bytes
    (read, and scratch written) taken, as ``ooc.infer``'s ``auto`` does at this size (the
    blocks are not planned above 2^25 edges); a sliced layer after one with the same blocks
    reads the edges it sorted, and the column files the layer before wrote."""
    from ooc.executor.inference.memory_plan import BlockCosts
    from ooc.executor.inference.sliced import SlicePlan, plan_sliced
    from ooc.executor.inference.streamed import StreamPlan, plan_stream
    from ooc.storage.layout import FeatureLayout

    n, e = shape.nodes, 2 * shape.edges
    rss0 = base + INFER_BYTES_PER_NODE * n
    lay = FeatureLayout(n, shape.feature_dim, "float32")
    dims = [shape.feature_dim] + [hidden] * (layers - 1) + [shape.classes]
    item = np.dtype(layer_dtype).itemsize
    out: list[dict | None] = []
    sorted_by: SlicePlan | None = None  # the layer whose sorted edges the run holds
    for l in range(layers):
        d_in, d_out = dims[l], dims[l + 1]
        if l == 0:
            in_row, table, unit = lay.row_bytes, lay.file_bytes, max(1, lay.rows_per_page)
            align = unit
        else:
            in_row, table, unit, align = item * d_in, item * n * d_in, INFER_CHUNK_ROWS, 1
        costs = BlockCosts.estimate(d_in, d_out)
        stream = plan_stream("mean", n, e, d_in, d_out, in_row, table, budget,
                             INFER_CHUNK_ROWS, unit, align, costs, rss0=rss0)
        # the dataset is stored in the locality order it is processed in: the edges are
        # sorted into that order once a layer, and those local to a block of rows are
        # reduced in the rows pass
        args = ("mean", n, e, d_in, d_out, in_row, table, table, budget, INFER_CHUNK_ROWS,
                costs, True)
        # a later layer's column files are written by the layer before, with its output
        kw: dict = dict(rss0=rss0, aligned=True, local_share=INFER_LOCAL_SHARE,
                        src_align=align, columns_ready=l > 0,
                        col_dtype=layer_dtype if l > 0 else lay.dtype)
        sliced = plan_sliced(*args, **kw)
        if sliced is not None and sorted_by is not None and \
                (sorted_by.local_rows, sorted_by.halo) == (sliced.local_rows, sliced.halo):
            sliced = plan_sliced(*args, **kw, edges_sorted=True)  # an earlier layer's
        ways: dict[str, StreamPlan | SlicePlan] = {
            k: p for k, p in (("streamed", stream), ("sliced", sliced)) if p is not None}
        if not ways:
            out.append(None)
            continue
        # the fewest bytes moved (scratch files are written and read again), as ooc.infer
        p = ways[min(ways, key=lambda k: ways[k].planned_bytes + ways[k].write_bytes)]
        if isinstance(p, SlicePlan) and p.sorted_edges:
            sorted_by = p
        out.append({"layer": l + 1, **p.as_dict(), "planned_bytes": p.planned_bytes,
                    "groups": p.groups if isinstance(p, StreamPlan) else p.slices,
                    "ways": {k: q.planned_bytes for k, q in ways.items()},
                    "ways_written": {k: q.write_bytes for k, q in ways.items()},
                    "input_bytes": table,
                    "output_bytes": (item if l + 1 < layers else 4) * n * d_out})
    fits = all(p is not None for p in out)
    return {"planned_peak_bytes": max(p["planned_peak_bytes"] for p in out if p) if fits
            else None,
            "start_rss_bytes": rss0, "base_bytes": base, "per_node_bytes": INFER_BYTES_PER_NODE,
            "bytes_read": sum(p["planned_bytes"] for p in out if p) if fits else None,
            "layers": out}


def partition_plan(shape: sg.Shape, base: int, parts: int = 8) -> dict:
    from ooc.partition.memory_plan import planned_peak

    plan = planned_peak(shape.nodes, 2 * shape.edges, parts=parts, feature_dim=shape.feature_dim,
                        features="link")
    return {"planned_peak_bytes": base + plan["peak_bytes"], "base_bytes": base, **plan}


def plan_all(shape: sg.Shape, budget: int, stages: list[str], hidden: int, fanouts: list[int],
             batch_size: int, buffer: int, log=print, layer_dtype: str = "float32") -> dict:
    """Every stage's plan in ``stages`` (a subset of ingest, train, infer, partition)."""
    layers = len(fanouts)
    out: dict = {}
    for stage in stages:
        base = base_rss(stage, shape, hidden, layers)
        if stage == "ingest":
            out[stage] = ingest_plan(shape, budget, base, buffer)
        elif stage == "train":
            calib = sg.Shape.of(min(shape.scale, CALIBRATION_SCALE))
            log(f"sampling {batch_size}-seed batches of the generator's graph at scale "
                f"{calib.scale:g} ({calib.nodes:,} nodes, built in memory)")
            batches = sample_batches(calib, fanouts, batch_size, count=train_in_flight())
            out[stage] = train_plan(shape, budget, base, batches, hidden, fanouts, batch_size)
        elif stage == "infer":
            out[stage] = infer_plan(shape, budget, base, hidden, layers, layer_dtype)
        else:
            out[stage] = partition_plan(shape, base)
    return out


def _infer_layer(i: int, q: dict | None) -> str:
    """One inference layer's plan in words: the way, its passes, its reads against its
    input plus output."""
    if q is None:
        return f"layer {i + 1}: neither a group of accumulators nor a column fits"
    unit = "groups" if q["mode"] == "streamed" else "column slices"
    ratio = q["planned_bytes"] / (q["input_bytes"] + q["output_bytes"])
    return (f"layer {i + 1}: {q['mode']}, {q['groups']} {unit}, reads "
            f"{format_size(q['planned_bytes'])} ({ratio:.1f}x input + output)")


def fits(plan: dict, budget: int, stage: str) -> bool:
    """Whether the stage's plan holds within ``budget`` (training: its smallest budget)."""
    if stage == "train":
        return plan["min_budget"] <= budget
    peak = plan.get("planned_peak_bytes")
    return peak is not None and peak <= budget


def plan_table(plans: dict, budget: int) -> str:
    """One row a stage: its planned peak against the budget and what it is made of."""
    rows = ["| stage | planned peak | fits | of which |", "|---|---:|---|---|"]
    fmt = format_size
    for stage, p in plans.items():
        peak = p.get("planned_peak_bytes")
        if stage == "train":
            s = p["stages"]
            what = (f"set-up {fmt(s['setup_rss'])} (row map {fmt(s['row_map'])}), loop "
                    f"{fmt(s['loop_peak'])} (sampler offsets {fmt(s['sampler_offsets'])}, "
                    f"{len(p['batches']['nodes'])} batches of ~{int(np.mean(p['batches']['nodes'])):,} "
                    f"nodes), superbatch {fmt(s['superbatch'])}, caches "
                    f"{fmt(p['feature_cache_bytes'] + p['neighbor_cache_bytes'])}; smallest "
                    f"budget {fmt(p['min_budget'])}")
        elif stage == "infer":
            what = (f"start {fmt(p['start_rss_bytes'])} ({p['per_node_bytes']} B a node); "
                    + ", ".join(_infer_layer(i, q) for i, q in enumerate(p["layers"])))
        elif stage == "partition":
            what = f"{p['peak_phase']} ({p['per_node'][p['peak_phase']]} B a node above the base)"
        else:
            what = f"{p['per_node_bytes']} B a node, buffer {fmt(p['buffer_bytes'])}"
        ok = fits(p, budget, stage)
        rows.append(f"| {stage} | {fmt(peak) if peak else '–'} | {'yes' if ok else 'NO'} | "
                    f"{what}; base {fmt(p['base_bytes'] if 'base_bytes' in p else p['stages']['base'])} |")
    return "\n".join(rows)
