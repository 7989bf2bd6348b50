"""PyG's remote-backend interfaces over an ooc dataset, topology and features on disk.

PyG's own loaders run over a ``(FeatureStore, GraphStore)`` pair and a
``BaseSampler``; this module gives all three for an ooc dataset, so a PyG
training script keeps its loop and swaps where the data lives::

    feature_store, graph_store, sampler = ooc.pyg.remote_backend(
        "data/cora", num_neighbors=[10, 10], input_nodes="train", batch_size=1024,
        shuffle=True, preset="ooc")
    loader = torch_geometric.loader.NodeLoader(
        (feature_store, graph_store), node_sampler=sampler, **sampler.loader_kwargs())

The sampler samples with ooc's kernels (neighbor cache, O_DIRECT reads of
``indices.bin``), never PyG's (no ``pyg-lib`` or ``torch-sparse`` needed),
and the graph store never loads the adjacency into memory.

**Seeing the future.** The Belady cache needs the coming batches. PyG's
``DataLoader`` decides them, so ``sampler.batch_sampler`` hands it ooc's own
epoch plan (the seeded order of :class:`ooc.NodeLoader`). In the loading
process (``num_workers=0``) a planned batch is then served by an ooc
pipeline running one batch ahead: under ``preset="ooc"`` the inspector
samples superbatches ahead, precomputes Belady changesets and the feature
cache serves the rows the feature store is asked for: PyG asks the store for
``x`` indexed by the very ``SamplerOutput.node`` tensor the sampler returned,
which keys the batch's rows until that tensor is gone. A request the plan did
not foresee (another batch order, a worker process, a second pass) is
sampled on demand with the same sampler and read from disk: still correct,
only without the cache. Batches are identical to :class:`ooc.NodeLoader`'s
for the same settings.

**Link prediction.** PyG's ``LinkNeighborLoader`` (or ``LinkLoader``) runs over the
same three, given ``edge_label_index`` as PyG takes it for a remote backend (``(None,
pairs)``: an edge type and the pairs; the graph store serves CSC, not COO)::

    loader = torch_geometric.loader.LinkNeighborLoader(
        (feature_store, graph_store), num_neighbors=[10, 10], edge_label_index=(None, pairs),
        neg_sampling="binary", batch_size=512, neighbor_sampler=sampler)

Its batches are sampled on demand (PyG's loader decides them; no plan, no Belady
cache: :class:`ooc.LinkLoader` has both), negatives drawn uniformly from a seed of the
batch's edges.

The stores and the sampler pickle by their settings and reopen the dataset in
a worker process: ``sampler.loader_kwargs(num_workers=2)`` asks PyG's loader for
spawned workers (numba's OpenMP thread pool cannot be forked once it ran).
"""
from __future__ import annotations

import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.sampler import (
    BaseSampler,
    EdgeSamplerInput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
)

from ooc.core.errors import IdOutOfRange, InvalidValue, OocError
from ooc.executor.loader.node_loader import NodeLoader, check_loader_args, resolve_input_nodes
from ooc.executor.loader.presets import resolve_preset
from ooc.executor.loader.readers import Sources
from ooc.executor.loader.stack import ModeOptions, cache_sizes, open_sampler
from ooc.sampling.epoch_plan import EpochPlan, unplanned_seed
from ooc.sampling.link_plan import EdgeSeeds
from ooc.sampling.sampler import NeighborSampler
from ooc.storage import open_dataset
from ooc.storage.finite import check_finite_rows

__all__ = ["OocFeatureStore", "OocGraphStore", "OocSampler", "remote_backend"]

_READ_ONLY = ("ooc.pyg: {what} is read-only: it serves the ooc dataset in {path}; write a new "
              "dataset with python -m ooc.prepare instead")



class TensorNotStored(OocError, KeyError):
    """PyG asked the feature store for a tensor it does not hold (only ``x`` and ``y``)."""

class BatchOrder:
    """ooc's seeded order of seed batches per epoch (that of :class:`ooc.NodeLoader`:
    the :class:`~ooc.sampling.epoch_plan.EpochPlan` of each epoch).

    ``positions(e)`` are index positions into ``seeds`` (int64 arrays), the
    batches PyG's ``DataLoader`` gets from :attr:`OocSampler.batch_sampler`;
    ``epoch`` is the epoch whose batches are being loaded (advanced by each
    ``iter()`` of the batch sampler; 0 before the first). A batch is found from
    its positions through the epoch's inverse order (8 bytes per seed).
    """

    def __init__(self, seeds: np.ndarray, batch_size: int, shuffle: bool, seed: int):
        self.seeds = seeds
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self._cached: tuple[int, list[np.ndarray], np.ndarray] | None = None

    def plan(self, epoch: int) -> EpochPlan:
        """The epoch plan of ``epoch`` over the seeds' positions."""
        return EpochPlan(np.arange(len(self.seeds), dtype=np.int64), self.batch_size,
                         self.seed, epoch, self.shuffle)

    def _epoch(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        if self._cached is None or self._cached[0] != epoch:
            pos = self.plan(epoch).batches
            batch_of = np.empty(len(self.seeds), dtype=np.int64)  # position -> its batch
            for b, p in enumerate(pos):
                batch_of[p] = b
            self._cached = (epoch, pos, batch_of)
        return self._cached[1], self._cached[2]

    def positions(self, epoch: int) -> list[np.ndarray]:
        return self._epoch(epoch)[0]

    def batch_index(self, epoch: int, input_id: np.ndarray) -> int | None:
        """Which batch of ``epoch`` holds exactly the positions ``input_id``, or None."""
        ids = np.asarray(input_id, dtype=np.int64).reshape(-1)
        if epoch < 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= len(self.seeds):
            return None
        pos, batch_of = self._epoch(epoch)
        k = int(batch_of[ids[0]])
        return k if np.array_equal(pos[k], ids) else None

    def __len__(self) -> int:
        return -(-len(self.seeds) // self.batch_size)


class PlannedBatches(torch.utils.data.Sampler):
    """The batch sampler for PyG's loader: each ``iter()`` is the plan's next epoch."""

    def __init__(self, plan: BatchOrder):
        self.plan = plan
        self._unstarted = False  # an iterator was made and no batch drawn from it yet

    def __iter__(self) -> Iterator[list[int]]:
        # The epoch advances now, not lazily: worker processes are started (and pickle the
        # plan) before the loader draws the first batch. PyTorch's multi-worker iterator
        # makes a second iterator before drawing from the first: that one is the same epoch.
        if not self._unstarted:
            self.plan.epoch += 1
        self._unstarted = True
        batches = [p.tolist() for p in self.plan.positions(self.plan.epoch)]

        def draw() -> Iterator[list[int]]:
            self._unstarted = False
            yield from batches

        return draw()

    def __len__(self) -> int:
        return len(self.plan)

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` loads ``epoch`` (>= 1)."""
        if int(epoch) < 1:
            raise InvalidValue(f"epoch must be >= 1, got {epoch}")
        self.plan.epoch = int(epoch) - 1
        self._unstarted = False


class _Backend:
    """What the stores and the sampler share: the dataset, the plan, the readers, and the
    pipeline that serves planned batches. Pickles by its settings; a copy in another process
    reopens the dataset and serves every request on demand."""

    def __init__(self, settings: dict[str, Any], plan_epoch: int = 0, main: bool = True):
        self.settings = settings
        self.dataset = open_dataset(settings["path"])
        ds = self.dataset
        self.plan = BatchOrder(resolve_input_nodes(ds, settings["input_nodes"]),
                               settings["batch_size"], settings["shuffle"], settings["seed"])
        self.plan.epoch = plan_epoch
        self.main = main and settings["plan_ahead"]
        self.lock = threading.Lock()
        self._loader: NodeLoader | None = None  # serving planned batches (loading process)
        self._ahead: Generator | None = None
        self._ahead_epoch = 0
        self._ahead_next = 0
        self._sampler: NeighborSampler | None = None  # on-demand sampler
        self._sources: Sources | None = None          # on-demand readers
        # x of planned batches by the id of their SamplerOutput's ``node`` tensor, which PyG
        # hands the feature store as the index; an entry goes when that tensor does
        self._planned_x: dict[int, torch.Tensor] = {}
        self.counts = {"planned_batches": 0, "on_demand_batches": 0,
                       "planned_reads": 0, "on_demand_reads": 0}
        if self.main:
            self.loader()  # planned, sized and warmed up now, not inside the first epoch

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "plan_epoch": self.plan.epoch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["settings"], state["plan_epoch"], main=False)

    # -- planned batches ---------------------------------------------------------------
    def loader(self):
        if self._loader is None:
            s = self.settings
            self._loader = NodeLoader(self.dataset, s["num_neighbors"], self.plan.seeds,
                                      batch_size=s["batch_size"], shuffle=s["shuffle"],
                                      preset=s["preset"], memory_budget=s["memory_budget"],
                                      seed=s["seed"], io_backend=s["io_backend"],
                                      num_threads=s["num_threads"], labels=False, **s["options"])
        return self._loader

    def take_planned(self, epoch: int, b: int):
        """``(SampledBatch, rows)`` of planned batch ``b`` of ``epoch`` from the pipeline running
        ahead, skipping batches the loader never asked for; None when ``b`` is behind it."""
        if self._ahead is None or self._ahead_epoch != epoch:
            self.close_ahead()
            self._ahead = iter(self.loader().sampled(epoch))
            self._ahead_epoch, self._ahead_next = epoch, 0
        if b < self._ahead_next:
            return None
        for item in self._ahead:
            k = self._ahead_next
            self._ahead_next += 1
            if k == b:
                return item
        return None

    def close_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def hand_x(self, node: torch.Tensor, x: torch.Tensor) -> None:
        """Keep ``x`` for the feature store's request indexed by ``node`` (a planned batch's
        ``SamplerOutput.node``), for as long as ``node`` lives."""
        key = id(node)
        with self.lock:
            self._planned_x[key] = x
        weakref.finalize(node, self._planned_x.pop, key, None)

    def take_x(self, index: Any) -> torch.Tensor | None:
        """The planned batch's ``x`` for a request indexed by its ``node`` tensor, else None."""
        if not isinstance(index, torch.Tensor):
            return None
        with self.lock:
            return self._planned_x.pop(id(index), None)

    # -- on demand -----------------------------------------------------------------------
    def sources(self):
        """The preset's uncached readers with its neighbor cache, and their sampler
        (:func:`ooc.executor.loader.stack.open_sampler`), opened on first use."""
        if self._sources is None:
            s = self.settings
            opts = ModeOptions(io_backend=s["io_backend"], **s["options"])
            self._sources, self._sampler = open_sampler(
                self.dataset, resolve_preset(s["preset"]), opts, s["num_neighbors"],
                s["num_threads"], cache_sizes(self.dataset, opts)[1])
        return self._sources

    def sampler(self):
        """The on-demand requests' sampler, over :meth:`sources`."""
        self.sources()
        return self._sampler

    def read_rows(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of ``ids`` read from disk with the preset's feature reader, refused
        when one holds a NaN or an infinity (as :class:`~ooc.executor.loader.node_loader.
        NodeLoader`'s batches; not for a dataset written with ``--allow-nonfinite``)."""
        rows = self.sources().features.read(ids)
        if not int(self.dataset.meta.get("nonfinite_features", 0) or 0):
            check_finite_rows(rows, ids, self.dataset.features_file)
        return rows

    def close(self) -> None:
        self.close_ahead()
        for obj in (self._loader, self._sources):
            if obj is not None:
                obj.close()
        self._loader = self._sources = self._sampler = None


def _as_float32(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))


class _OnBackend:
    """A store over the shared :class:`_Backend`: pickled by it, every write refused."""

    _b: _Backend
    _what = "the store"

    def __init__(self, backend: _Backend):
        super().__init__()  # the PyG store's (next in the subclass's MRO)
        self._b = backend

    def _refuse(self, *args, **kwargs) -> bool:
        raise InvalidValue(_READ_ONLY.format(what=self._what, path=self._b.dataset.path))

    def __getstate__(self) -> dict[str, Any]:
        return {"_b": self._b}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["_b"])


class OocFeatureStore(_OnBackend, FeatureStore):
    """``x`` (float32 [N, dim]) and ``y`` (int64 [N]) of an ooc dataset, read-only.

    Reads go through ooc's feature layers: rows of a batch the sampler served
    from the plan come from its pipeline (the Belady cache under the ``ooc``
    preset); other requests are read from ``features.bin`` with the preset's
    reader. Group name ``None`` (a homogeneous graph).
    """

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=None, attr_name="x"),
                TensorAttr(group_name=None, attr_name="y")]

    def _check(self, attr: TensorAttr) -> str:
        if attr.group_name is not None or attr.attr_name not in ("x", "y"):
            raise TensorNotStored(f"ooc.pyg: no tensor {attr.group_name!r}/{attr.attr_name!r} "
                           f"(this store has x and y of group None)")
        return attr.attr_name

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        ds = self._b.dataset
        return (ds.num_nodes, ds.feature_dim) if self._check(attr) == "x" else (ds.num_nodes,)

    def _ids(self, attr: TensorAttr) -> np.ndarray:
        n = self._b.dataset.num_nodes
        idx = attr.index
        if idx is None:
            return np.arange(n, dtype=np.int64)
        if isinstance(idx, slice):
            return np.arange(n, dtype=np.int64)[idx]
        ids = np.asarray(idx.cpu().numpy() if isinstance(idx, torch.Tensor) else idx)
        if ids.dtype == bool:
            return np.flatnonzero(ids).astype(np.int64)
        ids = ids.astype(np.int64, copy=False).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise IdOutOfRange(f"ooc.pyg: node id {ids[(ids < 0) | (ids >= n)][0]} out of range "
                             f"[0, {n}) for {self._b.dataset.path}")
        return ids

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        b = self._b
        out: list[torch.Tensor] = []
        x_for: dict[int, torch.Tensor] = {}
        for attr in attrs:
            name = self._check(attr)
            if name == "y":
                out.append(torch.from_numpy(b.dataset.read_labels(self._ids(attr))))
                continue
            key = id(attr.index)
            if key not in x_for:
                x_for[key] = self._x(attr)
            out.append(x_for[key])
        return out

    def _x(self, attr: TensorAttr) -> torch.Tensor:
        b = self._b
        x = b.take_x(attr.index)
        if x is not None:
            b.counts["planned_reads"] += 1
            return x
        b.counts["on_demand_reads"] += 1
        return _as_float32(b.read_rows(self._ids(attr)))

    _what = "the feature store"
    _put_tensor = _remove_tensor = _OnBackend._refuse


class OocGraphStore(_OnBackend, GraphStore):
    """The dataset's CSC adjacency (in-neighbours), read-only and never copied into RAM.

    ``get_all_edge_attrs()`` reports one CSC edge attribute of size ``(N, N)``;
    ``get_edge_index(edge_type=None, layout="csc")`` hands out ``(row,
    colptr)`` as read-only tensors over the memory maps of ``indices.bin`` and
    ``indptr.npy`` (pages are read only where touched).
    """

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        n = self._b.dataset.num_nodes
        return [EdgeAttr(edge_type=None, layout="csc", is_sorted=True, size=(n, n))]

    def _get_edge_index(self, edge_attr: EdgeAttr):
        ds = self._b.dataset
        if edge_attr.edge_type is not None or str(edge_attr.layout.value) != "csc":
            return None
        with warnings.catch_warnings():
            # read-only maps: PyTorch warns that writing would be undefined (nothing writes)
            warnings.simplefilter("ignore", UserWarning)
            row = torch.from_numpy(np.asarray(ds.indices[:ds.num_edges]))
            colptr = torch.from_numpy(np.asarray(ds.indptr))
        return row, colptr

    _what = "the graph store"
    _put_edge_index = _remove_edge_index = _OnBackend._refuse


class OocSampler(BaseSampler):
    """Neighbour sampling with ooc's sampler, returning PyG ``SamplerOutput``.

    ``node`` (int64 [n], seeds first), ``row``/``col`` (int64 [m], local ids;
    row = neighbour, col = sampled node), ``edge=None``, ``batch=None``,
    ``num_sampled_nodes``/``num_sampled_edges`` per hop, ``metadata =
    (input_id, time)`` as PyG's ``NeighborSampler``. Deterministic for one
    seed: a planned batch b of epoch e uses ooc's batch seed ``(seed, e, b)``,
    any other request a seed drawn from its node ids.

    Attributes:
        batch_sampler: ooc's epoch plan for PyG's loader (``batch_sampler=``).
        input_nodes: the seed nodes the plan orders (int64 tensor).
    """

    def __init__(self, backend: _Backend):
        self._b = backend
        self.batch_sampler = PlannedBatches(backend.plan)

    @property
    def input_nodes(self) -> torch.Tensor:
        return torch.from_numpy(self._b.plan.seeds)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` of the loader loads (>= 1)."""
        self.batch_sampler.set_epoch(epoch)

    @property
    def num_neighbors(self) -> list[int]:
        """The fanouts this sampler samples with (``remote_backend``'s ``num_neighbors``)."""
        return list(self._b.settings["num_neighbors"])

    def check_num_neighbors(self, num_neighbors: Any) -> None:
        """Refuse a loader's ``num_neighbors`` other than this sampler's: PyG's
        ``NeighborLoader`` given a ``neighbor_sampler`` drops its own ``num_neighbors``, so
        the batches would be sampled with fanouts the script does not show."""
        try:
            given: Any = [int(v) for v in num_neighbors]
        except (TypeError, ValueError):
            given = num_neighbors
        if given != self.num_neighbors:
            raise InvalidValue(f"ooc.pyg: NeighborLoader's num_neighbors {given} differs from "
                               f"the ooc sampler's {self.num_neighbors}, which it would sample "
                               f"with; pass the same list to both (remote_backend("
                               f"num_neighbors=...))")

    def loader_kwargs(self, num_workers: int = 0) -> dict[str, Any]:
        """Keyword arguments for PyG's ``NodeLoader``/``NeighborLoader``: ooc's batch plan,
        and with ``num_workers > 0`` spawned worker processes (numba's OpenMP pool cannot
        be forked once used; the stores reopen the dataset in each worker)."""
        kw: dict[str, Any] = {"input_nodes": self.input_nodes,
                              "batch_sampler": self.batch_sampler}
        if num_workers > 0:
            kw.update(num_workers=int(num_workers), multiprocessing_context="spawn")
        return kw

    def sample_from_nodes(self, inputs: NodeSamplerInput, **kwargs) -> SamplerOutput:
        b = self._b
        seeds = inputs.node.cpu().numpy().astype(np.int64, copy=False)
        epoch = b.plan.epoch
        k = b.plan.batch_index(epoch, inputs.input_id.cpu().numpy()) \
            if inputs.input_id is not None else None
        if k is not None and not np.array_equal(b.plan.seeds[b.plan.positions(epoch)[k]],
                                                seeds):
            k = None  # positions of another node list: not this plan's batch
        if k is not None and b.main:
            with b.lock:
                item = b.take_planned(epoch, k)
            if item is not None:
                batch, rows = item
                out = self._output(batch, inputs)
                b.hand_x(out.node, _as_float32(rows))
                b.counts["planned_batches"] += 1
                return out
        # a request the plan did not foresee: a seed drawn from its node ids
        bseed = b.plan.plan(max(epoch, 1)).batch_seed(k) if k is not None else \
            unplanned_seed(b.plan.seed, seeds)
        b.counts["on_demand_batches"] += 1
        return self._output(b.sampler().sample(seeds, bseed), inputs)

    def sample_from_edges(self, inputs: EdgeSamplerInput,
                          neg_sampling: NegativeSampling | None = None) -> SamplerOutput:
        """A link batch for PyG's ``LinkLoader``/``LinkNeighborLoader``: the batch's
        negatives drawn uniformly (binary: ``ceil(amount * b)`` pairs; triplet:
        ``ceil(amount)`` targets per positive) from a seed drawn from its edges, its seed
        nodes the distinct ends (sorted, as PyG's non-disjoint sampling), sampled with
        ooc's sampler on demand; ``metadata`` as PyG's ``NeighborSampler``'s."""
        b = self._b
        src = inputs.row.cpu().numpy().astype(np.int64, copy=False)
        dst = inputs.col.cpu().numpy().astype(np.int64, copy=False)
        mode = None if neg_sampling is None else str(neg_sampling.mode.value)
        if neg_sampling is not None and getattr(neg_sampling, "weight", None) is not None:
            raise InvalidValue("ooc.pyg: weighted negative sampling is not supported "
                               "(negatives are uniform over the nodes)")
        edges = EdgeSeeds(b.dataset.num_nodes, np.stack([src, dst]),
                          None if inputs.label is None else inputs.label.cpu().numpy(), mode,
                          float(neg_sampling.amount) if neg_sampling is not None else 1.0)
        bseed = unplanned_seed(b.plan.seed, np.concatenate([src, dst]))
        lb = edges.plan(max(1, len(src)), bseed, 0, False).link_batch(0)
        b.counts["on_demand_batches"] += 1
        out = self._output(b.sampler().sample(lb.nodes, bseed), NodeSamplerInput(
            input_id=inputs.input_id, node=torch.from_numpy(lb.nodes)))
        loc = lambda a: torch.from_numpy(lb.local(a))  # noqa: E731
        label = inputs.label
        if mode == "triplet":
            assert lb.neg_dst is not None
            neg = lb.local(lb.neg_dst)
            out.metadata = (inputs.input_id, loc(src), loc(dst),
                            torch.from_numpy(neg).view(len(src), -1).squeeze(-1), None)
            return out
        index = torch.stack([loc(src), loc(dst)])
        if mode == "binary":
            assert lb.neg_src is not None and lb.neg_dst is not None
            index = torch.cat([index, torch.stack([loc(lb.neg_src), loc(lb.neg_dst)])], 1)
            label = torch.ones(len(src)) if label is None else label
            label = torch.cat([label, label.new_zeros((len(lb.neg_src),) + label.shape[1:])])
        out.metadata = (inputs.input_id, index, label, None)
        return out

    @staticmethod
    def _output(batch, inputs: NodeSamplerInput) -> SamplerOutput:
        ei = torch.from_numpy(np.asarray(batch.edge_index, dtype=np.int64))
        return SamplerOutput(
            node=torch.from_numpy(np.asarray(batch.node_ids, dtype=np.int64)),
            row=ei[0], col=ei[1], edge=None, batch=None,
            num_sampled_nodes=[int(v) for v in batch.num_sampled_nodes],
            num_sampled_edges=[int(v) for v in batch.num_sampled_edges],
            metadata=(inputs.input_id, inputs.time))

    def stats(self) -> dict[str, Any]:
        """Planned vs on-demand batches and reads, and the pipeline's counters when it ran."""
        st: dict[str, Any] = dict(self._b.counts)
        if self._b._loader is not None:
            st["pipeline"] = self._b._loader.stats()
        return st

    def close(self) -> None:
        """Release readers, threads and runtime files of the backend (stores included)."""
        self._b.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"_b": self._b}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["_b"])


def _check_neighbor_loaders() -> None:
    """Make PyG's ``NeighborLoader`` and ``LinkNeighborLoader`` check their
    ``num_neighbors`` against an ooc sampler
    given as its ``neighbor_sampler`` (:meth:`OocSampler.check_num_neighbors`): PyG keeps
    the value only to build a sampler of its own, so nothing later can see it. Calls with
    any other sampler, or none, run PyG's code unchanged. Idempotent."""
    import functools
    import inspect

    from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

    for cls in (NeighborLoader, LinkNeighborLoader):
        init = cls.__init__
        if getattr(init, "_ooc_checks", False):
            continue
        signature = inspect.signature(init)

        def checked(self, *args: Any, _init=init, _signature=signature, **kwargs: Any) -> None:
            try:
                bound = _signature.bind(self, *args, **kwargs).arguments
            except TypeError:  # PyG's own error for a bad call
                bound = {}
            sampler = bound.get("neighbor_sampler")
            if isinstance(sampler, OocSampler):
                sampler.check_num_neighbors(bound.get("num_neighbors"))
            _init(self, *args, **kwargs)

        checked = functools.wraps(init)(checked)
        checked._ooc_checks = True  # type: ignore[attr-defined]
        cls.__init__ = checked  # type: ignore[method-assign]


_check_neighbor_loaders()


def remote_backend(dataset, num_neighbors: Sequence[int] = (10, 10), input_nodes="train",
                   batch_size: int = 1024, shuffle: bool = False, preset: str = "ooc",
                   memory_budget: int | str | None = None, seed: int = 0,
                   io_backend: str = "auto", num_threads: int | None = None,
                   plan_ahead: bool = True, **options: Any
                   ) -> tuple[OocFeatureStore, OocGraphStore, OocSampler]:
    """``(feature_store, graph_store, sampler)`` for PyG's loaders over an ooc dataset.

    Args mirror :class:`ooc.NodeLoader` (``input_nodes``, ``batch_size`` and
    ``shuffle`` define the plan ``sampler.batch_sampler`` hands PyG's loader).
    ``plan_ahead=False`` serves every batch on demand (no pipeline, no feature
    cache). Call ``sampler.close()`` when done.
    """
    path = Path(dataset.path if hasattr(dataset, "path") else dataset)
    fanouts = check_loader_args(num_neighbors, batch_size, preset)
    if not isinstance(input_nodes, (str, type(None))):
        input_nodes = np.asarray(input_nodes.cpu().numpy() if hasattr(input_nodes, "cpu")
                                 else input_nodes)
    settings = dict(path=str(path), num_neighbors=fanouts, input_nodes=input_nodes,
                    batch_size=int(batch_size), shuffle=bool(shuffle), preset=preset,
                    memory_budget=memory_budget, seed=int(seed), io_backend=io_backend,
                    num_threads=num_threads, plan_ahead=bool(plan_ahead), options=dict(options))
    b = _Backend(settings)
    return OocFeatureStore(b), OocGraphStore(b), OocSampler(b)
