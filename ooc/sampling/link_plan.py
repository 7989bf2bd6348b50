"""The epoch plan of a link loader: batches of labelled edges and their seed nodes.

A link batch is ``batch_size`` positive edges (in a per-epoch seeded order) with their
negatives drawn uniformly over the nodes from the batch's own seed, so one
``(seed, epoch)`` gives the same batches in every preset, as PyG's
``LinkNeighborLoader`` makes them: the batch's seed nodes are the distinct ends of its
positive and negative edges (sorted), and the sampler, the inspector and the Belady
cache see them as a node batch. :class:`LinkEpochPlan` is an
:class:`~ooc.sampling.epoch_plan.EpochPlan` whose ``batches`` are those seed nodes;
:meth:`LinkEpochPlan.link_batch` gives the edges of batch ``i`` again.

Edges come from :class:`EdgeSeeds`: an array of pairs (``edge_label_index``) or the
stored adjacency itself (every stored edge, by position in ``indices``: nothing held in
memory per edge; an epoch's order over more than :data:`PERMUTE_LIMIT` edges is a seeded
affine bijection ``i -> (a i + b) mod m`` instead of a stored permutation).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.sampling.epoch_plan import EpochPlan
from ooc.storage.pagecache import release_mapped

__all__ = ["EdgeSeeds", "LinkBatch", "LinkEpochPlan", "NEG_SAMPLING", "as_seeds", "epoch_plan"]

#: ``neg_sampling`` values, as PyG's (None: positives only).
NEG_SAMPLING = ("binary", "triplet", None)
#: How negatives are drawn (:attr:`EdgeSeeds.negatives`).
NEGATIVES = ("uniform", "degree")
#: Edges an epoch's order is a stored permutation of (8 B each); more: an affine bijection.
PERMUTE_LIMIT = 1 << 22
_M63 = (1 << 63) - 1


@dataclass(frozen=True, eq=False)
class LinkBatch:
    """The edges of one link batch (global node ids).

    Attributes:
        nodes: the batch's seed nodes, the distinct ends of every edge below (int64, sorted).
        input_id: each positive's position among the loader's edges (int64 [b]).
        src, dst: the positives (int64 [b]).
        label: the positives' ``edge_label`` (given ones, else None).
        neg_src, neg_dst: binary negatives (int64 [k]); triplet: ``neg_dst`` is
            int64 [b, K] negative targets of each positive's source, ``neg_src`` None.
    """

    nodes: np.ndarray
    input_id: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    label: np.ndarray | None
    neg_src: np.ndarray | None
    neg_dst: np.ndarray | None

    def local(self, ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` (global, any shape) in :attr:`nodes` (the batch's local ids)."""
        return np.searchsorted(self.nodes, ids)


@dataclass(frozen=True, eq=False)
class EdgeSeeds:
    """The labelled edges of a link loader and how its negatives are drawn.

    Attributes:
        num_nodes: nodes of the graph (negatives are drawn from ``[0, num_nodes)``).
        pairs: int64 [2, m] source and target ids, or None: every edge of the stored
            adjacency (``indptr``/``indices``, CSC: the edge at position ``j`` goes from
            ``indices[j]`` to the node whose list holds ``j``).
        label: ``edge_label`` of the pairs ([m]) or None.
        neg_sampling: ``"binary"``, ``"triplet"`` or None.
        amount: negatives per positive (binary: ``ceil(amount * b)`` per batch; triplet:
            ``ceil(amount)`` per positive).
        negatives: how a negative's node is drawn: ``"uniform"`` over the nodes, or
            ``"degree"``: in proportion to its in-degree (a uniform position of
            ``indices`` and the node whose list holds it: nothing per node in memory;
            needs ``indptr``).
        per_epoch: positives an epoch takes: the first ``per_epoch`` of its own seeded
            order over every edge (a new sample each epoch when shuffled); None: all.

    ``len()`` is the positives of an epoch; :attr:`num_edges` all of them.
    """

    num_nodes: int
    pairs: np.ndarray | None = None
    label: np.ndarray | None = None
    neg_sampling: str | None = None
    amount: float = 1.0
    indptr: np.ndarray | None = field(default=None, repr=False)
    indices: np.ndarray | None = field(default=None, repr=False)
    negatives: str = "uniform"
    per_epoch: int | None = None

    def __post_init__(self) -> None:
        if self.per_epoch is not None and not (isinstance(self.per_epoch, int)
                                               and self.per_epoch > 0):
            raise InvalidValue(f"edges_per_epoch must be a positive integer, got "
                               f"{self.per_epoch!r}")
        if self.negatives not in NEGATIVES:
            raise InvalidValue(f"neg_distribution {self.negatives!r}: expected one of "
                               f"{', '.join(NEGATIVES)}")
        if self.negatives == "degree" and (self.indptr is None or not int(self.indptr[-1])):
            raise InvalidValue("neg_distribution 'degree' needs the graph's edges")
        if self.neg_sampling not in NEG_SAMPLING:
            raise InvalidValue(f"neg_sampling {self.neg_sampling!r}: expected 'binary', "
                               f"'triplet' or None")
        if not (self.amount > 0 and math.isfinite(self.amount)):
            raise InvalidValue(f"neg_sampling_ratio must be positive, got {self.amount}")
        if self.pairs is None and (self.indptr is None or self.indices is None):
            raise InvalidValue("EdgeSeeds: give pairs, or the adjacency (indptr, indices)")

    @property
    def num_edges(self) -> int:
        """Every edge the positives are taken from."""
        if self.pairs is not None:
            return int(self.pairs.shape[1])
        return int(self.indptr[-1])  # type: ignore[index]

    def __len__(self) -> int:
        m = self.num_edges
        return m if self.per_epoch is None else min(m, self.per_epoch)

    def ends(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` (int64) of the edges at positions ``pos``. From the adjacency,
        the pages of ``indices``/``indptr`` the lookup touched leave the RSS after it
        (a binary search per edge over an ``indptr`` map would otherwise keep ~10 pages
        an edge mapped: all of ``indptr`` over an epoch)."""
        if self.pairs is not None:
            return self.pairs[0, pos], self.pairs[1, pos]
        assert self.indptr is not None and self.indices is not None
        order = np.argsort(pos, kind="stable")
        src = np.empty(len(pos), np.int64)
        src[order] = self.indices[pos[order]]
        dst = np.searchsorted(self.indptr, pos, side="right") - 1
        release_mapped(self.indices)
        release_mapped(self.indptr)
        return src, dst.astype(np.int64)

    def draw(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Negative nodes (int64 of ``shape``) drawn from ``rng`` as :attr:`negatives` says."""
        if self.negatives == "uniform":
            return rng.integers(0, self.num_nodes, shape)
        assert self.indptr is not None
        pos = rng.integers(0, int(self.indptr[-1]), shape)
        nodes = np.searchsorted(self.indptr, pos, side="right") - 1
        release_mapped(self.indptr)
        return nodes.astype(np.int64)

    def plan(self, batch_size: int, seed: int, epoch: int, shuffle: bool) -> "LinkEpochPlan":
        """The :class:`LinkEpochPlan` of ``epoch``."""
        return LinkEpochPlan(np.zeros(0, np.int64), batch_size, seed, epoch, shuffle, edges=self)


def _order(m: int, start: int, stop: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Positions ``start .. stop-1`` of epoch ``epoch``'s order over ``m`` edges."""
    i = np.arange(start, stop, dtype=np.int64)
    if not shuffle or m < 2:
        return i
    rng = np.random.default_rng([int(seed) & _M63, int(epoch) & _M63, 0x1EDE])
    if m <= PERMUTE_LIMIT:
        return _permutation(m, int(seed), int(epoch))[start:stop]
    a = int(rng.integers(1, m))
    while math.gcd(a, m) != 1:
        a += 1
    b = int(rng.integers(0, m))
    return ((i.astype(object) * a + b) % m).astype(np.int64)  # exact past 2**63


@functools.lru_cache(maxsize=2)
def _permutation(m: int, seed: int, epoch: int) -> np.ndarray:
    rng = np.random.default_rng([seed & _M63, epoch & _M63, 0x1EDF])
    return rng.permutation(m)


@dataclass(frozen=True, eq=False)
class LinkEpochPlan(EpochPlan):
    """An :class:`EpochPlan` over edges: ``batch_size`` positives per batch, ``batches``
    the seed nodes of each (:class:`LinkBatch`), ``seeds`` their sampling seeds."""

    edges: EdgeSeeds | None = None

    def __len__(self) -> int:
        m = len(self._edges)
        return -(-m // int(self.batch_size)) if m else 0

    @property
    def _edges(self) -> EdgeSeeds:
        assert self.edges is not None
        return self.edges

    @functools.cached_property
    def batches(self) -> list[np.ndarray]:
        """Each batch's seed nodes: the distinct ends of its edges (int64, sorted)."""
        return [self.link_batch(b).nodes for b in range(len(self))]

    def first(self, count: int | None = None) -> tuple[list[np.ndarray], list[int]]:
        end = len(self) if count is None else min(len(self), max(0, int(count)))
        return ([self.link_batch(b).nodes for b in range(end)],
                [self.batch_seed(b) for b in range(end)])

    def link_batch(self, b: int) -> LinkBatch:
        """The edges of batch ``b``: a pure function of the plan and ``b``."""
        e = self._edges
        bs = int(self.batch_size)
        pos = _order(e.num_edges, b * bs, min(len(e), (b + 1) * bs), self.seed, self.epoch,
                     self.shuffle)
        src, dst = e.ends(pos)
        label = e.label[pos] if e.label is not None else None
        rng = np.random.default_rng([self.batch_seed(b), 0x4E4547])
        neg_src = neg_dst = None
        if e.neg_sampling == "binary":
            k = math.ceil(e.amount * len(pos))
            neg_src, neg_dst = e.draw(rng, k), e.draw(rng, k)
            ends = [src, dst, neg_src, neg_dst]
        elif e.neg_sampling == "triplet":
            neg_dst = e.draw(rng, (len(pos), math.ceil(e.amount)))
            ends = [src, dst, neg_dst.reshape(-1)]
        else:
            ends = [src, dst]
        nodes = np.unique(np.concatenate(ends)).astype(np.int64)
        return LinkBatch(nodes, pos, src, dst, label, neg_src, neg_dst)


def as_seeds(seeds) -> "np.ndarray | EdgeSeeds":
    """A pipeline's seeds as given: :class:`EdgeSeeds`, else node ids as int64."""
    return seeds if isinstance(seeds, EdgeSeeds) else np.asarray(seeds, dtype=np.int64)


def epoch_plan(seeds, batch_size: int, seed: int, epoch: int, shuffle: bool) -> EpochPlan:
    """The epoch plan of a pipeline's ``seeds``: node ids, or :class:`EdgeSeeds`."""
    if isinstance(seeds, EdgeSeeds):
        return seeds.plan(batch_size, seed, epoch, shuffle)
    return EpochPlan(seeds, batch_size, seed, epoch, shuffle)
