"""The training memory plan as one pure function of the dataset's shape, the measured
working memory, the budget and the caches already made (:func:`compose_plan`).

What a plan is made of (see :mod:`.budget` for how each part is measured):

- ``fixed``: ``setup_rss`` plus the larger of the loop (its measured peak above
  ``setup_rss`` and the file pages the readers may keep mapped) and the build transient
  (:func:`build_transient`: the policy's fill, a neighbor cache not yet on disk), which
  happens before the feature cache is filled;
- the superbatch in flight for a ``superbatch`` schedule (:class:`SuperbatchPlan`), sized
  within what ``fixed`` leaves of the budget less its reserve;
- the packed miss path's buffers and window arrays where the policy packs its misses
  (``packing``: :data:`~ooc.executor.loader.packing.MISS_PATH_BYTES`);
- ``working = fixed + superbatch + packing``, or the largest working memory of the loaders this one
  takes turns with where that is larger (a process budget's group);
- ``free``: the budget less its reserve, the working memory and the caches already made,
  shared evenly by the groups still to be built; the neighbor cache takes
  ``neighbor_fraction`` of it and the feature cache the rest (:func:`cache_bytes`);
- ``min_budget``: the smallest budget that works with the smallest superbatch and the
  cache sizes the options request (:func:`suggest_budget`).

Everything here is arithmetic on its arguments: no I/O, no global state.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from ooc.caches.feature_cache import row_cost
from ooc.caches.neighbor_cache import MIN_CACHE_BYTES, build_bytes, full_cache_bytes
from ooc.core.errors import InvalidValue
from ooc.executor.loader.packing import MISS_PATH_BYTES
from ooc.sampling.pipeline import superbatch_size_for_budget
from ooc.storage.layout import PAGE

MiB = 1 << 20
#: Relative run-to-run spread of the measured working memory that a suggested
#: budget allows for.
STABILITY = 0.02
#: Share of the free memory the neighbor cache takes by default (the feature cache the rest).
NEIGHBOR_FRACTION = 0.25


@dataclass(frozen=True)
class DatasetShape:
    """What the memory formula reads of a dataset: its sizes, dtypes and training seeds.

    Made from an opened dataset by :meth:`of`, or given directly for a graph that is not
    written (``python -m bench scale --plan-only``).
    """

    num_nodes: int
    #: stored (directed) edges, the length of ``indices``
    num_edges: int
    feature_dim: int
    feature_itemsize: int
    index_itemsize: int
    #: training seeds (an epoch's batches are these in batches)
    train_count: int
    #: bytes of a neighbor cache holding every non-empty list
    #: (:func:`~ooc.caches.neighbor_cache.full_bytes`); None where the plan needs none
    full_neighbor_cache_bytes: int | None = None

    @classmethod
    def of(cls, dataset, full_neighbor_cache: bool = False) -> "DatasetShape":
        """The shape of an opened :class:`~ooc.storage.Dataset`; ``full_neighbor_cache``:
        count the bytes of a full neighbor cache (one chunked pass over ``indptr``)."""
        itemsize = np.dtype(dataset.index_dtype).itemsize
        return cls(num_nodes=int(dataset.num_nodes), num_edges=int(dataset.num_edges),
                   feature_dim=int(dataset.feature_dim),
                   feature_itemsize=np.dtype(dataset.layout.dtype).itemsize,
                   index_itemsize=itemsize, train_count=len(dataset.train_idx),
                   full_neighbor_cache_bytes=(full_cache_bytes(dataset.indptr, itemsize)
                                              if full_neighbor_cache else None))

    @property
    def row_bytes(self) -> int:
        """Bytes of a feature row as stored."""
        return self.feature_dim * self.feature_itemsize

    @property
    def index_dtype(self) -> np.dtype:
        """The dtype of the neighbour ids (what a policy's ``build_bytes`` reads)."""
        return np.dtype(f"int{8 * self.index_itemsize}")

    def row_pages(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The page of each node's row when rows share pages (a row under half a page),
        else None, as :meth:`~ooc.storage.dataset.Dataset.row_pages` (rows in node order:
        a shape has no row map; the planner asks only whether rows share pages)."""
        rpp = PAGE // self.row_bytes if self.row_bytes <= PAGE else 0
        if rpp < 2:
            return None
        return lambda ids: np.asarray(ids, dtype=np.int64) // rpp


@dataclass(frozen=True)
class Working:
    """The working memory as measured (:func:`~ooc.executor.sizing.budget.measure_working`)
    or, for a graph not written, computed by the scale planner (bytes)."""

    #: RSS once the kernels are loaded, before anything of the loop
    setup_rss: int
    #: the probed loop's peak above ``setup_rss``
    loop_peak: int
    #: file pages the readers may keep mapped beside the loop
    mapped_file_pages: int = 0
    #: runtime samples a training batch writes, and its sampled ids on average
    bytes_per_batch: float = 0.0
    ids_per_batch: float = 0.0
    #: the probe's peak RSS (absolute) by stage
    stage_peaks: dict[str, int] = field(default_factory=dict)
    #: the computed estimate of the probed training step, by part
    step_estimate: dict[str, int] = field(default_factory=dict)
    #: why a probed step was not run (its estimate did not fit), or empty
    too_large: str = ""
    #: how the numba kernels were made ready before ``setup_rss`` was measured
    kernels: str = ""


@dataclass
class MemoryPlan:
    """Cache sizes under a memory budget and how they were derived (bytes)."""

    budget: int
    reserve: int
    working: int
    stages: dict[str, int] = field(default_factory=dict)
    feature_cache_rows: int = 0
    feature_cache_bytes: int = 0
    neighbor_cache_bytes: int = 0
    superbatch_size: int | None = None
    #: the smallest budget that works with these options (what a refusal suggests)
    min_budget: int = 0
    #: peak RSS (absolute, bytes) of the probe: ``sample`` (sampling the batches in
    #: flight), ``train_loop`` (their rows gathered + one training step), ``eval_loop``
    stage_peaks: dict[str, int] = field(default_factory=dict)
    runtime_bytes_per_batch: float = 0.0
    ids_per_batch: float = 0.0
    #: superbatch size the runtime disk budget alone allows (before the memory cap)
    superbatch_size_disk: int | None = None
    #: how the numba kernels were made ready before ``setup_rss`` was measured
    kernels: str = ""
    #: the peak RSS the run should reach: working memory and the caches (bytes)
    planned_peak_bytes: int = 0
    #: the computed estimate of the probed training step (:mod:`.step_memory`), by part
    step_estimate: dict[str, int] = field(default_factory=dict)
    #: the measurement the plan was composed from (not in :meth:`as_dict`: its parts are)
    measured: Working | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["measured"]
        return out


def default_reserve(budget: int) -> int:
    """Headroom for what the probe cannot see (allocator slack, the order in
    which the pipeline's threads allocate): 10% of the budget, at least 48 MiB."""
    return max(48 * MiB, int(budget) // 10)


def smallest_budget(need: int) -> int:
    """The smallest whole-MiB budget ``B`` with ``B - default_reserve(B) >= need``."""
    need = int(need)
    b = max(need + 48 * MiB, math.ceil(need * 10 / 9))
    b = -(-b // MiB) * MiB
    while b - MiB >= 0 and (b - MiB) - default_reserve(b - MiB) >= need:
        b -= MiB
    while b - default_reserve(b) < need:
        b += MiB
    return b


def suggest_budget(need: int) -> int:
    """The budget a refusal names: :func:`smallest_budget` of ``need`` plus the
    measurement's run-to-run spread (:data:`STABILITY`)."""
    return smallest_budget(math.ceil(int(need) * (1 + STABILITY)))


def explicit_neighbor_bytes(preset, opts) -> int | None:
    """The neighbor cache size the options set (None: automatic; 0 without a cache)."""
    return opts.neighbor_cache_size if preset.neighbor_cache else 0


def requested_cache_bytes(preset, opts) -> int:
    """Bytes of the caches whose sizes the options set (they count against the budget)."""
    return (opts.feature_cache_size or 0) + (explicit_neighbor_bytes(preset, opts) or 0)


def build_transient(shape: DatasetShape, preset, opts) -> int:
    """Bytes above ``setup_rss`` (besides the neighbor cache itself) while the stack is
    built: the policy's fill (``static`` orders the nodes by degree), and a neighbor
    cache not yet on disk (:func:`~ooc.caches.neighbor_cache.build_bytes`: its degrees
    and one range of lists at a time)."""
    explicit_n = explicit_neighbor_bytes(preset, opts)
    out = preset.policy.build_bytes(shape) if preset.policy.caches else 0
    if preset.neighbor_cache and (explicit_n is None or explicit_n >= MIN_CACHE_BYTES):
        out = max(out, build_bytes(shape.num_nodes, shape.num_edges, shape.index_itemsize))
    return out


def fixed_bytes(shape: DatasetShape, working: Working, preset, opts,
                stages: dict[str, int] | None = None) -> int:
    """The working memory besides the superbatch: ``setup_rss`` plus the larger of the
    loop (with the readers' mapped pages) and the build transient; each term added to
    ``stages`` where given."""
    stages = {} if stages is None else stages
    stages["setup_rss"], stages["loop_peak"] = working.setup_rss, working.loop_peak
    if working.mapped_file_pages:
        stages["mapped_file_pages"] = working.mapped_file_pages
    loop = working.loop_peak + working.mapped_file_pages
    build = build_transient(shape, preset, opts)
    if build > loop:
        stages["build_transient_above_loop"] = build - loop
    return working.setup_rss + max(loop, build)


class SuperbatchPlan:
    """The superbatch in flight: runtime samples of up to three superbatches (being
    sampled, loaded, being consumed) and the changeset pass's arrays over N and over the
    superbatch's accesses (:meth:`bytes`)."""

    def __init__(self, shape: DatasetShape, batch_size: int, opts, working: Working, preset,
                 beside: int = 0):
        self.n, self.beside = shape.num_nodes, int(beside)
        self.bpb, self.ids = working.bytes_per_batch, working.ids_per_batch
        self.mates = preset.policy.mate_fraction(shape.row_pages()) > 0
        self.explicit = getattr(preset.policy, "superbatch_size", None) or opts.superbatch_size
        self.size_disk = None if self.explicit else superbatch_size_for_budget(
            max(1, int(opts.runtime_disk_budget * preset.policy.runtime_files_share)), self.bpb,
            ahead=1)
        self.batches = -(-shape.train_count // int(batch_size))
        size = self.explicit or self.size_disk
        assert size is not None  # size_disk is computed when no size is explicit
        self.size = max(1, min(int(size), self.batches))

    def bytes(self, size: int) -> int:
        """What the superbatches hold beside the training loop (whose peak is
        ``beside`` bytes): runtime samples of three superbatches (the one consumed, the
        next loaded, the one after while it is sampled: its batches and their flat copy),
        ~40 B per access of the changeset pass, and its id table: 5 B per node (next use
        int32 and state uint8 over N) when it addresses ids directly, else compact ranks
        of the accesses (16 B each); see :func:`ooc.caches.changesets.local_ids`. With
        page-mates, 8 B more per id of the table (group and next use, int32 each) and 32 B
        per access for the page groups (:func:`ooc.caches.changesets.page_groups`: the
        page keys while they are made, the groups, the candidates and the larger insert
        arrays after).

        An epoch of one superbatch is sampled and its changesets computed before its first
        batch, while no batch is in flight (epochs do not overlap): beside the loop it holds
        the loaded superbatch alone, and that transient counts where it exceeds the loop."""
        accesses = size * self.ids
        direct = self.n <= max(2 * accesses, 1 << 22) and self.n <= 1 << 28
        table = 5 * self.n if direct else 16 * accesses
        if self.mates:
            table += 8 * (self.n if direct else accesses) + 32 * accesses
        unit = size * self.bpb
        arrays = table + 40 * accesses
        if -(-self.batches // max(1, size)) == 1:
            return int(max(unit, 2 * unit + arrays - self.beside))
        return int(3 * unit + arrays)

    def size_within(self, room: int) -> int:
        """Halve an automatic size until the superbatch takes at most a quarter of
        ``room`` (what the rest of the working memory leaves); its bytes."""
        while not self.explicit and self.size > 1 and self.bytes(self.size) > room // 4:
            self.size = max(1, self.size // 2)
        return self.bytes(self.size)

    def smallest(self) -> int:
        """Bytes of the smallest superbatch the options allow (1 batch when automatic)."""
        return self.bytes(self.size if self.explicit else 1)


def cache_bytes(n: int, row_bytes: int, full_neighbor_bytes: Callable[[], int], preset, opts,
                free: int, neighbor_fraction: float) -> tuple[int, int]:
    """``(neighbor cache bytes, feature cache bytes)`` out of ``free``: the neighbor cache
    ``neighbor_fraction`` of it (capped at the full cache, ``full_neighbor_bytes()``; none
    below :data:`~ooc.caches.neighbor_cache.MIN_CACHE_BYTES`), the feature cache the
    rest at :func:`row_cost` per row of ``row_bytes`` (the row and its bookkeeping), for
    ``n`` nodes; sizes the options set are kept."""

    nbytes = 0
    if preset.neighbor_cache:
        if opts.neighbor_cache_size is not None:
            nbytes = int(opts.neighbor_cache_size)
        else:
            nbytes = int(min(full_neighbor_bytes(), neighbor_fraction * free))
            if nbytes < MIN_CACHE_BYTES:
                nbytes = 0
    fbytes = 0
    if preset.policy.caches:
        if opts.feature_cache_size is not None:
            fbytes = int(opts.feature_cache_size)
        else:
            fbytes = int(min(n, max(0, free - nbytes) // row_cost(row_bytes, n))) * row_bytes
    return nbytes, fbytes


def _full_neighbor_bytes(shape: DatasetShape) -> int:
    if shape.full_neighbor_cache_bytes is None:
        raise InvalidValue("the plan sizes a neighbor cache automatically: its DatasetShape "
                         "needs full_neighbor_cache_bytes")
    return shape.full_neighbor_cache_bytes


def compose_plan(shape: DatasetShape, working: Working, budget: int, preset, opts, *,
                 batch_size: int, reserve: int | None = None,
                 neighbor_fraction: float = NEIGHBOR_FRACTION, built: int = 0,
                 shares: int = 1, others_working: int = 0) -> MemoryPlan:
    """The memory plan of a preset's stack for a dataset of ``shape``.

    Args:
        shape: the dataset's shape.
        working: the measured working memory (:class:`Working`).
        budget: bytes the process may use.
        preset: the :class:`~ooc.executor.loader.presets.Preset`.
        opts: the :class:`~ooc.executor.loader.stack.ModeOptions` (explicit cache sizes
            are kept; superbatch size; runtime disk budget).
        batch_size: training seeds a batch (an epoch's batches, for the superbatch).
        reserve: bytes held back (default :func:`default_reserve`).
        neighbor_fraction: share of the free memory for the neighbor cache.
        built: bytes of caches already made under the budget (other groups').
        shares: groups the free memory is shared by (this one included).
        others_working: the largest working memory of the loaders this one takes turns
            with (their epochs run one at a time).

    The caches are sized from what is free; whether the budget holds the requested
    caches is the caller's check (:func:`fits`).
    """
    budget = int(budget)
    reserve = default_reserve(budget) if reserve is None else int(reserve)
    stages: dict[str, int] = {}
    fixed = fixed_bytes(shape, working, preset, opts, stages)
    sb = SuperbatchPlan(shape, batch_size, opts, working, preset, fixed - working.setup_rss) \
        if preset.policy.schedule == "superbatch" else None
    if sb is not None:
        path = MISS_PATH_BYTES[preset.policy.misses_from](preset.policy, shape.num_nodes,
                                                          shape.row_bytes, sb.size)
        if path:
            stages["packing"] = path
        stages["superbatch"] = sb.size_within(budget - reserve - fixed - path)
    own = fixed + stages.get("superbatch", 0) + stages.get("packing", 0)
    smallest = fixed + (sb.smallest() + stages.get("packing", 0) if sb is not None else 0)
    plan = MemoryPlan(budget=budget, reserve=reserve, working=max(own, int(others_working)),
                      stages=stages, superbatch_size=sb.size if sb else None,
                      min_budget=suggest_budget(smallest + requested_cache_bytes(preset, opts)),
                      stage_peaks={k: int(v) for k, v in working.stage_peaks.items()},
                      runtime_bytes_per_batch=float(working.bytes_per_batch),
                      ids_per_batch=working.ids_per_batch,
                      superbatch_size_disk=sb.size_disk if sb else None, kernels=working.kernels,
                      step_estimate=working.step_estimate, measured=working)
    free = max(0, budget - reserve - plan.working - int(built)) // max(1, int(shares))
    if preset.caches:
        nbytes, fbytes = cache_bytes(shape.num_nodes, shape.row_bytes,
                                     lambda: _full_neighbor_bytes(shape), preset, opts, free,
                                     neighbor_fraction)
        plan.neighbor_cache_bytes, plan.feature_cache_bytes = nbytes, fbytes
        plan.feature_cache_rows = int(min(shape.num_nodes, fbytes // shape.row_bytes))
    plan.planned_peak_bytes = (plan.working + int(built) + plan.feature_cache_bytes
                               + plan.neighbor_cache_bytes)
    return plan


def fits(plan: MemoryPlan, preset, opts) -> bool:
    """Whether the plan's budget holds its working memory, its reserve and the caches
    whose sizes the options set."""
    return plan.budget - plan.working - plan.reserve >= requested_cache_bytes(preset, opts)


__all__ = ["DatasetShape", "MemoryPlan", "NEIGHBOR_FRACTION", "STABILITY", "SuperbatchPlan",
           "Working", "build_transient", "cache_bytes", "compose_plan", "default_reserve",
           "explicit_neighbor_bytes", "fits", "requested_cache_bytes", "smallest_budget", "suggest_budget"]
