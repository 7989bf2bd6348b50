"""Belady changeset precomputation (Ginex §3.4, Fig. 12-13).

Given the node ids gathered by each batch of a superbatch, compute the
feature-cache contents before every batch under Belady's policy and the
changesets that move the cache from one state to the next.

Semantics (the contract the executor relies on):

* the cache holds ``C_i`` while batch ``i`` is gathered; ``C_0 = init_ids``,
  the ``capacity`` ids accessed first (ties: smaller id);
* after batch ``i`` it becomes ``C_{i+1} = C_i - out_ids_i + in_ids_i``: the
  ``capacity`` entries of ``C_i ∪ ids_i`` accessed soonest after ``i``;
  entries never accessed again are dropped, never inserted. ``in_ids_i`` are
  misses of batch ``i`` (rows already in the batch buffer, at
  ``in_positions_i``); ``out_ids_i ⊆ C_i``;
* ties at the capacity boundary (same next-access iteration) keep entries
  already cached first, then smaller node ids. Any tie-break is optimal (the
  tied ids are next used in the same batch); this one is deterministic and
  avoids needless copies.

Across superbatches (``keep_unused`` and ``cached``, what the training
pipeline uses): under the rule above the cache is empty after the last batch
(nothing is accessed again), so every superbatch would start from scratch and
its switch read a whole initial set. Instead:

* ``keep_unused=True``: an entry with no later access in the superbatch is
  not evicted when Belady drops it but kept as *unused* until its slot is
  needed: when a step needs room, unused entries go first, oldest first.
  They are never accessed again in the superbatch, so hits and misses are
  unchanged; only ``out_ids`` move later (or vanish). The cache then ends
  the superbatch full of its most recently dropped entries
  (:func:`final_state`).
* ``cached``: the ids the cache holds before the superbatch (the previous
  superbatch's :func:`final_state`). ``C_0`` is then ``cached`` plus, while
  there is room, the ids accessed first; computed as the changesets of
  ``[cached, ids_0, ids_1, ...]`` with the first step dropped, so the switch
  reads only those fills. With ``keep_unused`` the cached ids this
  superbatch never accesses stay as unused entries.

The miss count ``Σ|ids_i − C_i|`` is the exact optimum of batch-granular
caching with a free initial load (Belady/MIN with bypass).

Page-mates (``pages``, when rows are smaller than a page): the reader reads a
batch's misses a page at a time, so the other rows on those pages come with no
extra read. Step ``i`` then also offers, as candidates with the misses' flag, the
ids that share a page with one of its misses, are not cached, are not in batch
``i`` and are used later in the superbatch (at most ``mate_fraction * |ids_i|``,
those used soonest); the ones Belady's rule keeps are inserted after the batch,
in id order, at ``in_positions`` ``|ids_i|, |ids_i| + 1, ...``: the executor reads
them with the batch's misses into a buffer of their own. This is no longer an
optimum (Belady with free prefetch is a heuristic); on small rows it reads fewer pages
(``python -m bench page_cache``; ``docs/benchmarks.md``).

Algorithm (three passes over the trace, as in Ginex):

1. sort the occurrences by node id (stable), which groups each id's accesses
   in iteration order and gives compact ids (memory O(trace), not O(N));
2. from that order, the next access iteration of every occurrence (Ginex's
   ``iters``/``ptr`` structure flattened: each occurrence points at its
   successor) and each id's first use;
3. simulate: a cached entry carries its next use, so the hits of batch ``i``
   are the entries whose next use is ``i``; the new state is the top-K
   smallest keys of the candidates.

Two implementations with identical output: ``torch`` (vectorised per step,
runs on CUDA when ``device`` is a CUDA device) and ``numba`` (CPU, one
call per superbatch: a bucket queue indexed by next-use batch, O(1) per
access plus one partially evicted bucket per step, see
``_changeset_kernels.belady_buckets``). ``method="auto"`` picks numba on CPU and
torch on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from ooc.caches import _changeset_kernels as K
from ooc.core.errors import IdOutOfRange, InvalidValue, OocError

if TYPE_CHECKING:
    import torch

__all__ = ["Changesets", "ChangesetStep", "FlatChangesets", "MATE_FRACTION", "PageOf",
           "final_state", "flatten_batches", "local_ids", "page_groups", "precompute_changesets",
           "unique_sorted"]

_I63 = (1 << 63) - 1

#: ``pages(ids)``: the page (int64 [n]) each node id (int64 [n]) has its row stored in.
PageOf = Callable[[np.ndarray], np.ndarray]

#: Page-mates a step inserts at most, as a fraction of the batch's ids, when asked for
#: (``BeladyCache(page_mates=MATE_FRACTION)``): their rows are read with the batch's misses
#: into a buffer of their own that lives until the cache update.
MATE_FRACTION = 0.25


class ChangesetStep(NamedTuple):
    """The cache update after one batch (int64 numpy views)."""

    in_ids: np.ndarray
    out_ids: np.ndarray
    in_positions: np.ndarray

    def mates(self, batch_size: int) -> np.ndarray:
        """The page-mates this step inserts (int64): the ids placed past the batch's
        ``batch_size`` rows, in the order of their positions."""
        return self.in_ids[self.in_positions >= batch_size]


@dataclass
class FlatChangesets:
    """Changesets of one superbatch as flat arrays (all int64 numpy).

    Step ``i`` inserts ``in_ids[in_ptr[i]:in_ptr[i+1]]`` (rows taken from batch
    i's buffer at ``in_positions`` of the same slice) and evicts
    ``out_ids[out_ptr[i]:out_ptr[i+1]]``; ``init_ids`` fill the cache before
    batch 0. This is also the layout of the runtime files.
    """

    init_ids: np.ndarray
    in_ids: np.ndarray
    in_positions: np.ndarray
    in_ptr: np.ndarray
    out_ids: np.ndarray
    out_ptr: np.ndarray

    def __len__(self) -> int:
        return len(self.in_ptr) - 1

    def step(self, i: int) -> ChangesetStep:
        """``(in_ids, out_ids, in_positions)`` of step ``i``."""
        a, b = self.in_ptr[i], self.in_ptr[i + 1]
        return ChangesetStep(self.in_ids[a:b], self.out_ids[self.out_ptr[i]:self.out_ptr[i + 1]],
                             self.in_positions[a:b])

    @property
    def steps(self) -> list[ChangesetStep]:
        """One :class:`ChangesetStep` per batch, in order."""
        return [self.step(i) for i in range(len(self))]

    def head(self, steps: int) -> "FlatChangesets":
        """The first ``steps`` steps (views; the same ``init_ids``)."""
        a, b = int(self.in_ptr[steps]), int(self.out_ptr[steps])
        return FlatChangesets(self.init_ids, self.in_ids[:a], self.in_positions[:a],
                              self.in_ptr[:steps + 1], self.out_ids[:b], self.out_ptr[:steps + 1])

    def arrays(self) -> dict[str, np.ndarray]:
        """The flat arrays by runtime-file name."""
        return {"cs_init_ids": self.init_ids, "cs_in_ids": self.in_ids,
                "cs_in_positions": self.in_positions, "cs_in_ptr": self.in_ptr,
                "cs_out_ids": self.out_ids, "cs_out_ptr": self.out_ptr}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    @classmethod
    def from_changesets(cls, cs) -> "FlatChangesets":
        """The flat part of ``cs``: a :class:`FlatChangesets` (e.g. the result of
        :func:`precompute_changesets`) or any object with ``init_ids`` and
        ``steps`` (each with ``in_ids``, ``out_ids``, ``in_positions``)."""
        def arr(x) -> np.ndarray:
            return np.asarray(_host(x), dtype=np.int64)

        if isinstance(cs, FlatChangesets):
            return cls(cs.init_ids, cs.in_ids, cs.in_positions, cs.in_ptr, cs.out_ids, cs.out_ptr)
        steps = list(cs.steps)
        ins = [arr(s.in_ids) for s in steps]
        pos = [arr(s.in_positions) for s in steps]
        outs = [arr(s.out_ids) for s in steps]
        in_ptr = np.zeros(len(steps) + 1, np.int64)
        out_ptr = np.zeros(len(steps) + 1, np.int64)
        np.cumsum([len(a) for a in ins], out=in_ptr[1:])
        np.cumsum([len(a) for a in outs], out=out_ptr[1:])

        def cat(xs: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(0, np.int64)

        return cls(arr(cs.init_ids), cat(ins), cat(pos), in_ptr, cat(outs), out_ptr)


@dataclass
class Changesets(FlatChangesets):
    """:func:`precompute_changesets`' result: the flat changesets plus
    ``misses[i] = |ids_i − C_i|`` per step (``out_ids`` sorted within a step,
    ``in_ids`` in batch order) and ``out_later`` (bool, beside ``out_ids``: True
    where the id is accessed again later in the superbatch, i.e. evicted to make
    room; False where it leaves after its last access)."""

    misses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    capacity: int = 0
    method: str = ""
    num_accesses: int = 0
    out_later: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    _steps: list | None = field(default=None, repr=False)

    @property
    def steps(self) -> list[ChangesetStep]:
        """One :class:`ChangesetStep` per batch, in order (built once)."""
        if self._steps is None:
            self._steps = [self.step(i) for i in range(len(self))]
        return self._steps

    @property
    def num_misses(self) -> int:
        return int(self.misses.sum())

    def equals(self, other: "Changesets") -> bool:
        names = ("init_ids", "in_ids", "in_positions", "in_ptr", "out_ids", "out_ptr", "misses")
        return all(np.array_equal(getattr(self, n), getattr(other, n)) for n in names)


def unique_sorted(x: np.ndarray) -> np.ndarray:
    """The distinct values of 1-D ``x``, sorted: a sort and a mask (numpy 2.4's
    ``np.unique`` takes its slower hash path here). An ``x`` already strictly increasing
    (a cache's ids, carried from one superbatch to the next) comes back as a copy, without
    a sort."""
    if x.shape[0] > 1 and bool(np.all(x[1:] > x[:-1])):
        return x.copy()
    s = np.sort(x)
    if s.shape[0] > 1:
        keep = np.empty(s.shape[0], dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        s = s[keep]
    return s


def _host(x):
    """A torch tensor as a host numpy array (torch is imported only by callers that use it)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return x


def flatten_batches(batches: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate batches (1-D int arrays or tensors) into (flat int64 [T], ptr int64 [S+1])."""
    arrs = []
    for i, b in enumerate(batches):
        a = np.asarray(_host(b))
        if a.ndim != 1:
            raise InvalidValue(f"changesets: batch {i} must be 1-D, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise InvalidValue(f"changesets: batch {i} must hold integer node ids, got {a.dtype}")
        arrs.append(a.astype(np.int64, copy=False))
    ptr = np.zeros(len(arrs) + 1, np.int64)
    if arrs:
        np.cumsum([a.shape[0] for a in arrs], out=ptr[1:])
    flat = np.concatenate(arrs) if arrs else np.zeros(0, np.int64)
    return np.ascontiguousarray(flat, dtype=np.int64), ptr


def local_ids(flat: np.ndarray, num_nodes: int) -> tuple[np.ndarray, int, np.ndarray | None]:
    """Order-preserving local ids: the ids themselves when ``num_nodes`` is
    small next to the trace (an O(N) table is cheap), else compact ranks.

    Returns (lid int64 [T], M, uniq or None) with ``id = uniq[lid]`` when compact.
    """
    T = flat.shape[0]
    if num_nodes <= max(2 * T, 1 << 22) and num_nodes <= (1 << 28):
        return flat, int(max(num_nodes, 1)), None
    uniq, inv = np.unique(flat, return_inverse=True)
    return inv.astype(np.int64, copy=False).reshape(-1), int(max(uniq.shape[0], 1)), uniq


def _check(flat: np.ndarray, num_nodes: int, capacity: int, S: int) -> None:
    if capacity < 0:
        raise InvalidValue(f"changesets: capacity must be >= 0, got {capacity}")
    if num_nodes < 0:
        raise InvalidValue(f"changesets: num_nodes must be >= 0, got {num_nodes}")
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            raise IdOutOfRange(f"changesets: node id {bad} outside [0, {num_nodes})")
    if S >= (1 << 31) - 1:
        raise InvalidValue(f"changesets: {S} batches is too many for one superbatch")


def _dup_error(ptr: np.ndarray, p: int, node: int) -> OocError:
    i = int(np.searchsorted(ptr, p, side="right") - 1)
    return OocError(f"changesets: node id {node} occurs twice in batch {i} (ids must be unique)")


def precompute_changesets(batches: Sequence, num_nodes: int, capacity: int, device="cpu",
                          method: str = "auto", cached=None,
                          keep_unused: bool = False, pages: PageOf | None = None,
                          mate_fraction: float = MATE_FRACTION, _mates_from: int = 0
                          ) -> Changesets:
    """Belady changesets of one superbatch (see the module docstring).

    Args:
        batches: S 1-D int arrays/tensors of unique node ids (batch i = the
            ids gathered at iteration i).
        num_nodes: ids must lie in ``[0, num_nodes)`` (up to 2^63).
        capacity: cache entries.
        device: torch device for the torch path (``"cuda"`` runs it there).
        method: ``"auto"`` (numba on CPU, torch on CUDA), ``"torch"`` or ``"numba"``.
        cached: int ids [<= capacity] the cache holds before the superbatch,
            or None (an empty cache: Ginex's initial set).
        keep_unused: keep entries that are not accessed again until their
            slot is needed (see the module docstring).
        pages: ``pages(ids)`` -> the page (int64) each node id's row is stored in,
            when rows share pages: a step then also inserts page-mates (see the
            module docstring); None: rows are read one by one.
        mate_fraction: page-mates a step at most, as a fraction of the batch's ids.
        _mates_from: page-mates come from the batches from this one on (1: batch 0 is
            the ``cached`` ids, which cannot be page-mates unless used again).
    Returns:
        :class:`Changesets` (host numpy arrays).
    """
    if cached is not None and len(cached):
        cached = unique_sorted(np.asarray(cached, dtype=np.int64))
        if cached.shape[0] > int(capacity):
            raise InvalidValue(f"changesets: {cached.shape[0]} cached ids exceed the capacity "
                           f"{capacity}")
        cs = precompute_changesets([cached, *batches], num_nodes, capacity, device, method,
                                   keep_unused=keep_unused, pages=pages,
                                   mate_fraction=mate_fraction, _mates_from=1)
        return _drop_first_step(cs, cached.shape[0])
    flat, ptr = flatten_batches(batches)
    S = len(ptr) - 1
    capacity = int(capacity)
    num_nodes = int(num_nodes)
    _check(flat, num_nodes, capacity, S)
    if method == "auto":
        method = "numba" if str(device).split(":")[0] == "cpu" else "torch"
    if not (0.0 <= float(mate_fraction) <= 64.0):
        raise InvalidValue(f"changesets: mate_fraction must lie in [0, 64], got {mate_fraction}")
    if pages is not None and float(mate_fraction) == 0.0:
        pages = None
    if method == "numba":
        cs = _numba_changesets(flat, ptr, num_nodes, capacity, pages, float(mate_fraction),
                               _mates_from)
    elif method == "torch":
        import torch

        with torch.inference_mode():
            cs = _torch_changesets(flat, ptr, capacity, torch.device(device), pages,
                                   float(mate_fraction), _mates_from)
    else:
        raise InvalidValue(f"changesets: unknown method {method!r} (auto, torch, numba)")
    cs.num_accesses = int(flat.shape[0])
    if keep_unused:
        cs = _keep_unused(cs, capacity)
    return cs


def _keep_unused(cs: Changesets, capacity: int) -> Changesets:
    """Rewrite ``out_ids`` so entries with no later access stay until their slot is needed.

    The kept entries form one FIFO queue: each step appends the ids Belady drops after their
    last access (``~out_later``, in ``out_ids`` order) and, when the step's Belady state plus
    the queue exceed ``capacity``, evicts the queue's oldest entries along with the entries
    Belady evicts to make room. O(S) Python steps of numpy work, O(n_out) data."""
    S = len(cs)
    if S == 0 or cs.out_ids.size == 0:
        return cs
    later = cs.out_later
    if later.shape != cs.out_ids.shape:
        raise AssertionError("changesets: out_later does not match out_ids")
    queue = cs.out_ids[~later]  # the dropped ids, step by step: the FIFO's whole history
    step_out = np.diff(cs.out_ptr)
    step_in = np.diff(cs.in_ptr)
    dropped = np.zeros(later.shape[0] + 1, np.int64)  # dropped[j]: queued among out_ids[:j]
    np.cumsum(~later, out=dropped[1:])
    size = len(cs.init_ids)  # entries with a later access (Belady's state)
    head = 0  # queue entries evicted so far
    outs, out_ptr = [], np.zeros(S + 1, np.int64)
    for i in range(S):
        size += int(step_in[i] - step_out[i])
        pending = int(dropped[cs.out_ptr[i + 1]]) - head
        e = max(0, size + pending - capacity)
        o = cs.out_ids[cs.out_ptr[i]:cs.out_ptr[i + 1]]
        forced = o[later[cs.out_ptr[i]:cs.out_ptr[i + 1]]]
        if e:
            forced = np.sort(np.concatenate((forced, queue[head:head + e])))
            head += e
        outs.append(forced)
        out_ptr[i + 1] = out_ptr[i] + forced.shape[0]
    cs.out_ids = np.concatenate(outs).astype(np.int64, copy=False)
    cs.out_ptr = out_ptr
    cs.out_later = np.zeros(0, bool)  # the rewritten outs are no longer Belady's
    cs._steps = None
    return cs


def _drop_first_step(cs: Changesets, num_cached: int) -> Changesets:
    """``cs`` of ``[cached, ids_0, ...]`` as the changesets of ``[ids_0, ...]``: step 0
    (the cached ids' own step) inserts nothing, so ``C_0`` is ``init_ids`` minus the
    ids step 0 evicts."""
    a, b = int(cs.in_ptr[1]), int(cs.out_ptr[1])
    if a != 0:
        raise AssertionError("changesets: the cached step inserted ids")  # |cached| <= capacity
    init = np.setdiff1d(cs.init_ids, cs.out_ids[:b], assume_unique=True)  # both sets
    return Changesets(init, cs.in_ids, cs.in_positions, cs.in_ptr[1:].copy(), cs.out_ids[b:],
                      cs.out_ptr[1:] - b, cs.misses[1:].copy(), cs.capacity, cs.method,
                      cs.num_accesses - num_cached, cs.out_later[b:])


def final_state(cs: FlatChangesets) -> np.ndarray:
    """The ids (int64, sorted) the cache holds after the last step of ``cs``: the initial
    ids no step touched, and the ids whose last insertion or eviction is an insertion.
    Only the steps' events are sorted; the initial ids (a previous superbatch's final
    state: sorted already) are merged in."""
    S = len(cs)
    init = unique_sorted(np.asarray(cs.init_ids, dtype=np.int64))
    ids = np.concatenate([cs.in_ids, cs.out_ids]).astype(np.int64, copy=False)
    if ids.size == 0:
        return init
    t = np.concatenate([np.repeat(np.arange(S, dtype=np.int64), np.diff(cs.in_ptr)),
                        np.repeat(np.arange(S, dtype=np.int64), np.diff(cs.out_ptr))])
    present = np.concatenate([np.ones(len(cs.in_ids), np.int64),
                              np.zeros(len(cs.out_ids), np.int64)])
    # by id, then step: an id's last event is its state. A step inserts and evicts disjoint
    # ids, so (id, step) is unique and one sorted int64 key (id, step, present) orders them.
    span = 2 * S
    if int(ids.max()) < (np.iinfo(np.int64).max - span) // span:
        key = np.sort((ids * S + t) * 2 + present)
        ids, present = key // span, key & 1
    else:  # ids too large for the packed key
        order = np.lexsort((t, ids))
        ids, present = ids[order], present[order]
    last = np.ones(ids.shape[0], bool)
    last[:-1] = ids[1:] != ids[:-1]
    touched, present = ids[last], present[last]
    at = np.minimum(np.searchsorted(touched, init), touched.shape[0] - 1)
    untouched = init[touched[at] != init]
    # two sorted runs: the stable sort (timsort for int64) merges them in linear time
    return np.sort(np.concatenate([untouched, touched[present == 1]]), kind="stable")


# -- numba path ------------------------------------------------------------------


def page_groups(node_ids: np.ndarray, local: np.ndarray, M: int, pages: PageOf
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trace's ids grouped by the page their row is stored in, pages of one id left
    out (a miss there has no page-mate to offer).

    Args:
        node_ids: int64 [U] the trace's distinct node ids, ascending;
        local: int64 [U] their local ids (order-preserving); M: the local id range;
        pages: node ids -> page ids.
    Returns:
        (grp_of int32 [M]: each local id's group, -1 where it has none;
        gptr int64 [P+1]; gids int64 [<=U]: group g's local ids ``gids[gptr[g]:gptr[g+1]]``,
        ascending, at least two).
    """
    pg = np.asarray(pages(node_ids), dtype=np.int64).reshape(-1)
    if pg.shape != node_ids.shape:
        raise InvalidValue(f"changesets: pages() gave {pg.shape[0]} pages for "
                           f"{node_ids.shape[0]} ids")
    U = pg.shape[0]
    if U < (1 << 31) and (U == 0 or 0 <= int(pg.min()) and int(pg.max()) < (1 << 31)):
        # one int64 key (page, index) sorted in place: a stable argsort by page at the
        # price of a plain sort, which is faster than numpy's stable int64 argsort
        key = pg << 32
        key |= np.arange(U, dtype=np.int64)
        key.sort()
        order = key & 0xFFFFFFFF
        key >>= 32
        spg = key
    else:
        order = np.argsort(pg, kind="stable")
        spg = pg[order]
    del pg
    shared = np.zeros(U, dtype=bool)  # the id's page holds another id of the trace
    if U > 1:
        same = spg[1:] == spg[:-1]
        shared[1:] = same
        shared[:-1] |= same
    order, spg = order[shared], spg[shared]
    gids = np.ascontiguousarray(local[order], dtype=np.int64)
    start = np.ones(spg.shape[0], dtype=bool)
    start[1:] = spg[1:] != spg[:-1]
    gptr = np.append(np.flatnonzero(start), spg.shape[0]).astype(np.int64)
    grp_of = np.full(M, -1, np.int32)  # groups <= ids in the trace < 2**31
    grp_of[gids] = np.cumsum(start) - 1
    return grp_of, gptr, gids


def _mate_ids(flat: np.ndarray, ptr: np.ndarray, first: int) -> np.ndarray:
    """The distinct ids (int64, ascending) of batches ``first`` on: the ones that can be
    page-mates or misses."""
    return unique_sorted(flat[ptr[min(first, len(ptr) - 1)]:])


def _numba_changesets(flat: np.ndarray, ptr: np.ndarray, num_nodes: int, capacity: int,
                      pages: PageOf | None = None, mate_fraction: float = 0.0,
                      mates_from: int = 0) -> Changesets:
    lid, M, uniq = local_ids(flat, num_nodes)
    nxt, dup, first = K.next_use(lid, ptr, M)
    if dup >= 0:
        raise _dup_error(ptr, dup, int(flat[dup]))
    mem = np.empty(flat.shape[0], np.int32 if M < (1 << 31) else np.int64)
    none = np.zeros(0, np.int64)
    grp_of, gptr, gids = np.zeros(0, np.int32), none, none
    # first uses < S mark the ids the trace has; more than the capacity, or C_0 holds
    # them all and nothing misses
    if pages is not None and 0 < capacity < np.count_nonzero(first < len(ptr) - 1):
        present = np.zeros(M, dtype=bool)  # O(T + M), no sort
        present[lid[ptr[min(mates_from, len(ptr) - 1)]:]] = True
        local = np.flatnonzero(present)
        del present
        ids = uniq[local] if uniq is not None else local
        grp_of, gptr, gids = page_groups(ids, local, M, pages)
    init, ins, inpos, in_ptr, outs, out_ptr, misses, later = K.belady_buckets(
        lid, nxt, ptr, M, min(capacity, M), True, mem, grp_of, gptr, gids, mate_fraction,
        first)
    if uniq is not None:
        init, ins, outs = uniq[init], uniq[ins], uniq[outs]
    return Changesets(init, ins, inpos, in_ptr, outs, out_ptr, misses, capacity, "numba",
                      out_later=later)


# -- torch path ------------------------------------------------------------------


def _torch_changesets(flat_np: np.ndarray, ptr_np: np.ndarray, capacity: int,
                      dev: "torch.device", pages: PageOf | None = None,
                      mate_fraction: float = 0.0, mates_from: int = 0) -> Changesets:
    """Belady changesets on a torch device: the trace's ids and next uses
    (:func:`_torch_next_uses`), the initial cache (smallest first use), then one
    eviction step per batch (:func:`_torch_step`)."""
    import torch

    S = len(ptr_np) - 1
    i64 = torch.int64
    t = _torch_next_uses(flat_np, ptr_np, dev)
    U, M = t["U"], max(t["U"], 1)
    # C_0: smallest (first use, id)
    Kc = min(capacity, U)
    key0 = t["first_use"] * M + torch.arange(U, device=dev, dtype=i64)
    c_cid = torch.topk(key0, Kc, largest=False).indices if Kc < U else torch.arange(U, device=dev)
    c_cid = torch.sort(c_cid).values
    state = {"c_cid": c_cid, "c_next": t["first_use"][c_cid],
             "incache": torch.zeros(U, dtype=torch.bool, device=dev), "mates": None}
    state["incache"][c_cid] = True
    if pages is not None and 0 < Kc < U:  # Kc == U: every id fits, nothing misses
        ids = _mate_ids(flat_np, ptr_np, mates_from)
        grp, gptr, _ = page_groups(ids, np.searchsorted(t["uniq"].cpu().numpy(), ids), U,
                                   pages)
        P = len(gptr) - 1
        group = np.where(grp < 0, P, grp).astype(np.int64)  # P: ids alone on their page
        state["mates"] = {"group": torch.from_numpy(group).to(dev),
                          "read": torch.zeros(P + 1, dtype=torch.bool, device=dev),
                          "inbatch": torch.zeros(U, dtype=torch.bool, device=dev),
                          "cur": t["first_use"].clone(), "fraction": mate_fraction}
    init_ids = t["uniq"][c_cid]
    ptr_l = ptr_np.tolist()
    ins, inpos, outs, later = [], [], [], []
    hits = np.zeros(S, np.int64)
    in_cnt = np.zeros(S, np.int64)
    out_cnt = np.zeros(S, np.int64)
    for i in range(S):
        a, b = ptr_l[i], ptr_l[i + 1]
        hits[i], in_c, pos, out_c, out_l = _torch_step(state, t["cid"][a:b], t["nxt"][a:b], i, S,
                                                       Kc, M)
        ins.append(in_c)
        inpos.append(pos)
        outs.append(out_c)
        later.append(out_l)
        in_cnt[i] = pos.shape[0]
        out_cnt[i] = out_c.shape[0]

    def cat(xs, dtype=i64):
        return torch.cat(xs) if xs else torch.zeros(0, dtype=dtype, device=dev)

    def host(x):
        return x.to(i64).cpu().numpy()

    in_ptr = np.zeros(S + 1, np.int64)
    out_ptr = np.zeros(S + 1, np.int64)
    np.cumsum(in_cnt, out=in_ptr[1:])
    np.cumsum(out_cnt, out=out_ptr[1:])
    return Changesets(host(init_ids), host(t["uniq"][cat(ins)]), host(cat(inpos)), in_ptr,
                      host(t["uniq"][cat(outs)]), out_ptr, np.diff(ptr_np) - hits, capacity,
                      "torch", out_later=cat(later, torch.bool).cpu().numpy())


def _torch_next_uses(flat_np: np.ndarray, ptr_np: np.ndarray, dev: "torch.device") -> dict:
    """The trace on the device: ``uniq`` (sorted distinct ids, [U]), ``cid`` (each
    access's index into ``uniq``, [T]), ``nxt`` (the batch of the id's next access,
    S = never, [T]) and ``first_use`` ([U]); all int64. Refuses an id twice in a batch."""
    import torch

    S = len(ptr_np) - 1
    T = flat_np.shape[0]
    i64 = torch.int64
    flat = torch.from_numpy(flat_np).to(dev)
    lens = torch.from_numpy(np.diff(ptr_np)).to(dev)
    it = torch.repeat_interleave(torch.arange(S, device=dev, dtype=i64), lens)
    # occurrences sorted by id (stable: each id's accesses in iteration order)
    sid, perm = torch.sort(flat, stable=True)
    newgrp = torch.ones(T, dtype=torch.bool, device=dev)
    newgrp[1:] = sid[1:] != sid[:-1]
    cid_sorted = torch.cumsum(newgrp, 0) - 1
    uniq = sid[newgrp]
    U = int(uniq.shape[0])
    if (2 * S + 2) * max(U, 1) > _I63:
        raise InvalidValue(f"changesets: {S} batches x {max(U, 1)} ids overflows the int64 keys")
    cid = torch.empty(T, dtype=i64, device=dev)
    cid[perm] = cid_sorted
    its = it[perm]
    nxt_sorted = torch.full((T,), S, dtype=i64, device=dev)
    if T > 1:
        same = ~newgrp[1:]
        dup = same & (its[1:] == its[:-1])
        if bool(dup.any()):
            k = int(torch.nonzero(dup)[0, 0])
            p = int(perm[k])
            raise _dup_error(ptr_np, p, int(flat_np[p]))
        nxt_sorted[:-1] = torch.where(same, its[1:], torch.full_like(its[1:], S))
    nxt = torch.empty(T, dtype=i64, device=dev)
    nxt[perm] = nxt_sorted
    return {"uniq": uniq, "U": U, "cid": cid, "nxt": nxt, "first_use": its[newgrp]}


def _torch_mates(m: dict, u, nx, miss, incache, S: int, M: int):
    """Batch ``u``'s page-mates (indices into the trace's ids, ascending) and their next
    uses: the ids of its misses' page groups that are not cached, not in the batch and
    used again, at most ``fraction * len(u)``, the smallest (next use, index). Advances
    ``m["cur"]`` past the batch."""
    import torch

    cur, inbatch, read = m["cur"], m["inbatch"], m["read"]
    cur[u] = nx
    cap = int(m["fraction"] * int(u.shape[0]))
    empty = torch.zeros(0, dtype=torch.int64, device=u.device)
    if cap <= 0:
        return empty, empty
    read[m["group"][u[miss]]] = True
    read[-1] = False  # the group of ids alone on their page
    inbatch[u] = True
    mates = torch.nonzero(read[m["group"]] & ~incache & ~inbatch & (cur < S)).squeeze(1)
    read.zero_()
    inbatch[u] = False
    if int(mates.shape[0]) > cap:
        key = cur[mates] * M + mates
        mates = torch.sort(mates[torch.topk(key, cap, largest=False, sorted=False).indices]).values
    return mates, cur[mates]


def _torch_step(state: dict, u, nx, i: int, S: int, Kc: int, M: int):
    """Batch ``i``: the cache (``state``: ``c_cid``/``c_next`` of the cached entries,
    ``incache`` [U]) keeps the ``Kc`` candidates (cached entries, the batch's ids
    ``u`` with next uses ``nx`` and, with ``state["mates"]``, the batch's page-mates)
    used again soonest. Returns (hits, inserted ids' indices, their positions in the
    batch (a page-mate's: after the batch's rows), evicted indices sorted, whether each
    evicted index is accessed again) and updates ``state``."""
    import torch

    i64, dev = torch.int64, u.device
    c_cid, c_next, incache = state["c_cid"], state["c_next"], state["incache"]
    miss = ~incache[u]
    kidx = torch.nonzero(c_next != i).squeeze(1)
    nk = int(kidx.shape[0])
    hits = int(c_cid.shape[0]) - nk  # cached entries next used now = the hits
    nb = int(u.shape[0])
    if state["mates"] is not None:
        mates, mnext = _torch_mates(state["mates"], u, nx, miss, incache, S, M)
        u = torch.cat((u, mates))
        nx = torch.cat((nx, mnext))
        miss = torch.cat((miss, torch.ones(mates.shape[0], dtype=torch.bool, device=dev)))
    cand_cid = torch.cat((c_cid.index_select(0, kidx), u))
    cand_next = torch.cat((c_next.index_select(0, kidx), nx))
    nc = int(cand_cid.shape[0])
    finite = cand_next < S
    if int(torch.count_nonzero(finite)) <= Kc:
        sel = finite
    else:
        flag = torch.cat((torch.zeros(nk, dtype=i64, device=dev), miss.to(i64)))
        key = (cand_next * 2 + flag) * M + cand_cid
        drop = nc - Kc
        if Kc <= drop:
            sel = torch.zeros(nc, dtype=torch.bool, device=dev)
            if Kc:
                sel[torch.topk(key, Kc, largest=False, sorted=False).indices] = True
        else:
            sel = torch.ones(nc, dtype=torch.bool, device=dev)
            sel[torch.topk(key, drop, largest=True, sorted=False).indices] = False
    gone = ~sel
    gone[nk:] &= ~miss
    out_c, order = torch.sort(cand_cid[gone])
    out_l = (cand_next[gone] < S)[order]
    pos = torch.nonzero(sel[nk:] & miss).squeeze(1)
    in_c = u.index_select(0, pos)
    if int(u.shape[0]) > nb:  # page-mates: positions after the batch's rows, in id order
        mate = pos >= nb
        pos[mate] = nb + torch.arange(int(mate.sum()), dtype=i64, device=dev)
    incache[out_c] = False
    incache[in_c] = True
    sidx = torch.nonzero(sel).squeeze(1)
    state["c_cid"] = cand_cid.index_select(0, sidx)
    state["c_next"] = cand_next.index_select(0, sidx)
    return hits, in_c, pos, out_c, out_l
