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

Under ``preset="ooc"`` the inspector samples superbatches ahead, precomputes
Belady changesets, and the feature cache serves the rows; ``"static"`` keeps a
degree-ordered static cache; ``"baseline"`` reads memmaps through the page
cache. The batches are the same in every preset for one seed.
"""
from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .batch import to_data
from ...storage.errors import IdOutOfRange, InvalidValue

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
    from .presets import resolve_preset

    resolve_preset(preset)
    if isinstance(num_neighbors, dict):
        raise InvalidValue("num_neighbors as a dict (per edge type) is for heterogeneous graphs, "
                       "which ooc does not support: give one list, e.g. [10, 10]")
    if isinstance(num_neighbors, (str, bytes)) or not hasattr(num_neighbors, "__iter__"):
        raise InvalidValue(f"num_neighbors {num_neighbors!r}: a list with one int per layer, as in "
                       f"PyG, e.g. [10, 10]")
    values: list[Any] = list(num_neighbors)  # the caller's values, checked here
    whole = all((isinstance(f, (int, np.integer)) and not isinstance(f, bool))
                or (isinstance(f, float) and f.is_integer()) for f in values)
    fanouts = [int(f) for f in values] if whole else []
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise InvalidValue(f"num_neighbors {list(num_neighbors)}: one value per layer, each "
                       f"> 0 or -1 (all)")
    if int(batch_size) < 1:
        raise InvalidValue(f"batch_size must be >= 1, got {batch_size}")
    return fanouts


class NodeLoader:
    """Mini-batches of an on-disk dataset as PyG ``Data``, out of core.

    The first three arguments are PyG ``NeighborLoader``'s, in its order; the rest are
    keywords.

    Args:
        dataset: an opened :class:`ooc.storage.Dataset` or a dataset folder.
        num_neighbors: neighbours sampled per layer (``-1`` = all), as in PyG.
        input_nodes: ``"train"``, ``"val"``, ``"test"``, an int array of node ids
            or a boolean mask, or None (all nodes).
        batch_size: seeds per batch.
        shuffle: a fresh seeded order of the seeds every epoch.
        preset: ``"ooc"`` (Ginex: neighbor cache, superbatch inspector, Belady
            feature cache), ``"static"`` (neighbor cache, static feature cache)
            or ``"baseline"`` (memmaps, page cache); or a cache policy object
            (:mod:`ooc.executor.cache.policies`, e.g. ``BeladyCache(superbatch_size=8)``)
            or a :class:`~ooc.executor.loader.presets.Preset`.
        memory_budget: bytes the process may hold (the caches get what is left
            after the measured working memory; see :mod:`ooc.executor.sizing.budget`).
        seed: sampling seed; the same seed gives the same batches in every preset.
        io_backend: reader of the O_DIRECT presets (``"auto"``, ``"io_uring"``, ...).
        num_threads: sampler threads (default: all cores).
        labels: attach ``data.y`` (every node's label, seeds first as in PyG; -1 where
            unlabeled): a loss takes ``data.y[:data.batch_size]``.
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

    def __init__(self, dataset, num_neighbors: Sequence[int] = (10, 10), input_nodes=None, *,
                 batch_size: int = 1024, shuffle: bool = False, preset: Any = "ooc",
                 memory_budget: int | str | None = None, seed: int = 0, io_backend: str = "auto",
                 num_threads: int | None = None, labels: bool = True, **options: Any):
        from ...storage import open_dataset
        from .presets import resolve_preset
        from .stack import ModeOptions, build_stack
        from ..training.config import TrainConfig

        if isinstance(dataset, (str, Path)):
            dataset = open_dataset(dataset)
        fanouts = check_loader_args(num_neighbors, batch_size, preset)
        if isinstance(memory_budget, str):
            from ...cli import parse_size

            memory_budget = parse_size(memory_budget)
        try:
            opts = ModeOptions(io_backend=io_backend, memory_budget=memory_budget, **options)
        except TypeError as e:
            raise InvalidValue(f"NodeLoader: {e}") from None
        self.dataset = dataset
        self.seeds = resolve_input_nodes(dataset, input_nodes)
        self.preset = resolve_preset(preset)
        self.batch_size = int(batch_size)
        self.config = TrainConfig(fanouts=fanouts, batch_size=self.batch_size, seed=int(seed),
                                  num_threads=num_threads, progress=False)
        self.config.validate()
        self.memory_plan = None
        if memory_budget:
            from ..sizing.budget import plan_memory

            self.memory_plan = plan_memory(dataset, self.config, int(memory_budget), opts,
                                           preset=self.preset)
        self._labels = dataset.labels if labels else None
        # input_id of a seed: its position in ``seeds`` (PyG's NeighborLoader gives it)
        self._seed_order = np.argsort(self.seeds, kind="stable")
        self._seeds_sorted = self.seeds[self._seed_order]
        self._stack = build_stack(dataset, self.config, opts, plan=self.memory_plan,
                                  seeds=self.seeds, shuffle=shuffle, preset=self.preset)
        self._finalizer = weakref.finalize(self, self._stack.close)
        self._next_epoch = 1

    # -- epochs -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._stack.train)

    def set_epoch(self, epoch: int) -> None:
        """The epoch (>= 1) the next ``iter()`` runs; it decides the order and samples."""
        if int(epoch) < 1:
            raise InvalidValue(f"epoch must be >= 1, got {epoch}")
        self._next_epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._next_epoch

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise InvalidValue("NodeLoader is closed")
        epoch = self._next_epoch
        self._next_epoch += 1
        return self._epoch(epoch)

    def _epoch(self, epoch: int) -> Iterator[Any]:
        labels = self._labels
        batches = self._stack.train.batches(epoch)
        while True:
            if not self._finalizer.alive:  # an iterator kept past close()
                raise InvalidValue("NodeLoader is closed")
            try:
                batch, rows = next(batches)
            except StopIteration:
                return
            y = None
            if labels is not None:  # every node's, as PyG's loaders give them
                y = np.asarray(labels[np.asarray(batch.node_ids, dtype=np.int64)],
                               dtype=np.int64)
            data = to_data(batch, rows, y)
            seeds = np.asarray(batch.node_ids[:int(batch.num_seeds)], dtype=np.int64)
            data.input_id = torch.as_tensor(
                self._seed_order[np.searchsorted(self._seeds_sorted, seeds)])
            yield data

    # -- what happened ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Stage seconds of the last epoch, I/O counters and the feature-cache hit ratio so far,
        and the preset's set-up (cache sizes, reader backend)."""
        train = self._stack.train
        return {"preset": self.preset.name, "batches_per_epoch": len(self),
                "stage_seconds": train.stage_times(), "io": train.io_stats(),
                "setup": dict(self._stack.info)}

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Release readers, threads and runtime files (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "NodeLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"NodeLoader({self.dataset.path}, num_neighbors={self.config.fanouts}, "
                f"batch_size={self.batch_size}, seeds={len(self.seeds)}, preset={self.preset.name!r})")
