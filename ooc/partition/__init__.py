"""Partitioning for multi-worker training: SPRING and streaming baselines.

Library use::

    from ooc.partition import partition, partition_dataset
    a = partition(open_dataset("data/x"), parts=8, algo="spring")   # Assignment
    report = partition_dataset("data/x", "parts/x8", parts=8, algo="spring")

Every algorithm reads the dataset's edges as a chunked stream from disk
(:mod:`ooc.partition.edges`) and returns an :class:`Assignment`: one owning
partition per node. :func:`partition_dataset` then measures the partition
(:mod:`ooc.partition.metrics`) and writes one dataset per partition with the
full in-neighbour list of every owned node (:mod:`ooc.partition.split`);
with ``halo_hops=H`` (default 1) each partition holds the ``H``-hop
in-neighbourhood of its owned nodes, so an ``H``-layer GNN sees the same
neighbourhoods as on the whole graph. The metrics stay those of the
assignment under 1-hop replication (what the partitioning literature
compares); ``halo_replication_factor`` measures the halo actually written.

Output folder of :func:`partition_dataset` (written in a temp folder, renamed
when complete)::

    out/partition.json   p, algo, params, metrics, parts list
    out/owner.npy        int32 [N]: the partition that owns each global node
    out/part_000/ ...    one dataset per partition (+ global_ids.npy)
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ooc.core.errors import DatasetError, InvalidValue, IOFailure, OocError, OutputExists, setting
from ooc.core.jit import note_if_cold
from ooc.core.memory import current_rss_bytes, peak_rss_bytes, tune_malloc
from ooc.core.sizes import check_range
from ooc.partition.base import ALGORITHMS, Assignment, warm_up
from ooc.partition.baselines import edge_partition
from ooc.partition.edges import DEFAULT_CHUNK_EDGES, EdgeStream
from ooc.partition.memory_plan import plan_for
from ooc.partition.metrics import compute_metrics
from ooc.partition.precompile import compile_partition_kernels
from ooc.partition.refine import refine
from ooc.partition.split import feature_writer, part_name, write_partition
from ooc.partition.spring import TAU_FACTOR, check_thresholds, spring
from ooc.storage import Dataset, open_dataset
from ooc.storage.atomic import atomic_dir, replace_refusal, write_json
from ooc.storage.dataset import meta_checksum, sha256_file

__all__ = ["ALGORITHMS", "Assignment", "EdgeStream", "compute_metrics", "edge_partition",
           "partition", "partition_dataset", "spring"]


def _check(dataset: Dataset, parts: int, algo: str, beta: float, params: dict) -> None:
    """Refuse bad arguments before any pass: the algorithm, ``parts``, ``beta`` and
    SPRING's thresholds (``params``)."""
    if algo not in ALGORITHMS:
        raise InvalidValue(f"unknown algorithm {algo!r} (choose from {', '.join(ALGORITHMS)})")
    if not isinstance(parts, (int, np.integer)) or parts < 1:
        raise InvalidValue(f"{setting('--parts')} must be >= 1, got {parts}")
    if parts > dataset.num_nodes:
        raise InvalidValue(f"{setting('--parts')} {parts} exceeds the number of nodes "
                           f"({dataset.num_nodes})")
    check_range("--beta", beta, 1)
    if algo == "spring":
        check_thresholds(params.get("tau_vol"), params.get("tau_factor", TAU_FACTOR))


def partition(dataset: Dataset | str | os.PathLike, parts: int, algo: str = "spring", *,
              beta: float = 1.05, seed: int = 0, chunk_edges: int = DEFAULT_CHUNK_EDGES,
              progress: bool = False, refine_passes: int = 1, **params) -> Assignment:
    """Assign every node of ``dataset`` to one of ``parts`` partitions.

    ``algo`` is one of :data:`ALGORITHMS`; ``params`` go to :func:`spring`
    (``tau_vol``, ``tau_factor``, ``tie_break``, ``merge``, ``shuffle``, ``stream_iters``) or to
    :func:`edge_partition` (``shuffle``, ``lam``, ``eps``, ``ownership``). ``refine_passes``
    streaming refinement passes (:mod:`ooc.partition.refine`, the same for
    every algorithm; 0 = the algorithm's own assignment) follow; their time
    is part of ``time_s``.
    """
    if not isinstance(dataset, Dataset):
        dataset = open_dataset(dataset)
    _check(dataset, parts, algo, beta, params)
    if int(refine_passes) != refine_passes or refine_passes < 0:
        raise InvalidValue(f"--refine-passes must be an integer >= 0, got {refine_passes}")
    # every id in range and every block of indices.bin against its recorded CRC-32 (one
    # streaming pass, as train and infer do): an edit the sampled checksum misses would
    # otherwise be partitioned, and written into every partition, as is
    dataset.check_indices()
    jit = warm_up(algo, dataset.index_dtype)
    if algo == "spring":
        a = spring(dataset, parts, beta=beta, seed=seed, chunk_edges=chunk_edges,
                   progress=progress, **params)
    else:
        a = edge_partition(dataset, parts, algo, seed=seed, chunk_edges=chunk_edges,
                           progress=progress, **params)
    a.info["jit_warmup_s"] = jit
    a.params["refine_passes"] = int(refine_passes)
    if refine_passes:
        r = refine(dataset, a.owner, parts, passes=int(refine_passes), beta=beta,
                   chunk_edges=chunk_edges, progress=progress)
        a.info["refine_moved"] = r["moved"]
        a.info["refine_time_s"] = r["time_s"]
        a.time_s += r["time_s"]
    return a


def partition_dataset(data: str | os.PathLike, out: str | os.PathLike, parts: int,
                      algo: str = "spring", *, beta: float = 1.05, seed: int = 0,
                      overwrite: bool = False, split: bool = True,
                      chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: bool = False,
                      halo_hops: int = 1, precompile: bool = False, features: str = "copy",
                      **params) -> dict:
    """Partition ``data`` and write the result to ``out``; returns the report.

    The report holds ``replication_factor``, ``node_balance``,
    ``edge_balance``, ``edge_cut`` (see :mod:`ooc.partition.metrics`),
    ``time_s`` (assignment + replication pass, without writing),
    ``split_time_s``, ``total_time_s`` and ``peak_rss_bytes`` (``VmHWM`` of
    this process, whatever it did before), ``planned_peak_bytes`` (the RSS once
    the dataset is opened, ``rss_after_open_bytes``, plus the largest phase of
    :func:`~ooc.partition.memory_plan.planned_peak` for this shape and these
    options: a plan from the shape alone, the partition sizes bounded by ``N``),
    ``planned_phases`` (bytes above that RSS per phase: degrees, clustering and merge or
    assign, refine, metrics, split), ``halo_hops`` and, when the
    partitions are written, ``halo_replication_factor`` = ``Σ_i n_i / |V|``
    over the nodes ``n_i`` of each partition with its ``halo_hops``-hop halo
    (equal to ``replication_factor`` for ``halo_hops=1``). With
    ``split=False`` only ``partition.json`` and ``owner.npy`` are written.
    ``features``: ``copy`` writes each partition's feature rows, ``link`` has it read them
    from ``data``'s feature file (see :mod:`.split`), which must then stay where it is.
    ``precompile``: on a cold numba cache, compile the kernels in a child process first
    (:mod:`.precompile`), so that this process peaks as a run on a warm cache does (the
    command line does).
    ``partition.json`` records ``source_fingerprint`` (:meth:`Dataset.fingerprint` of
    ``data``), so a partition of an older version of the dataset is not reused.
    Nothing is left at ``out`` unless everything succeeded.
    """
    t_start = time.perf_counter()
    tune_malloc()  # freed arrays go back to the OS: each phase's RSS is what it holds
    dataset = open_dataset(data)
    rss_open = current_rss_bytes()
    _check(dataset, parts, algo, beta, params)
    if not isinstance(halo_hops, (int, np.integer)) or halo_hops < 1:
        raise InvalidValue(f"--halo-hops must be >= 1, got {halo_hops}")
    feature_writer(features)  # a bad choice is refused before any pass
    out = _check_output(dataset, data, out, overwrite)
    if precompile:
        _precompile(dataset, parts, algo, split, halo_hops, params)
    a = partition(dataset, parts, algo, beta=beta, seed=seed, chunk_edges=chunk_edges,
                  progress=progress, **params)
    a.vertex_cut = None  # not written; frees N * ceil(p / 64) words before the split
    metrics, bits = compute_metrics(dataset, a.owner, parts, chunk_edges, progress,
                                    return_bits=True)
    t_split = time.perf_counter()
    try:
        with atomic_dir(out, overwrite=overwrite, locked="partition output",
                        inputs=(data,), what="partitions") as tmp:
            np.save(tmp / "owner.npy", a.owner.astype(np.int32))
            parts_list = _write_parts(dataset, a.owner, bits, parts, tmp, algo, chunk_edges,
                                      progress, halo_hops, features) if split else []
            split_time = time.perf_counter() - t_split
            report = _partition_report(dataset, out, a, metrics, algo, parts, beta, split,
                                       halo_hops, parts_list, split_time, t_start)
            report["features"] = features
            _add_plan(report, dataset, a, chunk_edges, rss_open)
            write_json(tmp / "partition.json", report)
            _seal(tmp / "partition.json")
    except OocError:
        raise
    except OSError as e:
        raise IOFailure(f"{out}: {e.strerror or e} while writing partitions; nothing was written") \
            from None
    return report


def _seal(path: Path) -> None:
    """Add to the written ``partition.json`` at ``path`` the sha256 of ``owner.npy`` beside
    it (``owner_sha256``) and its own checksum (``checksum``,
    :func:`~ooc.storage.dataset.meta_checksum` of its fields as written), so that a later
    run can tell an intact partition folder (:func:`reuse_problem`)."""

    rec = json.loads(path.read_text())
    rec["owner_sha256"] = sha256_file(path.parent / "owner.npy")
    rec["checksum"] = meta_checksum(rec)
    write_json(path, rec)


def reuse_problem(out: Path, fingerprint: dict) -> str | None:
    """Why the partition folder ``out`` may not be used for the dataset whose
    :meth:`~ooc.storage.Dataset.fingerprint` is ``fingerprint`` (None: it may): its
    ``partition.json`` unreadable or not matching its checksum, made from another version
    of the dataset, ``owner.npy`` not matching its sha256, or a partition that does not
    open (:func:`~ooc.storage.open_dataset`'s checks: sizes, checksums, fields)."""

    try:
        rec = json.loads((out / "partition.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        return f"{out / 'partition.json'} is unreadable ({e})"
    if not isinstance(rec, dict) or rec.get("checksum") != meta_checksum(rec):
        return f"{out / 'partition.json'} does not match its checksum (edited or corrupted)"
    if rec.get("source_fingerprint") != fingerprint:
        return f"the dataset changed since {out} was made"
    owner = out / "owner.npy"
    if not owner.is_file() or sha256_file(owner) != rec.get("owner_sha256"):
        return f"{owner} does not match its checksum in partition.json"
    for q in range(int(rec.get("p", 0)) if rec.get("split", True) else 0):
        try:
            open_dataset(out / part_name(q))
        except DatasetError as e:
            return str(e)
    return None


def _precompile(dataset: Dataset, parts: int, algo: str, split: bool, halo_hops: int,
                params: dict) -> None:
    note_if_cold(("ooc.partition._kernels", "ooc.partition._spring_kernels"),
                 "the partitioning kernels")
    compile_partition_kernels(dataset, parts, algo, split=split, halo_hops=halo_hops,
                              **params)  # refine_passes among them, when given


def _check_output(dataset: Dataset, data: str | os.PathLike, out: str | os.PathLike,
                  overwrite: bool) -> Path:
    """``out`` as a :class:`Path`, once it is known to be a valid output folder: absent
    (or ``overwrite``), not the dataset folder nor inside it, and one that may be
    replaced (:func:`~ooc.storage.atomic.replace_refusal`)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExists(f"{out}: already exists (pass --overwrite to replace it)")
    if out.resolve() == dataset.path.resolve() or dataset.path.resolve() in out.resolve().parents:
        raise InvalidValue(f"{out}: the output folder must not be the dataset folder or inside it")
    if os.path.lexists(out):
        problem = replace_refusal(out, (data,), "partitions")
        if problem:
            raise InvalidValue(f"{out}: {problem}")
    return out


def _write_parts(dataset: Dataset, owner: np.ndarray, bits: np.ndarray, parts: int,
                 tmp: Path, algo: str, chunk_edges: int, progress: bool,
                 halo_hops: int, features: str = "copy") -> list[dict]:
    """Write every partition's dataset under ``tmp``; their summaries, in partition order.

    ``owner``: int [N] owning partition of every node; ``bits``: the replica bitmap of
    :func:`ooc.partition.metrics.replica_bits`. One global-to-local scratch array (int
    [N] in the dataset's index dtype: 4 bytes a node below 2^31 nodes) serves every
    partition.
    """
    g2l = np.full(dataset.num_nodes, -1, dtype=dataset.index_dtype)
    return [write_partition(dataset, owner, bits, q, parts, tmp / part_name(q), g2l, algo,
                            chunk_edges, progress, halo_hops, features)
            for q in range(parts)]


def _add_plan(report: dict, dataset: Dataset, a: Assignment, chunk_edges: int,
              rss_open: int) -> None:
    """Put the run's memory plan in ``report``: ``rss_after_open_bytes``,
    ``planned_phases`` (:func:`~ooc.partition.memory_plan.planned_peak` for the dataset's
    shape and the options the algorithm ran with, bytes above that RSS per phase),
    ``planned_peak_phase``, ``planned_peak_bytes`` (their sum at the largest phase) and
    ``planned_assumed`` (the sizes the plan bounded or assumed: partition, clusters)."""

    pr = a.params
    plan = plan_for(dataset, report["p"], algo=report["algo"], chunk_edges=chunk_edges,
                    split=report["split"], halo_hops=report["halo_hops"],
                    refine_passes=int(pr.get("refine_passes", 1)),
                    beta=float(report["params"].get("beta", 1.05)),
                    merge=str(pr.get("merge", "vote")), tie_break=str(pr.get("tie_break", "id")),
                    ownership=str(pr.get("ownership", "majority")),
                    features=str(report.get("features", "copy")))
    report["rss_after_open_bytes"] = int(rss_open)
    report["planned_peak_bytes"] = int(rss_open) + plan["peak_bytes"]
    report["planned_peak_phase"] = plan["peak_phase"]
    report["planned_phases"] = plan["phases"]
    report["planned_assumed"] = plan["assumed"]


def _partition_report(dataset: Dataset, out: Path, a: Assignment, metrics: dict, algo: str,
                      parts: int, beta: float, split: bool, halo_hops: int,
                      parts_list: list[dict], split_time: float, t_start: float) -> dict:
    """The report of :func:`partition_dataset` (``partition.json``); ``total_time_s`` and
    ``peak_rss_bytes`` are taken now, ``t_start`` being when the call began."""
    report = {
        "data": str(dataset.path), "out": str(out), "algo": algo, "p": parts,
        "params": {**a.params, **({"beta": beta} if algo == "spring" else {})},
        "info": a.info,
        "replication_factor": metrics["replication_factor"],
        "node_balance": metrics["node_balance"],
        "node_balance_with_replicas": metrics["node_balance_with_replicas"],
        "edge_balance": metrics["edge_balance"],
        "edge_cut": metrics["edge_cut"],
        "edge_cut_ratio": metrics["edge_cut_ratio"],
        "num_nodes": metrics["num_nodes"], "num_edges": metrics["num_edges"],
        "assign_time_s": a.time_s,
        "metrics_time_s": metrics["metrics_time_s"],
        "time_s": a.time_s + metrics["metrics_time_s"],
        "split_time_s": split_time if split else 0.0,
        "total_time_s": time.perf_counter() - t_start,
        "peak_rss_bytes": peak_rss_bytes(),
        "split": split,
        "halo_hops": int(halo_hops),
        "parts": parts_list or metrics["partitions"],
        "source_fingerprint": dataset.fingerprint(),
    }
    if split:
        report["halo_replication_factor"] = \
            sum(pq["nodes"] for pq in parts_list) / dataset.num_nodes
    return report
