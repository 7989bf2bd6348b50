"""Layer-wise full-graph inference with Zarr layer stores (GLISP §III-D, DESIGN.md §6).

An L-layer GNN is sliced into L one-layer GNNs. Layer ``l`` is computed for
every node from the layer ``l-1`` rows of its *full* in-neighbourhood (no
sampling): layer 0 reads ``features.bin`` through the storage readers, layer
``l >= 1`` reads the Zarr array ``h{l}`` that the previous layer wrote. Each
node's embedding is computed once per layer, so the redundant computation of
sample-wise inference (every target recomputing its own L-hop tree) is gone.

Output: a Zarr v3 group at ``out`` with arrays ``h1`` .. ``hL`` (float32
[N, d_l], rows chunked by ``chunk_rows``; ``hL`` is the model output),
``pred`` (int64 argmax of ``hL``) and, when the processing order is not node
id order, ``row_of_node`` (int64 [N]). Rows are stored in *processing order*
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

Memory: ``memory_budget`` bounds the whole process. At the start of each
layer the resident size is measured; what is left (minus the output chunk
buffer) is split between the chunk cache and the block working set, and
blocks of targets are cut so that their local graphs fit (a single node whose
in-neighbourhood alone exceeds it still gets a block of its own). Peak RSS is
sampled and reported (per layer too). Layer 0 reads either the feature pages
each block needs (O_DIRECT reader, deduplicated per block) or whole feature
chunks through the same cache, whichever the plan says reads fewer bytes.
Reads are chunk-granular for later layers: when the cache holds only part of
the previous layer and blocks touch most chunks (ids without locality), bytes
read grow as blocks x chunks -- give the cache the previous layer if the budget
allows, or use a locality order (PDS).

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
as it is (the report is read from it).

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
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ...memory import trim_malloc
from ...storage.atomic import write_json
from ...storage.dataset import Dataset, open_dataset
from ...storage.errors import OocError
from ...storage.layout import PAGE
from ._kernels import (access_plan, build_local, count_block_keys, nonloop_in_degree,
                                 plan_blocks)
from ..cache.chunk_cache import POLICIES, ChunkCache, simulate

PROGRESS_FILE = "progress.json"
ORDERS = ("auto", "natural", "pds", "degree")
MiB = 1 << 20
#: Memory kept free for allocator slack, Zarr codecs and torch temporaries.
SAFETY_BYTES = 48 * MiB


# ----------------------------------------------------------------------------- helpers
def _parse_size(x: int | str) -> int:
    from ...cli import parse_size

    return parse_size(x) if isinstance(x, str) else int(x)


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _PeakRss:
    """Samples this process's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak = _rss()
        self.window = self.peak
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def reset(self) -> None:
        """Start a new window; ``sample()`` returns its peak (``peak`` keeps the overall one)."""
        self.window = _rss()

    def sample(self) -> int:
        return max(self.window, _rss())

    def _run(self) -> None:
        import psutil

        p = psutil.Process()
        while not self._stop.is_set():
            r = int(p.memory_info().rss)
            self.peak = max(self.peak, r)
            self.window = max(self.window, r)
            self._stop.wait(self.interval)

    def __enter__(self) -> "_PeakRss":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


def _feature_reader(dataset: Dataset, features: Any) -> tuple[Any, str]:
    """The layer-0 source: an object with ``read(ids) -> [n, dim]``."""
    if features is not None and not isinstance(features, str):
        return features, type(features).__name__
    kind = features or "auto"
    if kind == "mmap":
        return dataset.features, "mmap"
    from ...storage.direct import DirectFeatures

    backend = "auto" if kind in ("auto", "direct") else kind
    try:
        f = DirectFeatures(dataset.file("features.bin"), dataset.layout, backend=backend)
        return f, f"direct ({f.backend})"
    except (OocError, ValueError) as e:
        if kind != "auto":
            raise OocError(f"direct feature reader unavailable: {e}") from None
    return dataset.features, "mmap"


def compute_order(dataset: Dataset, order: Any = "auto", partition: Any = None
                  ) -> tuple[np.ndarray | None, str]:
    """The processing order ``perm`` (row -> node, int64 [N]) or None for node id order.

    ``order``: ``auto``, ``natural``, ``pds``, ``degree``, or a partition
    assignment array (PDS over it). ``partition``: assignment array or path
    to an ``owner.npy``.
    """
    n = dataset.num_nodes
    owner = None
    if isinstance(order, np.ndarray) or (not isinstance(order, str) and order is not None):
        owner, order = np.asarray(order), "pds"
    elif partition is not None:
        owner = np.load(partition) if isinstance(partition, (str, os.PathLike)) else np.asarray(partition)
    elif order in ("auto", "pds") and (dataset.path / "owner.npy").is_file():
        owner = np.load(dataset.path / "owner.npy")
    if order == "auto":
        order = "pds" if owner is not None else "natural"
    if order not in ORDERS:
        raise OocError(f"unknown order {order!r} (choose one of {', '.join(ORDERS)} "
                       "or pass a partition assignment array)")
    if order == "natural":
        return None, "natural"
    deg = dataset.in_degrees()
    if order == "degree":
        return np.argsort(-deg, kind="stable").astype(np.int64), "degree"
    if owner is None:
        raise OocError("order 'pds' needs a partitioning: pass partition= (owner.npy from "
                       "`python -m ooc.partition`) or put owner.npy in the dataset folder")
    owner = np.asarray(owner).reshape(-1)
    if owner.shape[0] != n:
        raise OocError(f"partition assignment has {owner.shape[0]} entries, the graph {n} nodes")
    return np.lexsort((-deg, owner)).astype(np.int64), "pds"


def _model_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_embeddings(out: str | os.PathLike, name: str, ids: np.ndarray | None = None) -> np.ndarray:
    """Rows of array ``name`` (``h1`` .. ``hL``, ``pred``) for node ids ``ids``
    (all nodes, in node id order, when None), undoing the processing order."""
    import zarr

    g = zarr.open_group(str(out), mode="r")
    arr = g[name]
    n = arr.shape[0]
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    if "row_of_node" in g:
        rows = np.asarray(g["row_of_node"][:])[ids]
    else:
        rows = ids
    if rows.size and np.all(np.diff(rows) == 1):
        return np.asarray(arr[int(rows[0]):int(rows[-1]) + 1])
    return np.asarray(arr.oindex[rows] if arr.ndim == 1 else arr.oindex[rows, :])


# ----------------------------------------------------------------------------- main
def layerwise_inference(dataset: Dataset | str | os.PathLike, model: torch.nn.Module,
                        out: str | os.PathLike, memory_budget: int | str = "2GiB",
                        chunk_rows: int = 32768, order: Any = "auto", partition: Any = None,
                        policy: str = "belady", features: Any = "auto",
                        block_rows: int | None = None, cache_chunks: int | None = None,
                        overwrite: bool = False, progress: bool = False,
                        on_chunk: Callable[[int, int], None] | None = None) -> dict:
    """Compute every layer of ``model`` for every node, layer by layer, out of core.

    Args:
        dataset: an opened dataset or its folder.
        model: a model following the protocol in the module docstring
            (the project's :class:`~ooc.executor.training.models.GNN` does).
        out: the Zarr group folder to write (``h1`` .. ``hL``, ``pred``).
        memory_budget: bytes (or ``"512MiB"``) the whole process may hold.
        chunk_rows: rows per Zarr chunk of every layer array.
        order: ``auto``, ``natural``, ``pds``, ``degree`` or a partition
            assignment array; see the module docstring.
        partition: partition assignment (array or ``owner.npy`` path) for PDS.
        policy: previous-layer chunk cache policy: ``belady``, ``lru``, ``fifo``.
        features: layer-0 reader: ``auto`` (O_DIRECT reader when available,
            else memmap), ``direct``, ``mmap``, a backend of
            :data:`ooc.storage.io_backends.REGISTRY` (``io_uring``, ``preadv``, ...)
            or an object with ``read(ids)``.
        block_rows: at most this many targets per block (default: chunk_rows).
        cache_chunks: force the cache capacity in chunks (default: from budget).
        overwrite: replace an existing output that belongs to another run.
        progress: show a progress bar per layer.
        on_chunk: called as ``on_chunk(layer, chunk)`` after each output chunk
            is durably written (tests use it to simulate a crash).

    Returns:
        The report: per-layer timings, bytes read, cache hit ratios, peak RSS,
        accuracies when labels exist.
    """
    t_start = time.perf_counter()
    budget = _parse_size(memory_budget)
    check_options(budget, chunk_rows, block_rows, cache_chunks, policy)
    chunk_rows = int(chunk_rows)
    if not isinstance(dataset, Dataset):
        dataset = open_dataset(dataset)
    # the layer kernels index with every id of indices.bin: all are checked first (one
    # streaming pass, the size of one layer's neighbour reads), so a corrupted page the
    # sampled checksum missed is one error naming the position, not a SIGSEGV
    dataset.check_indices()
    if not hasattr(model, "layer") or not hasattr(model, "num_layers"):
        raise OocError("the model does not follow the layer-wise protocol "
                       "(needs num_layers and layer(l, x, edge_index, edge_weight))")
    model.eval()
    n = dataset.num_nodes
    num_layers = int(model.num_layers)
    out = Path(out)

    perm, order_name = compute_order(dataset, order, partition)
    perm_a = np.arange(n, dtype=np.int64) if perm is None else perm
    order_digest = "natural" if perm is None else hashlib.sha256(perm.tobytes()).hexdigest()[:24]

    fingerprint = {"dataset": str(dataset.path.resolve()), "num_nodes": n,
                   "num_edges": dataset.num_edges, "chunk_rows": chunk_rows,
                   "order": order_name, "order_digest": order_digest,
                   "model": _model_digest(model), "num_layers": num_layers}

    gcn = getattr(model, "kind", None) == "gcn" or bool(getattr(model, "gcn_norm", False))
    # every layer's minimum (two output chunk buffers) must fit: fail now, before any file
    trim_malloc()
    rows = min(chunk_rows, max(n, 1))
    dims = [dataset.feature_dim]
    for l in range(num_layers):
        dims.append(_probe_out_dim(model, l, dims[-1], gcn))
        plan_memory(budget, _rss(), rows, dims[-2], dims[-1], True, cache_chunks)
    num_chunks = -(-n // chunk_rows) if n else 0

    # ---- a finished output of this run: nothing to compute ----
    if out.exists() or out.is_symlink():
        old = _read_progress(out)
        if old is not None and old.get("fingerprint") == fingerprint and old.get("complete"):
            return _finished_report(dataset, out, perm_a, fingerprint, num_layers, num_chunks,
                                    dims, budget, t_start, policy, order_name,
                                    _model_name(model))
        why = _not_replaceable(out)
        if not overwrite:
            raise OocError(f"{out}: already exists and is not a finished run of this model, "
                           "dataset, order and chunk size (pass overwrite=True / --overwrite "
                           "to replace it)")
        if why:
            raise OocError(f"{out}: {why}; --overwrite replaces only an ooc.infer output")

    work = partial_path(out)
    with _locked_partial(work) as lock_fd:
        try:
            report = _infer_into(work, out, lock_fd, dataset, model, fingerprint, perm, perm_a,
                                 order_name, gcn, dims, budget, chunk_rows, num_chunks, policy,
                                 features, block_rows, cache_chunks, progress, on_chunk)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                shutil.rmtree(work, ignore_errors=True)
                raise OocError(f"{e.filename or work}: no space left on the device; the "
                               f"partial output {work} was removed") from None
            raise OocError(f"{e.filename or work}: {e.strerror or e} (the partial output "
                           f"stays in {work}; the same command resumes)") from None
    report["time_s"] = time.perf_counter() - t_start
    return report


def partial_path(out: str | os.PathLike) -> Path:
    """Where :func:`layerwise_inference` builds ``out`` before renaming it:
    ``.<name>.partial`` in the same folder."""
    out = Path(out)
    return out.parent / f".{out.name}.partial"


def check_options(budget: int, chunk_rows: int, block_rows: int | None,
                  cache_chunks: int | None, policy: str) -> None:
    """Range-check the inference settings (one-line :class:`OocError` naming the option)."""
    from ...cli import check_range

    check_range("--memory-budget", budget, 1, None, integer=True)
    check_range("--chunk-rows", chunk_rows, 1, 1 << 24, integer=True)
    check_range("--block-rows", block_rows, 1, None, integer=True)
    check_range("cache_chunks", cache_chunks, 0, None, integer=True)
    if policy not in POLICIES:
        raise OocError(f"unknown cache policy {policy!r} (choose one of {', '.join(POLICIES)})")


def _read_progress(folder: Path) -> dict | None:
    """``folder/progress.json`` as a dict; None when absent or unreadable."""
    try:
        old = json.loads((folder / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return old if isinstance(old, dict) and isinstance(old.get("fingerprint"), dict) else None


def _not_replaceable(out: Path) -> str | None:
    """Why ``out`` is not an output of this module that ``overwrite`` may replace."""
    if out.is_symlink() or not out.is_dir():
        return "is not a folder"
    if _read_progress(out) is None:
        return f"has no {PROGRESS_FILE} of ooc.infer (not an inference output)"
    return None


@contextlib.contextmanager
def _locked_partial(work: Path):
    """Create ``work`` (when absent) and hold an exclusive ``flock`` on it; an empty
    ``work`` is removed afterwards."""
    try:
        work.mkdir(parents=True, exist_ok=True)
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise OocError(f"{work}: cannot create the output folder ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OocError(f"{work}: another ooc.infer is writing this output") from None
        yield fd
    finally:
        with contextlib.suppress(OSError):
            work.rmdir()  # only when empty: the run failed before writing anything
        os.close(fd)


def _swap_in(work: Path, out: Path) -> None:
    """Rename the finished ``work`` folder to ``out`` (replacing an old ``out``)."""
    from ...storage.atomic import exchange

    if os.path.lexists(out):
        if exchange(work, out):
            shutil.rmtree(work, ignore_errors=True)  # now the old output
        else:
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(work, out)
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(work, out)
    _fsync_path(out.parent)


def _finished_report(dataset, out: Path, perm: np.ndarray, fingerprint: dict, num_layers: int,
                     num_chunks: int, dims: list[int], budget: int, t_start: float, policy: str,
                     order_name: str, model_name: str) -> dict:
    """The report of an output that is already complete (read, nothing written)."""
    import zarr

    group = zarr.open_group(str(out), mode="r")
    report = _base_report(dataset, out, fingerprint, num_layers, num_chunks, budget, policy,
                          order_name, "none", True, model_name)
    report.update(dims=dims, resumed_chunks=num_layers * num_chunks,
                  layers=[{"layer": l + 1, "skipped": True} for l in range(num_layers)])
    report.update(_predictions(dataset, group, f"h{num_layers}", perm,
                               int(fingerprint["chunk_rows"]), num_chunks, write=False))
    rss = _rss()
    report.update(peak_rss_bytes=rss, start_rss_bytes=rss, within_budget=rss <= budget,
                  bytes_read=0, cache_hit_ratio=None, time_s=time.perf_counter() - t_start)
    return report


def _model_name(model) -> str:
    return getattr(model, "kind", type(model).__name__)


def _base_report(dataset, out: Path, fingerprint: dict, num_layers: int, num_chunks: int,
                 budget: int, policy: str, order_name: str, reader_name: str,
                 resumed: bool, model_name: str) -> dict:
    """The report's fields known before any layer runs."""
    return {
        "dataset": str(dataset.path), "out": str(out), "num_nodes": dataset.num_nodes,
        "num_edges": dataset.num_edges, "num_layers": num_layers,
        "model": model_name, "order": order_name,
        "policy": policy, "feature_reader": reader_name,
        "chunk_rows": int(fingerprint["chunk_rows"]), "num_chunks": num_chunks,
        "memory_budget_bytes": budget, "resumed": resumed, "resumed_chunks": 0, "layers": [],
    }


def _infer_into(work: Path, out: Path, lock_fd: int, dataset: Dataset, model, fingerprint: dict,
                perm, perm_a, order_name: str, gcn: bool, dims: list[int], budget: int,
                chunk_rows: int, num_chunks: int, policy: str, features, block_rows,
                cache_chunks, progress: bool, on_chunk) -> dict:
    """Compute every layer into ``work`` (resuming what it holds) and rename it to ``out``."""
    import zarr

    n = dataset.num_nodes
    num_layers = len(dims) - 1
    state = {"fingerprint": fingerprint, "layers_done": 0, "layer": 0, "chunks_done": 0,
             "complete": False}
    pfile = work / PROGRESS_FILE
    old = _read_progress(work)
    if old is not None and old.get("fingerprint") == fingerprint:
        state = old
    elif any(work.iterdir()):  # a partial output of another run: start over
        for p in work.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    resumed = bool(state["layers_done"] or state["chunks_done"])
    rowof = perm_a
    if perm is not None:
        rowof = np.empty(n, dtype=np.int64)
        rowof[perm] = np.arange(n, dtype=np.int64)
    group = zarr.open_group(str(work), mode="a")
    group.attrs.update({"format": "ooc-layerwise-inference", "order": order_name,
                        "chunk_rows": chunk_rows, "num_layers": num_layers,
                        "arrays": [f"h{i + 1}" for i in range(num_layers)], "complete": False})
    if perm is not None and "row_of_node" not in group:
        group.create_array("row_of_node", data=rowof, chunks=(max(chunk_rows, 1 << 20),),
                           compressors=None)
    write_json(pfile, state)

    dinv = None
    if gcn:
        deg = nonloop_in_degree(dataset.indptr, np.asarray(dataset.indices)) + 1
        dinv = (deg.astype(np.float32)) ** -0.5
        del deg
    reader, reader_name = _feature_reader(dataset, features)
    indptr = dataset.indptr
    indices = np.asarray(dataset.indices)
    scratch = np.full(n, -1, dtype=np.int64)
    report = _base_report(dataset, out, fingerprint, num_layers, num_chunks, budget, policy,
                          order_name, reader_name, resumed, _model_name(model))
    report["dims"] = dims

    try:
        with _PeakRss() as peak, torch.inference_mode():
            trim_malloc()
            base_rss = _rss()
            report["start_rss_bytes"] = base_rss
            rows = min(chunk_rows, max(n, 1))
            for l in range(num_layers):  # the budget still holds every layer's minimum
                plan_memory(budget, base_rss, rows, dims[l], dims[l + 1], True, cache_chunks)
            for l in range(num_layers):
                name = f"h{l + 1}"
                if l < state["layers_done"]:
                    report["resumed_chunks"] += num_chunks
                    report["layers"].append({"layer": l + 1, "skipped": True})
                    continue
                peak.reset()
                lrep = _run_layer(l, model, dataset, group, name, reader, perm_a, rowof, indptr,
                                  indices, scratch, dinv, budget, chunk_rows, num_chunks, policy,
                                  block_rows, cache_chunks, state, pfile, on_chunk, progress)
                lrep["peak_rss"] = peak.sample()
                report["resumed_chunks"] += lrep.pop("resumed_chunks")
                report["layers"].append(lrep)
                state.update(layers_done=l + 1, layer=l + 1, chunks_done=0)
                write_json(pfile, state)

            # ---- predictions and accuracy ----
            t0 = time.perf_counter()
            acc = _predictions(dataset, group, f"h{num_layers}", perm_a, chunk_rows, num_chunks)
            report["predict_s"] = time.perf_counter() - t0
            report.update(acc)
    finally:
        if reader_name.startswith("direct"):
            reader.close()
    group.attrs["complete"] = True
    state["complete"] = True
    write_json(pfile, state)
    _fsync_path(work)
    _swap_in(work, out)
    report["peak_rss_bytes"] = peak.peak
    report["within_budget"] = peak.peak <= budget
    report["bytes_read"] = int(sum(x.get("bytes_read", 0) for x in report["layers"]))
    done = [x for x in report["layers"] if not x.get("skipped")]
    hits = sum(x["cache"]["hits"] for x in done if x.get("cache"))
    miss = sum(x["cache"]["misses"] for x in done if x.get("cache"))
    report["cache_hit_ratio"] = hits / (hits + miss) if hits + miss else None
    return report


def plan_memory(budget: int, rss: int, chunk_rows: int, d_in: int, d_out: int, cached: bool,
                cache_chunks: int | None = None, num_chunks: int | None = None
                ) -> tuple[int, int, int, int]:
    """Split what ``budget`` leaves above ``rss`` for one layer.

    Returns ``(cache_chunks, work_bytes, node_bytes, edge_bytes)``: half of the
    free memory (after two output chunk buffers and :data:`SAFETY_BYTES`) goes
    to the previous-layer chunk cache, the rest to one block's working set,
    whose size is estimated per local node and per edge (x rows, torch copies,
    messages, the int64 edge index).
    """
    out_chunk_bytes = chunk_rows * d_out * 4
    in_chunk_bytes = chunk_rows * d_in * 4
    avail = budget - rss - 2 * out_chunk_bytes - SAFETY_BYTES
    if avail <= 0:
        raise OocError(f"memory budget {budget / MiB:.0f} MiB is too small: the process already "
                       f"holds {rss / MiB:.0f} MiB and an output chunk needs "
                       f"{out_chunk_bytes / MiB:.1f} MiB (raise --memory-budget or lower --chunk-rows)")
    if not cached:
        cap = 0
    elif cache_chunks is not None:
        cap = int(cache_chunks)
    else:
        cap = int(avail * 0.5) // max(in_chunk_bytes, 1)
    if num_chunks is not None:
        cap = min(cap, num_chunks)
    work = max(avail - cap * in_chunk_bytes, avail // 4)
    if cached:  # a chunk read on a miss that is not kept
        work -= in_chunk_bytes
    work = max(work, 1 * MiB)
    # measured peaks are ~1.2x these (torch temporaries, allocator slack): x1.5
    node_bytes = 6 * (3 * d_in + 4 * d_out) + 96
    edge_bytes = 144 + 6 * 3 * (d_in + d_out)
    return cap, work, node_bytes, edge_bytes


def _probe_out_dim(model, l: int, d_in: int, gcn: bool) -> int:
    x = torch.zeros(1, d_in)
    if gcn:
        ei = torch.zeros(2, 1, dtype=torch.long)
        h = model.layer(l, x, ei, torch.ones(1))
    else:
        h = model.layer(l, x, torch.zeros(2, 0, dtype=torch.long))
    return int(h.shape[-1])


def _run_layer(l, model, dataset, group, name, reader, perm, rowof, indptr, indices, scratch,
               dinv, budget, chunk_rows, num_chunks, policy, block_rows, cache_chunks, state,
               pfile, on_chunk, progress) -> dict:
    n = perm.shape[0]
    gcn = dinv is not None
    prev = None if l == 0 else group[f"h{l}"]
    d_in = dataset.feature_dim if prev is None else int(prev.shape[1])
    d_out = _probe_out_dim(model, l, d_in, gcn)
    t = {"plan": 0.0, "local_graph": 0.0, "read": 0.0, "compute": 0.0, "write": 0.0}

    # ---- memory: output buffer, cache, block working set ----
    trim_malloc()
    rss0 = _rss()
    rows = min(chunk_rows, max(n, 1))
    # RSS may have grown since the start (allocator arenas, the chunk cache's
    # last contents); if the budget is now short, run with the minimum.
    floor = budget - 2 * rows * d_out * 4 - SAFETY_BYTES - 2 * MiB
    pressure = rss0 > floor
    cap, work, node_bytes, edge_bytes = plan_memory(budget, min(rss0, floor), rows, d_in, d_out,
                                                     True, cache_chunks, num_chunks)
    in_chunk_bytes = rows * d_in * 4
    max_targets = int(block_rows or chunk_rows)

    t0 = time.perf_counter()
    starts = plan_blocks(indptr, perm, chunk_rows, max_targets, node_bytes, edge_bytes, work)
    nblocks = starts.shape[0] - 1
    layer0_mode = None
    keyof = rowof
    if prev is not None:
        ptr, seq = access_plan(indptr, indices, perm, rowof, starts, chunk_rows, num_chunks)
    else:
        # Layer 0: read the rows each block needs (pages, deduplicated per
        # block) or whole feature chunks through the cache -- whichever the
        # plan says reads fewer bytes.
        lay = dataset.layout
        ident = rowof if perm is rowof else np.arange(n, dtype=np.int64)
        if lay.rows_per_page:
            page_bytes = count_block_keys(indptr, indices, perm, starts, lay.rows_per_page,
                                          lay.num_pages) * PAGE
        else:
            page_bytes = count_block_keys(indptr, indices, perm, starts, 1, n) \
                * lay.pages_per_row * PAGE
        ptr, seq = access_plan(indptr, indices, perm, ident, starts, chunk_rows, num_chunks)
        sim = simulate(seq, cap, policy, num_keys=num_chunks) if cap else None
        chunk_bytes = (sim["misses"] if sim else seq.shape[0]) * rows * lay.row_bytes
        if cap and chunk_bytes < page_bytes:
            layer0_mode, keyof = "chunks", ident
        else:
            layer0_mode, ptr, seq, cap = "rows", None, None, 0
        layer0_mode = {"mode": layer0_mode, "planned_row_bytes": int(page_bytes),
                       "planned_chunk_bytes": int(chunk_bytes)}
    t["plan"] = time.perf_counter() - t0

    # ---- resume inside the layer ----
    arr = group[name] if name in group else None
    first_chunk = int(state["chunks_done"]) if (state["layer"] == l and arr is not None) else 0
    if arr is None:
        arr = group.create_array(name, shape=(n, d_out), dtype="float32",
                                 chunks=(chunk_rows, d_out), compressors=None, fill_value=0.0,
                                 overwrite=True)
    first_block = int(np.searchsorted(starts, first_chunk * chunk_rows, side="left"))
    state.update(layer=l, chunks_done=first_chunk)

    bytes_read = 0
    chunk_reads = 0

    def load_chunk(c: int) -> np.ndarray:
        nonlocal bytes_read, chunk_reads
        a0, a1 = c * chunk_rows, min(n, (c + 1) * chunk_rows)
        if prev is not None:
            a = np.asarray(prev[a0:a1])
            bytes_read += a.nbytes
        else:
            st = getattr(reader, "stats", None)
            before = st.bytes_read if st is not None else 0
            a = np.asarray(reader.read(np.arange(a0, a1, dtype=np.int64)), dtype=np.float32)
            bytes_read += (st.bytes_read - before if st is not None
                           else (a1 - a0) * dataset.layout.row_bytes)
        chunk_reads += 1
        return a

    cache = None
    if seq is not None:
        cache = ChunkCache(cap, policy, sequence=seq[ptr[first_block]:], loader=load_chunk,
                           num_keys=num_chunks)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=num_chunks, initial=first_chunk, desc=f"layer {l + 1}/{model.num_layers}",
                   unit="chunk")
    peak_block_nodes = peak_block_edges = 0
    b = first_block
    for c in range(first_chunk, num_chunks):
        c0, c1 = c * chunk_rows, min(n, (c + 1) * chunk_rows)
        buf = np.empty((c1 - c0, d_out), dtype=np.float32)
        while b < nblocks and starts[b] < c1:
            s, e = int(starts[b]), int(starts[b + 1])
            t0 = time.perf_counter()
            nodes, src, dst = build_local(indptr, indices, perm, s, e, scratch, gcn)
            nt = e - s
            if gcn:
                loops = np.arange(nt, dtype=np.int64)
                dl = dinv[nodes]
                w = np.concatenate([dl[src] * dl[dst], dl[:nt] * dl[:nt]])
                src = np.concatenate([src, loops])
                dst = np.concatenate([dst, loops])
            t1 = time.perf_counter()
            t["local_graph"] += t1 - t0
            x = np.empty((nodes.shape[0], d_in), dtype=np.float32)
            if seq is None:
                o = np.argsort(nodes)
                st = getattr(reader, "stats", None)
                before = st.bytes_read if st is not None else 0
                x[o] = reader.read(nodes[o])
                bytes_read += (st.bytes_read - before if st is not None
                               else nodes.shape[0] * dataset.layout.row_bytes)
            else:
                rows = keyof[nodes]
                o = np.argsort(rows)
                srows = rows[o]
                chunks = seq[ptr[b]:ptr[b + 1]]
                data = None
                lo = np.searchsorted(srows, chunks * chunk_rows, side="left")
                hi = np.searchsorted(srows, (chunks + 1) * chunk_rows, side="left")
                for k in range(chunks.shape[0]):
                    cc = int(chunks[k])
                    data = cache.get(cc)
                    a, z = int(lo[k]), int(hi[k])
                    x[o[a:z]] = data[srows[a:z] - cc * chunk_rows]
                del data
            t2 = time.perf_counter()
            t["read"] += t2 - t1
            ei = torch.from_numpy(np.stack([src, dst]))
            ew = torch.from_numpy(w) if gcn else None
            h = model.layer(l, torch.from_numpy(x), ei, ew)
            buf[s - c0:e - c0] = h[:nt].numpy()
            peak_block_nodes = max(peak_block_nodes, int(nodes.shape[0]))
            peak_block_edges = max(peak_block_edges, int(src.shape[0]))
            del h, ei, ew, x, nodes, src, dst
            t["compute"] += time.perf_counter() - t2
            b += 1
        t0 = time.perf_counter()
        arr[c0:c1] = buf
        del buf
        _fsync_path(Path(group.store.root) / name / "c" / str(c) / "0")
        state["chunks_done"] = c + 1
        write_json(pfile, state)
        t["write"] += time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
        if on_chunk is not None:
            on_chunk(l, c)
    if bar is not None:
        bar.close()
    return {
        "layer": l + 1, "array": name, "in_dim": d_in, "out_dim": d_out,
        "blocks": nblocks, "blocks_run": nblocks - first_block,
        "resumed_chunks": first_chunk, "peak_block_nodes": peak_block_nodes,
        "peak_block_edges": peak_block_edges, "work_bytes": int(work),
        "rss_at_start": rss0, "budget_pressure": bool(pressure), "bytes_read": int(bytes_read), "chunk_reads": chunk_reads,
        "accesses": None if seq is None else int(seq.shape[0] - ptr[first_block]),
        "cache": None if cache is None else {**cache.stats(), "chunk_bytes": in_chunk_bytes},
        "layer0_reads": layer0_mode,
        "time_s": {k: round(v, 4) for k, v in t.items()},
    }


def _predictions(dataset: Dataset, group, name: str, perm: np.ndarray, chunk_rows: int,
                 num_chunks: int, write: bool = True) -> dict:
    """Write ``pred`` (argmax of the last layer, processing order) and accuracies
    (``write=False``: read ``pred`` as it is)."""
    n = perm.shape[0]
    arr = group[name]
    if write:
        pred_arr = group.create_array("pred", shape=(n,), dtype="int64", chunks=(chunk_rows,),
                                      compressors=None, fill_value=-1, overwrite=True)
    else:
        pred_arr = group["pred"]
    has_labels = dataset.num_classes > 0
    splits = {"train": dataset.train_idx, "val": dataset.val_idx, "test": dataset.test_idx}
    split_of = None
    if has_labels:
        split_of = np.zeros(n, dtype=np.int8)
        for code, ids in ((1, splits["train"]), (2, splits["val"]), (3, splits["test"])):
            split_of[ids] = code
    correct = np.zeros(4, dtype=np.int64)
    total = np.zeros(4, dtype=np.int64)
    for c in range(num_chunks):
        c0, c1 = c * chunk_rows, min(n, (c + 1) * chunk_rows)
        if write:
            p = np.asarray(arr[c0:c1]).argmax(axis=1).astype(np.int64)
            pred_arr[c0:c1] = p
        else:
            p = np.asarray(pred_arr[c0:c1])
        if has_labels:
            nodes = perm[c0:c1]
            y = np.asarray(dataset.labels[nodes])
            sp = split_of[nodes]
            ok = (p == y) & (y >= 0)
            valid = y >= 0
            correct += np.bincount(sp[ok], minlength=4)
            total += np.bincount(sp[valid], minlength=4)
    res: dict[str, Any] = {"predictions": "pred"}
    if has_labels:
        res["accuracy"] = {k: (float(correct[i] / total[i]) if total[i] else None)
                           for i, k in ((1, "train"), (2, "val"), (3, "test"))}
        res["test_accuracy"] = res["accuracy"]["test"]
    return res
