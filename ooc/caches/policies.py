"""Feature-cache policies: what a preset's feature cache holds and when it changes.

A policy is an object the loader's stack, the memory planner and the profiler
ask instead of branching on a preset name:

``schedule``
    how the loader runs batches for it: ``"on_demand"`` (sample a batch, then
    gather it) or ``"superbatch"`` (the inspector samples a superbatch ahead and
    the policy's :meth:`~CachePolicy.changesets` say what enters and leaves the
    cache after each batch).
``caches``
    whether there is a feature cache at all (its bookkeeping is per cached row,
    :func:`~ooc.caches.feature_cache.row_cost`, whatever the policy).
:meth:`~CachePolicy.fill`, :meth:`~CachePolicy.build_bytes`
    what happens to the cache before the first batch, and the memory that takes.
:meth:`~CachePolicy.simulate`
    the epoch's misses replayed on a residency mask, as training counts them
    (the profiler's prediction).

:data:`POLICIES` has the built-in ones: :class:`NoCache` (``baseline``),
:class:`StaticCache` (``static``: PaGraph's highest out-degree nodes) and
:class:`BeladyCache` (``ooc``: Ginex's superbatch changesets). A new policy is a
subclass registered here; a preset pairs it with a reader
(:mod:`ooc.executor.loader.presets`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ooc.caches import changesets as C
from ooc.caches.changesets import PageOf
from ooc.caches.feature_cache import FeatureCache
from ooc.caches.miss_curves import hottest, order_by_degree
from ooc.caches.neighbor_cache import compute_out_degrees, degree_dtype
from ooc.core.errors import InvalidValue

#: A policy's changeset function: the superbatch's batches (int64 node ids each)
#: -> an :class:`ooc.caches.changesets.Changesets`.
ChangesetFn = Callable[[Sequence[np.ndarray]], Any]


def _every_lookup_a_miss(trace: Sequence[np.ndarray]) -> dict[str, int]:
    lookups = int(sum(len(t) for t in trace))
    return {"lookups": lookups, "misses": lookups, "switch_reads": 0, "page_mates": 0,
            "superbatches": 0}


@dataclass(frozen=True)
class CachePolicy:
    """Base policy: a feature cache whose content never changes after :meth:`fill`."""

    name: ClassVar[str] = "cache"
    schedule: ClassVar[str] = "on_demand"
    caches: ClassVar[bool] = True
    #: the profiler's miss-ratio curve that shows this policy (None: none)
    curve: ClassVar[str | None] = None
    #: where a superbatch schedule's misses come from: ``"reads"`` (read from the file
    #: when the batch is gathered) or ``"packed"`` (swept and packed ahead of the batch)
    misses_from: ClassVar[str] = "reads"

    @property
    def runtime_files_share(self) -> float:
        """Share of the runtime disk budget the inspector's runtime files may take."""
        return 1.0

    def fill(self, cache: FeatureCache, dataset, features) -> None:
        """Fill ``cache`` before the first batch (reading rows from ``features``)."""

    def build_bytes(self, dataset) -> int:
        """Transient bytes :meth:`fill` needs above the cache itself."""
        return 0

    def changesets(self, num_nodes: int, capacity: int, device: str | None,
                   pages: PageOf | None = None, hot: np.ndarray | None = None) -> ChangesetFn:
        """The changeset function of successive superbatches (``pages``: the dataset's
        :meth:`~ooc.storage.dataset.Dataset.row_pages`, when rows share pages; ``hot``:
        ids likely used after each superbatch, see :meth:`BeladyCache.changesets`)."""
        raise InvalidValue(f"cache policy {self.name!r} has no changesets (schedule {self.schedule})")

    def mate_fraction(self, pages: PageOf | None) -> float:
        """Page-mates a step reads with a batch's misses at most, as a fraction of the
        batch's ids (their buffer lives until the cache update): none here."""
        return 0.0

    def hot_ids(self, dataset, capacity: int) -> np.ndarray | None:
        """Ids :meth:`changesets` counts as used after each superbatch (None: none)."""
        return None

    def warm_up(self, num_nodes: int, device: str | None = "cpu") -> None:
        """Compile the policy's kernels on a tiny input (the planner's warm-up), on the
        device its changesets would run on for a training ``device``."""

    def initial_mask(self, num_nodes: int, capacity: int, dataset=None,
                     hot_order: np.ndarray | None = None) -> np.ndarray:
        """bool [N]: the nodes cached when the epoch starts."""
        return np.zeros(num_nodes, dtype=bool)

    def simulate(self, trace: Sequence[np.ndarray], num_nodes: int, capacity: int,
                 superbatch_size: int | None = None, hot_order: np.ndarray | None = None,
                 device: str = "cpu", pages: PageOf | None = None) -> dict[str, int]:
        """Misses of one epoch over ``trace`` (int64 node ids per batch, in order);
        ``pages``: the dataset's :meth:`~ooc.storage.dataset.Dataset.row_pages`.

        Returns ``lookups``, ``misses`` (gather misses, the trainer's
        ``feature_misses``), ``switch_reads`` and ``superbatches``.
        """
        out = _every_lookup_a_miss(trace)
        cap = int(min(capacity, num_nodes))
        if not self.caches or cap <= 0:
            return out
        cached = self.initial_mask(num_nodes, cap, hot_order=hot_order)
        out["misses"] = int(sum(int((~cached[t]).sum()) for t in trace))
        return out


@dataclass(frozen=True)
class NoCache(CachePolicy):
    """No feature cache: every row is read (the OS page cache is the only cache)."""

    name: ClassVar[str] = "none"
    caches: ClassVar[bool] = False


def out_degrees(dataset) -> np.ndarray:
    """[N] out-degrees (uint32; int64 from 2^32 edges), from one pass over ``indices.bin``
    through its memmap, its pages dropped as it goes."""

    return compute_out_degrees(dataset.indices, dataset.num_nodes,
                               dtype=degree_dtype(dataset.num_edges))


def degree_order(dataset) -> np.ndarray:
    """int64 [N]: node ids by decreasing out-degree, ties by id (the static order)."""

    return order_by_degree(out_degrees(dataset))


def hottest_nodes(dataset, k: int) -> np.ndarray:
    """The ``k`` first nodes of :func:`degree_order`, sorted by id (int64), holding
    the degrees and one partitioned copy of them (8 bytes per node) instead of the
    order's 24."""

    return hottest(out_degrees(dataset), k)


@dataclass(frozen=True)
class StaticCache(CachePolicy):
    """PaGraph / AliGraph: the ``capacity`` highest out-degree nodes, filled once."""

    name: ClassVar[str] = "static"
    curve: ClassVar[str | None] = "static_degree"

    def fill(self, cache: FeatureCache, dataset, features) -> None:
        if cache.capacity:
            cache.fill_static(hottest_nodes(dataset, cache.capacity), features)

    def build_bytes(self, dataset) -> int:
        # the degrees and their partitioned copy (uint32 each, int64 from 2^32 edges), the
        # comparison masks, and one chunk of indices.bin's pages mapped at a time

        per = np.dtype(degree_dtype(dataset.num_edges)).itemsize
        chunk = min(dataset.num_edges, 1 << 24)  # compute_out_degrees' chunk
        return (2 * per + 1) * dataset.num_nodes + dataset.index_dtype.itemsize * chunk

    def initial_mask(self, num_nodes: int, capacity: int, dataset=None,
                     hot_order: np.ndarray | None = None) -> np.ndarray:
        cached = np.zeros(num_nodes, dtype=bool)
        cached[hottest_nodes(dataset, capacity) if hot_order is None
               else np.asarray(hot_order, dtype=np.int64)[:capacity]] = True
        return cached


def _cuda() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


@dataclass(frozen=True)
class BeladyCache(CachePolicy):
    """Ginex: the inspector samples a superbatch ahead and the cache follows
    Belady's optimal changesets over it, carried from one superbatch to the next.

    With ``page_mates`` > 0 and rows that share pages, a step also inserts page-mates:
    ids used later in the superbatch whose rows lie on the pages the batch's misses read,
    up to ``page_mates`` times the batch's ids (:mod:`ooc.caches.changesets`). It is off
    by default: at papers100M's shape it saves few pages for much more CPU
    (``python -m bench loader --presets ooc,ooc-mates``; ``docs/benchmarks.md``).

    Attributes:
        superbatch_size: batches per superbatch; None: from the memory plan or
            the runtime disk budget (see :mod:`ooc.executor.loader.stack`).
        device: where changesets are computed (``auto``: CUDA when available).
        page_mates: page-mates a step at most, as a fraction of the batch's ids
            (0: none; :data:`~ooc.caches.changesets.MATE_FRACTION` is a good value).
    """

    superbatch_size: int | None = None
    device: str | None = None
    page_mates: float = 0.0

    name: ClassVar[str] = "belady"
    schedule: ClassVar[str] = "superbatch"
    curve: ClassVar[str | None] = "ooc"

    def __post_init__(self) -> None:
        sb = self.superbatch_size
        if sb is not None and (isinstance(sb, bool) or not isinstance(sb, int) or sb < 1):
            raise InvalidValue(f"BeladyCache: superbatch_size must be a positive integer or None, "
                           f"got {sb!r}")
        pm = self.page_mates
        if isinstance(pm, bool) or not isinstance(pm, (int, float)) or not 0 <= pm <= 64:
            raise InvalidValue(f"BeladyCache: page_mates must be a number in [0, 64], got {pm!r}")

    def mate_fraction(self, pages: PageOf | None) -> float:
        """Page-mates a step inserts at most, as a fraction of the batch's ids (0 when
        rows do not share pages)."""
        return float(self.page_mates) if pages is not None else 0.0

    def hot_ids(self, dataset, capacity: int) -> np.ndarray:
        """The ids :meth:`changesets` counts as used after each superbatch: the
        ``capacity`` highest out-degree nodes (sorted by id; the static policy's)."""
        return hottest_nodes(dataset, capacity)

    def build_bytes(self, dataset) -> int:
        """The out-degree pass of :meth:`hot_ids` (the static policy's fill)."""
        return StaticCache().build_bytes(dataset)

    def changesets(self, num_nodes: int, capacity: int, device: str | None,
                   pages: PageOf | None = None, hot: np.ndarray | None = None) -> ChangesetFn:
        """Changesets of successive superbatches, each starting from the cache the
        previous one leaves (``keep_unused`` + ``cached``: a switch reads only new
        entries). Superbatches come in order from the inspector's one changeset
        thread, across epochs; if the executor stops early its cache differs from
        that state and the switch reads the difference: still exact.

        ``hot`` (unique int64 ids, at most ``capacity``; the stack gives the
        ``capacity`` highest out-degree nodes): ids counted as used once more after the
        superbatch's last batch, a batch that is never run (its step is dropped). Belady
        ranks them after every id used again within the superbatch, so the misses within
        it stay the optimum; the room those leave holds hot ids instead of the ids dropped
        last. Without it a short superbatch never inserts a miss that it does not use
        again (with one batch a superbatch, none at all) and the cache stays what the
        first superbatches filled it with."""

        device = self.device or device
        if device in (None, "auto"):
            device = "cuda" if _cuda() else "cpu"
        state: dict[str, Any] = {"cached": None}
        tail = [] if hot is None or not len(hot) else \
            [np.asarray(hot, dtype=np.int64)[:int(capacity)]]

        def changesets(ids: Sequence[np.ndarray]):
            cs = C.precompute_changesets([*ids, *tail], num_nodes, capacity, device=device,
                                         cached=state["cached"], keep_unused=True,
                                         pages=pages, mate_fraction=self.mate_fraction(pages))
            out = C.FlatChangesets.from_changesets(cs).head(len(ids)) if tail else cs
            state["cached"] = C.final_state(out)
            return out

        return changesets

    def warm_up(self, num_nodes: int, device: str | None = "cpu") -> None:
        # on CUDA the first changesets load torch's sort and scan kernels: host memory that
        # the planner's set-up must hold before it is measured
        self.changesets(max(4, num_nodes), 2, device, pages=lambda ids: ids // 2)(
            [np.array([0, 1]), np.array([1, 2]), np.array([0, 3])])

    def simulate(self, trace: Sequence[np.ndarray], num_nodes: int, capacity: int,
                 superbatch_size: int | None = None, hot_order: np.ndarray | None = None,
                 device: str = "cpu", pages: PageOf | None = None) -> dict[str, int]:
        """Replays the changesets training runs on a bool [N] residency mask: a
        switch reads the ``init`` ids not yet cached (``switch_reads``), batch i
        misses the ids not cached when it is gathered, then its changeset applies
        (``pages``: with page-mates, as training runs them; ``page_mates`` counts the
        rows they read along with the misses' pages)."""
        out = _every_lookup_a_miss(trace)
        cap = int(min(capacity, num_nodes))
        if cap <= 0:
            return out
        fn = self.changesets(num_nodes, cap, device, pages,
                             None if hot_order is None else np.sort(hot_order[:cap]))
        s = max(1, int(superbatch_size or self.superbatch_size or len(trace)))
        cached = np.zeros(num_nodes, dtype=bool)
        misses = switch = mates = 0
        for a in range(0, len(trace), s):
            cs = fn(trace[a:a + s])
            init = np.asarray(cs.init_ids, dtype=np.int64)
            switch += int((~cached[init]).sum())
            cached[:] = False
            cached[init] = True
            for j, ids in enumerate(trace[a:a + s]):
                misses += int((~cached[ids]).sum())
                step = cs.step(j)
                mates += len(step.mates(len(ids)))
                cached[np.asarray(step.out_ids, dtype=np.int64)] = False
                cached[np.asarray(step.in_ids, dtype=np.int64)] = True
            out["superbatches"] += 1
        out.update(misses=misses, switch_reads=switch, page_mates=mates)
        return out


@dataclass(frozen=True)
class PackedCache(BeladyCache):
    """The Belady cache of :class:`BeladyCache` whose misses are packed ahead: for each
    window of a superbatch's batches the rows the cache will not hold are swept from
    ``features.bin`` in stored order and written batch by batch into packed segments in
    the runtime folder, which training reads in a few large reads
    (:mod:`ooc.executor.loader.packing`). The same batches and rows as ``ooc``.

    Attributes:
        window_rows: misses a window packs at most (its rows cost 16 B each).
        disk_share: share of the runtime disk budget the packed segments take (two
            windows on disk); the superbatch's runtime files get the rest.
    """

    window_rows: int = 1 << 23
    disk_share: float = 0.75

    name: ClassVar[str] = "packed"
    misses_from: ClassVar[str] = "packed"
    #: whether each window is packed only where the disk's measured rates make packing
    #: faster than reading its misses directly (else every window is packed)
    chooses: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.page_mates:
            raise InvalidValue("PackedCache: page-mates are not packed (page_mates must be 0)")
        wr = self.window_rows
        if isinstance(wr, bool) or not isinstance(wr, int) or wr < 1:
            raise InvalidValue(f"PackedCache: window_rows must be a positive integer, got {wr!r}")
        if not 0 < self.disk_share < 1:
            raise InvalidValue(f"PackedCache: disk_share must be in (0, 1), got {self.disk_share!r}")

    @property
    def runtime_files_share(self) -> float:
        return 1.0 - float(self.disk_share)


@dataclass(frozen=True)
class AutoCache(PackedCache):
    """:class:`PackedCache` that packs a window only where it is faster: the disk's
    random-read and sequential rates are measured when the loader is built, and each
    window's misses are packed or read directly, whichever the rates say takes the disk
    less time (:func:`ooc.executor.loader.packing.choose`)."""

    name: ClassVar[str] = "auto"
    chooses: ClassVar[bool] = True


#: Built-in policies by name.
POLICIES: dict[str, type[CachePolicy]] = {p.name: p for p in (NoCache, StaticCache, BeladyCache,
                                                               PackedCache, AutoCache)}
