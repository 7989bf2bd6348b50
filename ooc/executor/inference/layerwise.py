"""Layer-wise full-graph inference with Zarr layer stores (GLISP §III-D, DESIGN.md §6).

An L-layer GNN is sliced into L one-layer GNNs. Layer ``l`` is computed for
every node from the layer ``l-1`` rows of its *full* in-neighbourhood (no
sampling): layer 0 reads ``features.bin`` through the storage readers, layer
``l >= 1`` reads the Zarr array ``h{l}`` that the previous layer wrote. Each
node's embedding is computed once per layer, so the redundant computation of
sample-wise inference (every target recomputing its own L-hop tree) is gone.

Output: a Zarr v3 group at ``out`` with arrays ``h1`` .. ``hL`` ([N, d_l],
rows chunked by ``chunk_rows``; ``hL`` is the model output, float32; the layers
before it float32 or, with ``layer_dtype="float16"``, float16), ``pred`` (int64
argmax of ``hL``) and, when the processing order is not node id order,
``row_of_node`` (int64 [N]). A layer is deleted once the next one is complete
(only ``hL`` stays) unless ``keep_layers``. The disk the run needs at its
fullest (a layer beside its input, or every layer kept) is checked before
anything is written. Rows are stored in *processing order*
(GLISP assigns local ids in PDS order for the same reason: the previous layer
is then read nearly sequentially): row ``row_of_node[v]`` holds node ``v``. In
node id order (``order="natural"``, the default without a partitioning)
row == node id. :func:`read_embeddings` does the mapping.

Order (``order=``):

* ``"natural"``: node id order. On locality-ordered ids (ingest keeps the
  source order; a partitioner or RCM relabelling makes neighbours close) a
  block's neighbours fall in a few chunks of the previous layer.
* ``"pds"``: GLISP's Partition-based Degree Sort, sort by (partition,
  -in-degree): needs a partition assignment (``partition=`` array or a path to
  ``owner.npy``; ``auto`` looks for ``<dataset>/owner.npy``).
* ``"degree"``: DS, by in-degree descending (for comparison).
* an int array of length N: a partition assignment, PDS over it.

Cache: the previous layer's chunks are read through a memory cache sized from
the budget. The access sequence (the sorted chunk ids every block needs,
block after block) is computed before the layer starts, so the cache evicts
with Belady's MIN (furthest next use, with bypass); ``policy="lru"``/``"fifo"``
for comparison. GLISP's first cache level (a local disk copy of remote
chunks) is not needed here: the store is already on the local disk.

Memory: ``memory_budget`` bounds the whole process. Per node, before any layer: the
processing order (int32 below 2^31 nodes: 4 bytes a node) and its inverse (4 more,
except over a dataset stored in the locality order it processes, whose own row map on
disk is that inverse); a layer run in blocks adds the kernels' node -> local id map (4).
The pages of ``indptr.npy``, ``indices.bin`` and the row map a pass reads are dropped
after it. At the
start of each layer the resident size is measured, and so is the layer itself: it runs on
probe graphs of known sizes and the kernel's peak RSS gives its bytes per
target, local node and edge (:func:`.memory_plan.measure_costs`). What the
budget leaves (minus two output chunk buffers and a margin) goes to blocks of consecutive
targets, sized by the rows they hold: the distinct local nodes (targets and
in-neighbours) are counted exactly, a block may span output chunks, and its
targets run through the layer a sub-block at a time (an eighth of the memory),
each on its own local graph, their outputs going straight to the output chunk.
A single node whose in-neighbourhood alone exceeds a block still gets one of
its own. Peak RSS is sampled and reported (per layer too). Every layer plans
its reads two ways and takes the one that reads fewer bytes: the blocks read
the pages of the rows they need (deduplicated per block: layer 0 through the
O_DIRECT feature reader in file order, a later layer from the previous layer's
chunk files, :mod:`.chunk_rows`), every byte going to blocks; or half the
memory caches whole input chunks and smaller blocks take their rows from it.
When the budget makes a layer read its input more than three times over, a
note names the budget that reads it once (a streamed layer: in one pass).

Streamed aggregation (:mod:`.streamed`): a layer whose convolution is a plain mean, sum or
max of its in-neighbours' rows (``SAGEConv``) and that does not fit one block keeps a
float32 accumulator per target for a group of output rows, streams its input table in
stored order adding each edge's source row in, and runs the layer on each target with
its reduced row as a single virtual neighbour. Reads are sequential: the table once per
group and once for the targets' own rows, plus the edges bucketed by (group, source
chunk), 8 bytes an edge.

Column slices (:mod:`.sliced`): the same reduction is independent per column, so a layer
may instead hold a slice of the columns of *every* input row (float32 [input rows, slice
columns]) and walk every target's in-edges once a slice, writing each target's reduced
values of those columns; a rows pass then runs the layer on each target's own row and
its reduced row. The input is read about once however small the budget (once into
per-slice column files, once from them, once for the targets' own rows, plus the reduced
rows once), the edges once a slice (sorted into row order once per run, 4 bytes an edge);
edges whose source lies in the rows pass's block of rows and halo (in a locality order,
most of them) are reduced there instead, from rows it reads anyway.

Which way: a reducing layer that one block cannot hold is planned in column slices and in
streamed groups (and, up to :data:`.runner.COMPARE_EDGES` edges, in blocks), and the way
planned to move the fewest bytes runs (read, and scratch written besides the output);
each layer's report names it (``reads.mode``) and gives every way's planned bytes read
(``planned_bytes``) and written (``planned_written``). ``aggregate="blocks"`` /
``"streamed"`` / ``"sliced"`` forces one. Each layer's report gives the peak its plan
allows for (``planned_peak_bytes``), the run's report the largest of them.

Atomic output: everything is written into ``.<name>.partial`` beside
``out`` (:func:`partial_path`) and renamed to ``out`` when every array is
complete, so a killed or failed run never leaves anything at ``out`` that
opens as a store. With ``overwrite`` an existing output of ``ooc.infer`` is
replaced by that rename (an atomic exchange of the two names where Linux
offers ``renameat2``); a folder that is not one is never replaced. A full
disk removes the partial folder and raises a one-line :class:`OocError`.
The partial folder is locked (``flock``) while a run writes it.

Resume: ``progress.json`` in the partial folder records the finished layers
and the output chunks of the current layer, updated after each chunk is
written and fsynced; a run with the same dataset, model, order and chunk size
continues from there (finished chunks and layers are skipped); a partial
folder of another run is discarded. A finished output of the same run is left
as it is (the report is read from it) once its chunk files pass a check: each of the
size Zarr writes, and a sample of them (every one with ``overwrite``) of the CRC-32
recorded when the output was sealed (:mod:`.chunk_crc`); one that fails is made again,
with a one-line note.

Model protocol (what a user's own ``torch.nn.Module`` needs):

* ``num_layers`` (int) and ``layer(l, x, edge_index, edge_weight=None)``
  running convolution ``l`` plus whatever follows it in ``forward`` (norm,
  activation; no activation after the last layer) on a local graph: ``x``
  [n_local, d_in] rows of every local node, ``edge_index`` int64 [2, m] local
  ids, row 0 = source (neighbour), row 1 = target. It returns
  [n_local, d_out]; only the target rows (the first ones) are kept, and each
  target's full in-neighbourhood is present, so any aggregation that depends
  only on a node's in-edges (mean, sum, max, attention softmax) is exact.
* ``forward(x, edge_index)`` must equal ``layer(0) .. layer(L-1)`` in sequence.
* Dropout and batch norm must be off in eval mode (the code calls
  ``model.eval()`` and runs under ``torch.inference_mode()``); batch norm uses
  its running statistics, which are per node.
* Degree-normalised convolutions (GCN) must not normalise inside the local
  graph: a model with ``kind == "gcn"`` (or ``gcn_norm = True``) receives
  ``edge_weight`` = 1/sqrt(deg(src)·deg(dst)) with full-graph degrees
  (in-degree without self loops + 1) and one self loop per target already in
  ``edge_index``, exactly as ``gcn_norm`` with ``add_remaining_self_loops``
  computes on the full graph; it must use them as they are.

Stock PyG models: a :class:`torch_geometric.nn.models.basic_gnn.BasicGNN`
(``GraphSAGE``, ``GCN``, ``GAT``, ``GIN``, ...) is taken as it is and run from
its ``convs``, norms and activation (see
:mod:`ooc.executor.inference.model_adapter`, which also lists what it refuses).

Modules: :mod:`.order` (processing order), :mod:`.memory_plan` (budget split,
RSS), :mod:`.blocks` (blocks and chunk access plan per layer),
:mod:`.local_graph` (a block's local graph), :mod:`.streamed` and :mod:`.sliced` (a
reducing layer's two ways), :mod:`.runner` (one layer, the way chosen),
:mod:`.store` (the Zarr output, progress, atomic rename), this module (the
entry point).
"""
from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ooc.caches.chunk_cache import POLICIES
from ooc.core.errors import DatasetError, InvalidValue, IOFailure, OocError, OutputExists, setting
from ooc.core.memory import trim_malloc
from ooc.core.notes import note
from ooc.core.sizes import check_range, format_size, parse_size
from ooc.executor.inference.blocks import CacheSettings, Chunking
from ooc.executor.inference.chunk_crc import REMEDY
from ooc.executor.inference.local_graph import Topology
from ooc.executor.inference.memory_plan import SAFETY_BYTES, MiB, PeakRss, plan_memory, rss
from ooc.executor.inference.model_adapter import LayerwiseModel, as_layerwise
from ooc.executor.inference.order import (
    ORDERS,
    compute_order,
    order_digest,
    order_of,
    resolve_order,
    rows_and_nodes,
    stored_rows,
)
from ooc.executor.inference.runner import AGGREGATIONS, Run, run_layer
from ooc.executor.inference.store import (
    FS_BLOCK,
    PROGRESS_FILE,
    Progress,
    check_finished,
    disk_bytes,
    drop_layer,
    locked_partial,
    not_replaceable,
    open_group,
    partial_path,
    predictions,
    EmbeddingReader,
    read_embeddings,
    read_progress,
    seal,
    swap_in,
)
from ooc.executor.inference.sliced import SLICE_DIR
from ooc.executor.inference.sliced import scratch_bytes as sliced_scratch
from ooc.executor.inference.streamed import BUCKET_BYTES
from ooc.executor.loader.process_budget import process_total
from ooc.storage.dataset import Dataset, open_dataset
from ooc.storage.direct import DirectFeatures
from ooc.storage.io_backends import REGISTRY
from ooc.storage.locks import exclusive

#: dtypes a layer before the last may be stored in
LAYER_DTYPES = ("float32", "float16")

#: the public names (the pieces' own modules hold the rest)
__all__ = ["layerwise_inference", "check_options", "compute_order", "read_embeddings",
           "EmbeddingReader",
           "partial_path", "plan_memory", "MiB", "SAFETY_BYTES", "ORDERS", "PROGRESS_FILE"]


def _parse_size(x: int | str) -> int:
    return parse_size(x) if isinstance(x, str) else int(x)


def _feature_reader(dataset: Dataset, features: Any) -> tuple[Any, str]:
    """The layer-0 source: an object with ``read(ids) -> [n, dim]``, and its name."""
    if features is not None and not isinstance(features, str):
        return features, type(features).__name__
    kind = features or "auto"
    if kind == "mmap":
        return dataset.features, "mmap"

    backend = "auto" if kind in ("auto", "direct") else kind
    try:
        # whole pages, and only those wanted: the blocks' plans count the pages they read
        # (a block wants most rows of the pages it touches, so reading their sectors alone
        # would save little)
        f = DirectFeatures(dataset.features_file, dataset.file_layout, backend=backend,
                           page_reads=True, max_gap_bytes=0)
        return dataset.by_node(f), f"direct ({f.backend})"
    except (OocError, ValueError) as e:
        if kind != "auto":
            raise InvalidValue(f"direct feature reader unavailable: {e}") from None
    return dataset.features, "mmap"


def check_options(budget: int, chunk_rows: int, block_rows: int | None,
                  cache_chunks: int | None, policy: str, layer_dtype: str = "float32",
                  aggregate: str = "auto") -> None:
    """Range-check the inference settings (one-line :class:`OocError` naming the option)."""

    check_range("--memory-budget", budget, 1, None, integer=True)
    check_range("--chunk-rows", chunk_rows, 1, 1 << 24, integer=True)
    check_range("--block-rows", block_rows, 1, None, integer=True)
    check_range("cache_chunks", cache_chunks, 0, None, integer=True)
    if policy not in POLICIES:
        raise InvalidValue(f"unknown cache policy {policy!r} (choose one of {', '.join(POLICIES)})")
    if layer_dtype not in LAYER_DTYPES:
        raise InvalidValue(f"{setting('--layer-dtype')} {layer_dtype!r}: choose one of "
                           f"{', '.join(LAYER_DTYPES)}")
    if aggregate not in AGGREGATIONS:
        raise InvalidValue(f"{setting('--aggregate')} {aggregate!r}: choose one of "
                           f"{', '.join(AGGREGATIONS)}")


@dataclass
class Job:
    """One inference run, resolved and checked before anything is written."""
    dataset: Dataset
    model: LayerwiseModel
    out: Path
    budget: int
    chunking: Chunking
    cache: CacheSettings
    perm: np.ndarray | None      # row -> node, None in node id order
    order_name: str
    fingerprint: dict
    dims: list[int]              # input width, then every layer's output width
    features: Any = "auto"       # the layer-0 reader (see layerwise_inference)
    layer_dtype: str = "float32"  # of the layers before the last
    keep_layers: bool = False     # keep every layer (else each input goes once used)
    aggregate: str = "auto"       # how layers read their input (runner.AGGREGATIONS)
    stream_rows: tuple[int | None, int | None] = (None, None)
    slice_cols: int | None = None
    show_bar: bool = False
    on_chunk: Callable[[int, int], None] | None = None
    #: the partition assignment of a ``pds`` order until :func:`_order_job` makes it
    owner: np.ndarray | None = None

    @property
    def num_layers(self) -> int:
        return len(self.dims) - 1


# ----------------------------------------------------------------------------- entry point
def layerwise_inference(dataset: Dataset | str | os.PathLike, model: torch.nn.Module,
                        out: str | os.PathLike, memory_budget: int | str | None = None,
                        chunk_rows: int = 32768, order: Any = "auto", partition: Any = None,
                        policy: str = "belady", features: Any = "auto",
                        block_rows: int | None = None, cache_chunks: int | None = None,
                        overwrite: bool = False, progress: bool = True,
                        on_chunk: Callable[[int, int], None] | None = None,
                        layer_dtype: str = "float32", keep_layers: bool = False,
                        aggregate: str = "auto",
                        stream_rows: tuple[int | None, int | None] | None = None,
                        slice_cols: int | None = None) -> dict:
    """Compute every layer of ``model`` for every node, layer by layer, out of core.

    Args:
        dataset: an opened dataset or its folder.
        model: a model following the protocol in the module docstring
            (the project's :class:`~ooc.executor.training.models.GNN` does) or
            a stock PyG ``BasicGNN`` (``GraphSAGE``, ``GCN``, ``GAT``, ...).
        out: the Zarr group folder to write (``h1`` .. ``hL``, ``pred``).
        memory_budget: bytes (or ``"512MiB"``) the whole process may hold; None: the
            process's (``with ooc.memory_budget(...)``) when one is set, else 2 GiB.
        chunk_rows: rows per Zarr chunk of every layer array.
        order: ``auto``, ``natural``, ``pds``, ``degree`` or a partition
            assignment array; see the module docstring.
        partition: partition assignment (array or ``owner.npy`` path) for PDS.
        policy: previous-layer chunk cache policy: ``belady``, ``lru``, ``fifo``.
        features: layer-0 reader: ``auto`` (O_DIRECT reader when available,
            else memmap), ``direct``, ``mmap``, a backend of
            :data:`ooc.storage.io_backends.REGISTRY` (``io_uring``, ``preadv``, ...)
            or an object with ``read(ids)``.
        block_rows: at most this many targets per block (default: as many as the
            memory holds).
        cache_chunks: force the cache capacity in chunks (default: from budget).
        overwrite: replace an existing output that belongs to another run.
        progress: a progress bar per layer on stderr (default; False for none).
        on_chunk: called as ``on_chunk(layer, chunk)`` after each output chunk
            is durably written (tests use it to simulate a crash).
        layer_dtype: ``float32`` or ``float16`` for ``h1`` .. ``h{L-1}`` (half the disk and
            the reads of the next layer; ``hL`` stays float32).
        keep_layers: keep every layer; by default a layer is deleted once the next one
            is complete, so the run holds at most two layers on disk.
        aggregate: ``auto`` (a layer whose convolution is a plain mean, sum or max of its
            input rows, as ``SAGEConv``'s, and that one block cannot hold runs the way
            planned to move the fewest bytes: column slices, :mod:`.sliced`, streamed
            groups, :mod:`.streamed`, or, on a graph of at most 2^25 edges, blocks),
            ``blocks`` (never), ``streamed`` or ``sliced`` (every layer that way; one
            line when one cannot).
        stream_rows: force the streamed layers' (group rows, source chunk rows), either
            None for the budget's (tests and benchmarks).
        slice_cols: force the column-sliced layers' slice width (tests and benchmarks).

    Returns:
        The report: per-layer timings, bytes read, cache hit ratios, peak RSS,
        accuracies when labels exist.
    """
    t_start = time.perf_counter()
    if memory_budget is None:
        memory_budget = process_total() or "2GiB"
    budget = _parse_size(memory_budget)
    check_options(budget, chunk_rows, block_rows, cache_chunks, policy, layer_dtype, aggregate)
    _check_features(features)
    if stream_rows is not None:
        for what, v in zip(("stream_rows[0] (group rows)", "stream_rows[1] (source rows)"),
                           stream_rows, strict=False):
            check_range(what, v, 1, None, integer=True)
    chunking = Chunking(int(chunk_rows), 0, block_rows)
    job = _resolve(dataset, model, out, budget, chunking, CacheSettings(policy, cache_chunks),
                   order, partition, layer_dtype, bool(keep_layers), aggregate)
    job.features, job.show_bar, job.on_chunk = features, progress, on_chunk
    if stream_rows is not None:
        job.stream_rows = (stream_rows[0], stream_rows[1])
    check_range("slice_cols", slice_cols, 1, None, integer=True)
    job.slice_cols = slice_cols
    # the disk check runs before the first pass over the graph, except where ``out``
    # exists: a finished output of this run (known once the order is) needs no disk
    nothing_at_out = not os.path.lexists(job.out)
    if nothing_at_out:
        check_disk(job)
    _order_job(job)
    if _is_finished(job, overwrite):
        return _finished_report(job, t_start)
    if not nothing_at_out:
        check_disk(job)
    report = _write_partial(job)
    report["time_s"] = time.perf_counter() - t_start
    return report


def _resolve(dataset, model, out, budget: int, chunking: Chunking, cache: CacheSettings,
             order: Any, partition: Any, layer_dtype: str = "float32",
             keep_layers: bool = False, aggregate: str = "auto") -> Job:
    """Open the dataset and check it, the model, the order's options and the budget's
    minimum against each other, without a pass over the graph (:func:`_order_job` makes
    the order)."""
    if not isinstance(dataset, (str, os.PathLike, Dataset)):
        raise InvalidValue(f"dataset: a {type(dataset).__name__}, not a Dataset or its folder")
    if not isinstance(out, (str, os.PathLike)):
        raise InvalidValue(f"out: a {type(out).__name__}, not the output folder (a path)")
    if not isinstance(dataset, Dataset):
        dataset = open_dataset(dataset)
    lw = as_layerwise(model)
    check_width(dataset, lw)
    dims = _layer_dims(dataset, lw)
    _check_streams(lw, aggregate)
    _check_budget(dataset, dims, budget, chunking.chunk_rows, cache.capacity)
    owner, order_name = resolve_order(dataset, order, partition)
    n = dataset.num_nodes
    chunking.num_chunks = -(-n // chunking.chunk_rows) if n else 0
    return Job(dataset, lw, Path(out), budget, chunking, cache, None, order_name, {}, dims,
               layer_dtype=layer_dtype, keep_layers=keep_layers, aggregate=aggregate,
               owner=owner)


def _order_job(job: Job) -> None:
    """Check every id of ``indices.bin``, then make the processing order and the run's
    fingerprint (the passes over the graph); the budget's minimum is checked again with
    the order in memory."""
    ds, ch = job.dataset, job.chunking
    # the layer kernels index with every id of indices.bin: all are checked first (one
    # streaming pass, the size of one layer's neighbour reads), so a corrupted page the
    # sampled checksum missed is one error naming the position, not a SIGSEGV
    ds.check_indices()
    job.perm, job.order_name = order_of(ds, job.owner, job.order_name)
    job.owner = None
    job.fingerprint = {"dataset": str(ds.path.resolve()), "source": ds.fingerprint(),
                       "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                       "chunk_rows": ch.chunk_rows, "order": job.order_name,
                       "order_digest": order_digest(job.perm), "model": job.model.digest(),
                       "num_layers": job.model.num_layers, "layer_dtype": job.layer_dtype,
                       "keep_layers": job.keep_layers}
    _check_budget(ds, job.dims, job.budget, ch.chunk_rows, job.cache.capacity)


def _check_features(features: Any) -> None:
    """``features`` (see :func:`layerwise_inference`): a reader's name, or an object with
    ``read(ids)``."""
    names = ("auto", "direct", "mmap", *REGISTRY)
    if isinstance(features, str) and features not in names:
        raise InvalidValue(f"features={features!r}: choose one of {', '.join(names)}, or "
                           f"pass an object with read(ids)")
    if not isinstance(features, str) and features is not None and \
            not callable(getattr(features, "read", None)):
        raise InvalidValue(f"features: a {type(features).__name__} has no read(ids); pass a "
                           f"reader's name ({', '.join(names)}) or an object with read(ids)")


def _check_streams(model: LayerwiseModel, aggregate: str) -> None:
    """``aggregate="streamed"`` needs every layer's convolution to be a plain mean, sum or
    max of its input rows (:func:`.runner._stream_plan` says so for the budget)."""
    if aggregate != "streamed":
        return
    for l in range(model.num_layers):
        if model.aggregation(l) is None:
            raise InvalidValue(f"{setting('--aggregate')} streamed: layer {l + 1} cannot stream "
                               f"(its convolution is not a plain mean, sum or max of its input "
                               f"rows); use {setting('--aggregate')} auto")


def check_width(dataset: Dataset, model: LayerwiseModel) -> None:
    """Refuse a model whose declared input width is not the dataset's feature width (one
    :class:`InvalidValue` naming both); a model that declares none is checked when its
    layers are probed (:func:`_layer_dims`)."""
    if model.in_dim is not None and model.in_dim != dataset.feature_dim:
        raise InvalidValue(f"{model.name}: the model takes {model.in_dim}-dim input rows, "
                           f"{dataset.path} has {dataset.feature_dim}-dim features; pass a "
                           f"model built for this dataset (in_dim={dataset.feature_dim})")


def fs_block(path: Path) -> int:
    """The allocation unit of the file system holding ``path`` (a file takes whole ones)."""
    try:
        return os.statvfs(path).f_frsize or FS_BLOCK
    except OSError:
        return FS_BLOCK


def _writable(folder: Path) -> bool:
    """Whether ``folder`` lies on a file system mounted for writing and takes new entries."""
    try:
        return not os.statvfs(folder).f_flag & os.ST_RDONLY and os.access(folder, os.W_OK)
    except OSError:
        return False


def check_disk(job: Job) -> None:
    """Refuse, before anything is written, a run whose output does not fit the free disk
    beside ``out`` (what a partial output of the same run already holds counts as free).
    A folder that cannot be written is left to the output's lock, whose one line says so
    (its free space would name the wrong problem)."""

    parent = job.out.parent if job.out.parent.exists() else Path(".")
    if not _writable(parent):
        return
    n, nl = job.dataset.num_nodes, job.num_layers
    sizes = [np.dtype(job.layer_dtype).itemsize] * (nl - 1) + [4]
    need = 0
    reducing = [l for l in range(nl) if job.model.aggregation(l) is not None]
    if job.aggregate in ("auto", "streamed") and reducing:
        need += BUCKET_BYTES * job.dataset.num_edges  # a streamed layer's edge buckets
    elif job.aggregate == "sliced" and reducing:  # a sliced layer's scratch at its most
        e = job.dataset.num_edges
        need += max(sliced_scratch(n, e, job.dims[l], job.dataset.file_layout.num_rows
                                   if l == 0 else n) for l in reducing)
    work = partial_path(job.out)
    have = sum(f.stat().st_blocks * 512 for f in work.rglob("*") if f.is_file()) \
        if work.is_dir() and not work.is_symlink() else 0
    free = shutil.disk_usage(parent).free
    need += disk_bytes(n, job.dims, sizes, job.keep_layers, job.order_name != "natural",
                       job.chunking.chunk_rows, fs_block(parent))
    if need - have > free:
        hint = ("" if job.layer_dtype == "float16" or nl < 2 else
                "; --layer-dtype float16 halves the layers before the last")
        hint += "; without --keep-layers only two layers are on disk at once" \
            if job.keep_layers else ""
        raise IOFailure(f"{parent}: layer-wise inference of {n:,} nodes needs "
                        f"{format_size(need - have)} of disk, {format_size(free)} is free"
                        f"{hint}")


def _layer_dims(dataset: Dataset, model: LayerwiseModel) -> list[int]:
    """The dataset's feature width, then every layer's output width (each layer run on
    one row of its input's width: a layer that cannot take it is one line)."""
    dims = [dataset.feature_dim]
    for l in range(model.num_layers):
        dims.append(model.out_dim(l, dims[-1]))
    return dims


def _check_budget(dataset: Dataset, dims: list[int], budget: int, chunk_rows: int,
                  cache_chunks: int | None) -> None:
    """Fail before any file is written when a layer's minimum (two output chunk buffers)
    does not fit the budget."""
    trim_malloc()
    rows = min(chunk_rows, max(dataset.num_nodes, 1))
    for l in range(len(dims) - 1):
        plan_memory(budget, rss(), rows, dims[l], dims[l + 1], True, cache_chunks)


def _is_finished(job: Job, overwrite: bool) -> bool:
    """True when ``job.out`` is a finished output of this run; raises when ``out``
    exists otherwise and may not (or cannot) be replaced."""
    out = job.out
    if not (out.exists() or out.is_symlink()):
        return False
    old = read_progress(out)
    why = not_replaceable(out)
    if old is not None and old.get("fingerprint") == job.fingerprint and old.get("complete"):
        return _intact(out, why, overwrite)
    if not overwrite:
        raise OutputExists(f"{out}: already exists and is not a finished run of this model, "
                       "dataset, order and chunk size (pass overwrite=True / --overwrite "
                       "to replace it)")
    if why:
        raise OutputExists(f"{out}: {why}; --overwrite replaces only an ooc.infer output")
    return False


def _intact(out: Path, why: str | None, overwrite: bool) -> bool:
    """Whether the finished output ``out`` of this run passes its check (a sample of its
    chunks' CRCs; all of them with ``overwrite``); one that fails is made again, with a
    note, when it is ooc's own (``why`` None), else the check's one line is raised."""

    try:
        check_finished(out, full=overwrite)
    except DatasetError as e:
        found = e.problem.removesuffix(f"; {REMEDY}")
        if why:
            raise DatasetError(e.path, f"{found}; {out} {why}, so ooc.infer does not replace "
                                       f"it: remove it or choose another --out") from None
        note(f"{e.path}: {found}; making the output again")
        return False
    return True


def _write_partial(job: Job) -> dict:
    """Compute into the locked partial folder and rename it to ``job.out``; an
    ``OSError`` becomes a one-line error (a full disk removes the partial folder)."""

    work = partial_path(job.out)
    with exclusive(job.out, "inference output"), locked_partial(work):
        try:
            return _infer_into(work, job)
        except OocError:
            raise
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                shutil.rmtree(work, ignore_errors=True)
                raise IOFailure(f"{e.filename or work}: no space left on the device; the "
                               f"partial output {work} was removed") from None
            raise IOFailure(f"{e.filename or work}: {e.strerror or e} (the partial output "
                           f"stays in {work}; the same command resumes)") from None


# ----------------------------------------------------------------------------- the run
def _base_report(job: Job, reader_name: str, resumed: bool) -> dict:
    """The report's fields known before any layer runs."""
    ds = job.dataset
    return {
        "dataset": str(ds.path), "out": str(job.out), "num_nodes": ds.num_nodes,
        "num_edges": ds.num_edges, "num_layers": job.num_layers,
        "model": job.model.name, "order": job.order_name,
        "policy": job.cache.policy, "feature_reader": reader_name,
        "chunk_rows": job.chunking.chunk_rows, "num_chunks": job.chunking.num_chunks,
        "memory_budget_bytes": job.budget, "resumed": resumed, "resumed_chunks": 0,
        "layers": [], "dims": job.dims, "layer_dtype": job.layer_dtype,
        "keep_layers": job.keep_layers,
    }


def _finished_report(job: Job, t_start: float) -> dict:
    """The report of an output that is already complete (read, nothing written)."""
    import zarr

    group = zarr.open_group(str(job.out), mode="r")
    report = _base_report(job, "none", True)
    nl, nc = job.num_layers, job.chunking.num_chunks
    report.update(resumed_chunks=nl * nc,
                  layers=[{"layer": l + 1, "skipped": True} for l in range(nl)])
    perm, _ = rows_and_nodes(job.perm, job.dataset.num_nodes)
    report.update(predictions(job.dataset, group, f"h{nl}", perm, job.chunking.chunk_rows, nc,
                              write=False))
    r = rss()
    report.update(peak_rss_bytes=r, start_rss_bytes=r, within_budget=r <= job.budget,
                  bytes_read=0, cache_hit_ratio=None, time_s=time.perf_counter() - t_start)
    return report


def _open_run(work: Path, job: Job) -> tuple[Run, str]:
    """The partial folder's progress and group, the topology and the layer-0 reader."""
    progress = Progress.open(work, job.fingerprint, job.on_chunk)
    perm, rowof = rows_and_nodes(job.perm, job.dataset.num_nodes,
                                 stored_rows(job.dataset, job.order_name))
    group = open_group(work, job.order_name, job.chunking.chunk_rows, job.num_layers,
                       job.perm, rowof)
    progress.save()
    topo = Topology.of(job.dataset, perm, rowof, job.model.gcn_norm)
    reader, reader_name = _feature_reader(job.dataset, job.features)
    backend = job.features if isinstance(job.features, str) and job.features in REGISTRY \
        else "auto"
    return Run(job.dataset, job.model, group, topo, reader, job.budget, job.chunking, job.cache,
               progress, job.show_bar, job.layer_dtype, backend, job.aggregate,
               job.stream_rows, job.slice_cols), reader_name


def _run_layers(run: Run, job: Job, report: dict, peak: PeakRss) -> None:
    """Every layer not finished yet, then ``pred`` and the accuracies."""
    # the order and the topology walked the adjacency: its pages leave the process (each
    # pass over it maps them again and drops them after)
    run.topo.release_pages()
    base_rss = rss()
    report["start_rss_bytes"] = base_rss
    rows = min(job.chunking.chunk_rows, max(job.dataset.num_nodes, 1))
    for l in range(job.num_layers):  # the budget still holds every layer's minimum
        plan_memory(job.budget, base_rss, rows, job.dims[l], job.dims[l + 1], True,
                    job.cache.capacity)
    _drop_inputs(run, job, int(run.progress.state["layers_done"]))  # a crash's leftovers
    for l in range(job.num_layers):
        if l < run.progress.state["layers_done"]:
            report["resumed_chunks"] += job.chunking.num_chunks
            report["layers"].append({"layer": l + 1, "skipped": True})
            continue
        peak.reset()
        lrep = run_layer(run, l)
        lrep["peak_rss"] = peak.sample()
        report["resumed_chunks"] += lrep.pop("resumed_chunks")
        report["layers"].append(lrep)
        run.progress.layer_written(l)
        _drop_inputs(run, job, l + 1)
    t0 = time.perf_counter()
    report.update(predictions(job.dataset, run.group, f"h{job.num_layers}", run.topo.perm,
                              job.chunking.chunk_rows, job.chunking.num_chunks))
    report["predict_s"] = time.perf_counter() - t0


def _drop_inputs(run: Run, job: Job, done: int) -> None:
    """With ``done`` layers complete, delete ``h1`` .. ``h{done-1}`` (no later layer reads
    them) unless the job keeps its layers; a resumed run deletes what a crash left."""
    if job.keep_layers:
        return
    for k in range(1, done):
        drop_layer(run.group, f"h{k}")


def _summarise(report: dict, peak: int, budget: int) -> dict:
    """Totals over the layers: peak RSS, the largest planned peak, bytes read, cache hit
    ratio."""
    report["peak_rss_bytes"] = peak
    report["within_budget"] = peak <= budget
    report["bytes_read"] = int(sum(x.get("bytes_read", 0) for x in report["layers"]))
    planned = [x["planned_peak_bytes"] for x in report["layers"] if "planned_peak_bytes" in x]
    report["planned_peak_bytes"] = max(planned) if planned else None
    done = [x for x in report["layers"] if not x.get("skipped") and x.get("cache")]
    hits = sum(x["cache"]["hits"] for x in done)
    miss = sum(x["cache"]["misses"] for x in done)
    report["cache_hit_ratio"] = hits / (hits + miss) if hits + miss else None
    return report


def _infer_into(work: Path, job: Job) -> dict:
    """Compute every layer into ``work`` (resuming what it holds) and rename it to ``out``."""
    run, reader_name = _open_run(work, job)
    report = _base_report(job, reader_name, run.progress.resumed)
    try:
        with PeakRss() as peak, torch.inference_mode():
            trim_malloc()
            _run_layers(run, job, report, peak)
    finally:
        if reader_name.startswith("direct"):
            run.reader.close()
    shutil.rmtree(work / SLICE_DIR, ignore_errors=True)  # the sorted edges the layers shared
    run.group.attrs["complete"] = True
    run.progress.finish()
    seal(work, run.group)
    swap_in(work, job.out)
    return _summarise(report, peak.peak, job.budget)
