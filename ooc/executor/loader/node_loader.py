"""``ooc.NodeLoader``: out-of-core mini-batches for a user's own PyG model and loop.

The loader is what the trainer and the CLI run on, handed to the user: each
``iter()`` is one epoch of ``torch_geometric.data.Data`` batches in PyG
``NeighborLoader`` conventions, sampled and gathered by one of the presets
(:data:`ooc.executor.loader.presets.PRESETS`), or a cache policy::

    with ooc.NodeLoader(ds, num_neighbors=[10, 10], batch_size=1024,
                        input_nodes="train", shuffle=True) as loader:
        for epoch in range(10):
            for data in loader:                      # the next epoch
                out = model(data.x, data.edge_index)[:data.batch_size]
                loss = F.cross_entropy(out, data.y[:data.batch_size])

A ``with ooc.memory_budget("4GiB"):`` block around the loaders of a script
splits one budget between them (:mod:`ooc.executor.loader.process_budget`).

Under ``preset="ooc"`` the inspector samples superbatches ahead, precomputes
Belady changesets, and the feature cache serves the rows; ``"static"`` keeps a
degree-ordered static cache; ``"baseline"`` reads memmaps through the page
cache. The batches are the same in every preset for one seed.
"""
from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, ContextManager, Generator, Iterator, Protocol, Sequence

import numpy as np
import torch

from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.executor.loader.batch import to_data
from ooc.executor.loader.presets import resolve_preset
from ooc.executor.loader.process_budget import current_budget, parse_budget
from ooc.executor.loader.stack import ModeOptions, SamplingSettings, build_stack
from ooc.executor.settings import BY_NAME, MODE, check_fanouts, check_keywords, default
from ooc.executor.sizing.budget import plan_memory
from ooc.storage import open_dataset
from ooc.storage.finite import check_finite_rows

SPLITS = ("train", "val", "test")


def resolve_input_nodes(dataset, input_nodes) -> np.ndarray:
    """Seed node ids (int64 [n]) for ``"train"``/``"val"``/``"test"``, an id array, or None (all).

    Raises :class:`OocError` for an unknown split name, a non-integer or
    multi-dimensional array, or ids outside ``[0, num_nodes)``.
    """
    n = dataset.num_nodes
    if input_nodes is None:
        return np.arange(n, dtype=np.int64)
    if isinstance(input_nodes, str):
        if input_nodes not in SPLITS:
            raise InvalidValue(f"input_nodes {input_nodes!r}: expected one of {', '.join(SPLITS)}, "
                           f"an array of node ids, or None (all nodes)")
        return np.asarray(getattr(dataset, f"{input_nodes}_idx"), dtype=np.int64)
    ids = np.asarray(input_nodes.cpu().numpy() if hasattr(input_nodes, "cpu") else input_nodes)
    if ids.dtype == bool:
        if ids.shape != (n,):
            raise InvalidValue(f"input_nodes: a boolean mask needs shape ({n},), got {ids.shape}")
        return np.flatnonzero(ids).astype(np.int64)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise InvalidValue(f"input_nodes: expected a 1-D array of integer node ids, got shape "
                       f"{ids.shape} of {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)][0]
        raise IdOutOfRange(f"input_nodes: node id {bad} out of range [0, {n})")
    return ids


def check_loader_args(num_neighbors: Sequence[int], batch_size: int, preset) -> list[int]:
    """The fanouts (int list) after checking the loader arguments; OocError naming a bad one."""

    resolve_preset(preset)
    if isinstance(num_neighbors, dict):
        raise InvalidValue("num_neighbors as a dict (per edge type) is for heterogeneous graphs, "
                       "which ooc does not support: give one list, e.g. [10, 10]")
    fanouts = check_fanouts(num_neighbors, "num_neighbors")
    BY_NAME["batch_size"].check(batch_size)
    return fanouts


def _keywords() -> list[str]:
    """The keywords :class:`NodeLoader` takes: its own and the cache and I/O settings."""
    import inspect

    own = [k for k in inspect.signature(NodeLoader.__init__).parameters
           if k not in ("self", "options")]
    return own + [s.name for s in MODE if s.name not in own]


class BatchSource(Protocol):
    """Where a :class:`NodeLoader`'s batches come from: its own stack
    (:class:`OwnStack`), its share of a budget group
    (:class:`~ooc.executor.loader.process_budget.Membership`), or a pipeline its caller
    built and owns (:class:`GivenPipeline`: the trainer's)."""

    @property
    def plan(self) -> Any:
        """The memory plan the caches were sized by (None: no budget)."""

    @property
    def info(self) -> dict:
        """What was built (sizes, readers, superbatch size)."""

    def pipeline(self) -> Any:
        """The :class:`~ooc.executor.loader.pipelines.BatchPipeline` of the loader's seeds."""

    def epoch(self) -> ContextManager[Any]:
        """A context held while one of the loader's epochs runs."""

    def close(self) -> None:
        """Release what the source holds for the loader (idempotent)."""


class OwnStack:
    """A loader's own stack (no shared budget): built when made, closed with the loader."""

    def __init__(self, stack, plan, workers: int):
        self.stack, self.plan = stack, plan
        stack.train.workers = workers

    def pipeline(self):
        if self.stack is None:
            raise InvalidValue("NodeLoader is closed")
        return self.stack.train

    @property
    def info(self) -> dict:
        return dict(self.stack.info) if self.stack is not None else {}

    def epoch(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        """Close the stack and let go of it: a closed loader holds no cache."""
        stack, self.stack = self.stack, None
        if stack is not None:
            stack.close()


class GivenPipeline:
    """A pipeline its caller built with :func:`~ooc.executor.loader.stack.build_stack` and
    owns (the trainer's training and evaluation pipelines): the loader reads batches from
    it and leaves closing it to the caller."""

    plan = None

    def __init__(self, pipeline):
        self._pipeline = pipeline

    def pipeline(self):
        return self._pipeline

    @property
    def info(self) -> dict:
        return dict(getattr(self._pipeline, "info", None) or {})

    def epoch(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        self._pipeline = None


#: ``labels=`` of :class:`NodeLoader`: which nodes' labels ``data.y`` holds.
LABELS = {True: "all", "all": "all", "seeds": "seeds", False: None, None: None}


def _check_labels(labels) -> str | None:
    try:
        return LABELS[labels]
    except (KeyError, TypeError):
        raise InvalidValue(f"labels {labels!r}: expected True (every node's, as PyG), "
                           f"'seeds' (the seeds' only) or False") from None


def _check_workers(num_workers, persistent_workers: bool) -> int:
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) \
            or num_workers < 0:
        raise InvalidValue(f"num_workers must be an int >= 0, got {num_workers!r}")
    if persistent_workers and num_workers == 0:
        raise InvalidValue("persistent_workers needs num_workers > 0 (as in PyG)")
    return int(num_workers)


class NodeLoader:
    """Mini-batches of an on-disk dataset as PyG ``Data``, out of core.

    The first three arguments are PyG ``NeighborLoader``'s, in its order; then
    ``torch.utils.data.DataLoader``'s that apply; the rest are keywords.

    Args:
        dataset: an opened :class:`ooc.storage.Dataset` or a dataset folder.
        num_neighbors: neighbours sampled per layer (``-1`` = all), as in PyG.
        input_nodes: ``"train"``, ``"val"``, ``"test"``, an int array of node ids
            or a boolean mask, or None (all nodes).
        batch_size: seeds per batch.
        shuffle: a fresh seeded order of the seeds every epoch.
        num_workers: threads of this process that make batches ahead of the loop
            (sampling and reads release the GIL, and the caches are shared, not
            copied per worker): 0 makes each batch in the calling thread when it is
            asked for; n makes n batches at once (the ``ooc`` preset gathers in
            order through one thread: its cache changes after every batch). Each
            thread holds the batches it queues: the memory plan counts them.
        persistent_workers: accepted as in PyG (needs ``num_workers > 0``). The
            workers are threads and the readers and caches live as long as the
            loader whatever it says, so no epoch pays a start-up.
        pin_memory: put each batch's tensors in page-locked memory (for a fast
            copy to a CUDA device); without CUDA a warning says it is ignored.
        preset: ``"ooc"`` (Ginex: neighbor cache, superbatch inspector, Belady
            feature cache), ``"static"`` (neighbor cache, static feature cache)
            or ``"baseline"`` (memmaps, page cache); or a cache policy object
            (:mod:`ooc.caches.policies`, e.g. ``BeladyCache(superbatch_size=8)``)
            or a :class:`~ooc.executor.loader.presets.Preset`.
        memory_budget: bytes (or ``"4GiB"``) this loader may use on its own (the
            caches get what is left after the measured working memory; see
            :mod:`ooc.executor.sizing.budget`). None: the process's budget when one
            is set (``with ooc.memory_budget(...)``), shared with the other loaders
            made under it; else no budget.
        seed: sampling seed; the same seed gives the same batches in every preset.
        io_backend: reader of the O_DIRECT presets (``"auto"``, ``"io_uring"``, ...).
        num_threads: sampler threads (default: all cores).
        labels: ``True``: ``data.y`` holds every node's label, seeds first, as in PyG
            (-1 where unlabeled); ``"seeds"``: the seeds' labels only ([batch_size],
            one label read per seed instead of per node: what the trainer uses);
            ``False``: no ``data.y``. A loss takes ``data.y[:data.batch_size]`` in
            either form.
        source: a :class:`BatchSource` the batches come from instead of the loader's
            own stack: a :class:`GivenPipeline` over a pipeline built with
            :func:`~ooc.executor.loader.stack.build_stack` for ``input_nodes`` with these
            sampling settings (what the trainer runs), which the loader does not close.
        **options: cache and I/O settings of :class:`~ooc.executor.loader.stack.ModeOptions`
            (``feature_cache_size``, ``neighbor_cache_size``, ``superbatch_size``,
            ``runtime_dir``, ``runtime_disk_budget``, ``queue_depth``, ``io_threads``).

    Each ``iter()`` runs the next epoch (the first is epoch 1, as the trainer's;
    :meth:`set_epoch` picks one). ``len()`` is the number of batches per epoch.
    Each ``Data`` has ``x`` (float32 [n, dim]), ``edge_index`` (int64 [2, m],
    row 0 = neighbour, row 1 = sampled node, local ids), ``y`` (int64 [n], every
    node's label, seeds first), ``n_id`` (int64 [n], seeds first), ``input_id``
    (int64 [batch_size], each seed's position in ``input_nodes``), ``batch_size``,
    ``num_sampled_nodes`` and ``num_sampled_edges`` (per hop). Close the loader
    (or use it as a context manager) to release its readers, threads and
    runtime files; garbage collection does the same.
    """

    def __init__(self, dataset, num_neighbors: Sequence[int] = default("fanouts"),
                 input_nodes=None, *, batch_size: int = default("batch_size"),
                 shuffle: bool = False, num_workers: int = 1, persistent_workers: bool = False,
                 pin_memory: bool = False, preset: Any = default("mode"),
                 memory_budget: int | str | None = None, seed: int = default("seed"),
                 io_backend: str = default("io_backend"), num_threads: int | None = None,
                 labels: bool | str = True, source: BatchSource | None = None,
                 **options: Any):
        workers = _check_workers(num_workers, persistent_workers)
        shared = current_budget() if memory_budget is None and source is None else None
        if isinstance(dataset, (str, Path)):
            dataset = shared.dataset(dataset) if shared is not None else open_dataset(dataset)
        fanouts = check_loader_args(num_neighbors, batch_size, preset)
        own_budget = parse_budget(memory_budget) if memory_budget is not None else None
        check_keywords("NodeLoader", options, _keywords())
        opts = ModeOptions(io_backend=io_backend, memory_budget=own_budget, **options)
        self.seeds = seeds = self._resolve_seeds(dataset, input_nodes)
        self.preset = resolve_preset(preset)
        self.num_workers = workers
        self.persistent_workers = bool(persistent_workers)
        self.sampling = SamplingSettings(fanouts=fanouts, batch_size=int(batch_size),
                                         seed=int(seed), num_threads=num_threads)
        self.sampling.validate()
        opts.validate()
        label_mode = _check_labels(labels)
        if source is not None and (own_budget is not None or options):
            raise InvalidValue("NodeLoader: source= brings its own readers and caches; give "
                               "it without memory_budget or cache options")
        if source is None:
            source = self._source_of(dataset, seeds, shuffle, workers, opts, shared)
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn("NodeLoader: pin_memory=True but no CUDA device is available; "
                          "batches are not pinned", UserWarning, stacklevel=2)
        self._labels = label_mode
        self._index_seeds(seeds)
        #: seconds spent turning batches into ``Data`` during the last epoch
        self.convert_seconds = 0.0
        self._source: BatchSource = source
        self._finalizer = weakref.finalize(self, source.close)
        self._next_epoch = 1
        # every batch's rows are checked finite unless the dataset was written keeping
        # non-finite values (ooc.prepare --allow-nonfinite)
        self._finite_file = (None if int(dataset.meta.get("nonfinite_features", 0) or 0)
                             else dataset.features_file)
        #: the epoch an unfinished iterator runs (None: none)
        self._running: int | None = None

    def _resolve_seeds(self, dataset, input_nodes) -> Any:
        """What the pipeline's epoch plans split into batches: seed node ids."""
        return resolve_input_nodes(dataset, input_nodes)

    def _index_seeds(self, seeds: np.ndarray) -> None:
        """Index ``seeds`` for ``input_id`` (a seed's position in them, as PyG gives it)."""
        self._seed_order = np.argsort(seeds, kind="stable")
        self._seeds_sorted = seeds[self._seed_order]

    def _source_of(self, dataset, seeds: np.ndarray, shuffle: bool, workers: int,
                   opts: ModeOptions, shared) -> BatchSource:
        """The loader's share of the process's budget group (``shared``), else its own
        stack, sized by its own budget's plan when it has one."""
        if shared is not None:
            return shared.join(dataset, self.preset, opts, self.sampling, seeds, shuffle,
                               workers)
        plan = None
        if opts.memory_budget:
            plan = plan_memory(dataset, self.sampling, opts.memory_budget, opts, seeds=seeds,
                               preset=self.preset, workers=workers)
        stack = build_stack(dataset, self.sampling, opts, plan=plan, seeds=seeds,
                            shuffle=shuffle, preset=self.preset)
        return OwnStack(stack, plan, workers)

    @property
    def memory_plan(self):
        """The memory plan (:class:`~ooc.executor.sizing.budget.MemoryPlan`) under a budget:
        under a shared one, the split's once the first epoch has started; else None."""
        return self._source.plan

    # -- epochs -----------------------------------------------------------------
    def __len__(self) -> int:
        return -(-len(self.seeds) // self.batch_size) if len(self.seeds) else 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch (>= 1) the next ``iter()`` runs; it decides the order and samples."""
        if int(epoch) < 1:
            raise InvalidValue(f"epoch must be >= 1, got {epoch}")
        self._next_epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._next_epoch

    def _check_not_running(self) -> None:
        """Refuse a second epoch while an iterator has one unfinished: the pipeline and its
        cache serve one epoch at a time."""
        if self._running is not None:
            raise InvalidValue(f"this NodeLoader is already being iterated (epoch "
                               f"{self._running}); finish or close the first iterator, or "
                               f"make a second NodeLoader")

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise InvalidValue("NodeLoader is closed")
        self._check_not_running()  # before the epoch moves on
        epoch = self._next_epoch
        self._next_epoch += 1
        return self.batches(epoch)

    def batches(self, epoch: int) -> Generator[Any, None, None]:
        """The ``Data`` batches of ``epoch`` without moving :attr:`epoch` (``iter()`` runs
        the next one); the trainer evaluates with epoch 0."""
        if not self._finalizer.alive:
            raise InvalidValue("NodeLoader is closed")
        return self._epoch(int(epoch))

    def _epoch(self, epoch: int) -> Generator[Any, None, None]:
        self._check_not_running()
        self._running = epoch
        try:
            yield from self._epoch_batches(epoch)
        finally:
            self._running = None

    def _epoch_batches(self, epoch: int) -> Generator[Any, None, None]:
        self.convert_seconds = 0.0
        with self._source.epoch():
            batches = self._checked(self._source.pipeline().batches(epoch))
            i = 0
            while True:
                if not self._finalizer.alive:  # an iterator kept past close()
                    raise InvalidValue("NodeLoader is closed")
                try:
                    batch, rows = next(batches)
                except StopIteration:
                    return
                t0 = time.perf_counter()
                data = self._data(batch, rows, epoch, i)
                i += 1
                self.convert_seconds += time.perf_counter() - t0
                yield data

    def _data(self, batch, rows, epoch: int = 0, index: int = 0):
        """The one conversion of a sampled batch and its rows into PyG ``Data`` (batch
        ``index`` of ``epoch``)."""
        seeds = np.asarray(batch.node_ids[:int(batch.num_seeds)], dtype=np.int64)
        y = None
        if self._labels == "all":  # every node's, as PyG's loaders give them
            y = self.dataset.read_labels(batch.node_ids)
        elif self._labels == "seeds":
            y = self.dataset.read_labels(seeds)
        data = self._complete(to_data(batch, rows, y), seeds, epoch, index)
        if self.pin_memory:
            data = data.pin_memory()
        return data

    def _complete(self, data, seeds: np.ndarray, epoch: int, index: int):
        """``data`` with what the loader's seeds add: ``input_id``, each seed's position
        in them."""
        data.input_id = torch.as_tensor(
            self._seed_order[np.searchsorted(self._seeds_sorted, seeds)])
        return data

    def sampled(self, epoch: int) -> Iterator[tuple[Any, np.ndarray]]:
        """The batches of ``epoch`` before they become ``Data``: ``(SampledBatch, rows)``
        pairs (rows [n, dim] in the file's dtype, row k for ``batch.node_ids[k]``), for
        code that builds its own batches (:mod:`ooc.pyg`). Does not move :attr:`epoch`."""
        if not self._finalizer.alive:
            raise InvalidValue("NodeLoader is closed")
        return self._checked(self._source.pipeline().batches(int(epoch)))

    def _checked(self, batches: Iterator[tuple[Any, np.ndarray]]
                 ) -> Generator[tuple[Any, np.ndarray], None, None]:
        """``batches`` (``(SampledBatch, rows)`` pairs), each refused when a feature row
        holds a NaN or an infinity (:func:`~ooc.storage.finite.check_finite_rows`: one line
        naming the node and the feature file), as training's loss check and inference's
        output check refuse them; closing this closes ``batches``."""
        try:
            for batch, rows in batches:
                if self._finite_file is not None:
                    check_finite_rows(rows, batch.node_ids, self._finite_file)
                yield batch, rows
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    # -- what happened ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Stage seconds of the last epoch, I/O counters and the feature-cache hit ratio so far,
        and the preset's set-up (cache sizes, reader backend)."""
        train = self._source.pipeline()
        return {"preset": self.preset.name, "batches_per_epoch": len(self),
                "stage_seconds": train.stage_times(), "io": train.io_stats(),
                "setup": self._source.info}

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Release readers, threads and runtime files (idempotent); under a shared budget
        the group's readers and caches go with its last loader."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "NodeLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"NodeLoader({self.dataset.path}, num_neighbors={self.sampling.fanouts}, "
                f"batch_size={self.batch_size}, seeds={len(self.seeds)}, preset={self.preset.name!r})")
