"""GraphSAGE-style neighbour sampling with PyG NeighborLoader conventions.

A batch is sampled hop by hop. At hop ``h`` (1-based) every node added at hop
``h-1`` (the seeds at hop 1) gets ``min(fanouts[h-1], in_degree)`` distinct
in-neighbours drawn uniformly without replacement (all of them for ``-1``).
The positions drawn for node ``v`` are a pure function of
``(batch_seed, h, v, in_degree)`` (counter-based splitmix64, Floyd's
algorithm), so a batch never depends on thread scheduling, on which batches
were sampled together, or on where neighbour lists come from (in-memory
array, neighbor cache, O_DIRECT reads): the sampler computes positions from
``indptr`` alone and asks its source only for the ids at those positions.

Within a hop the sampler asks its source once for all batches being sampled
together, so a disk-backed source reads the pages of the whole group in one
batched submission per hop.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import numba
import numpy as np

from ooc.core.errors import InvalidValue
from ooc.sampling import _sampler_kernels as K
from ooc.storage.dataset import index_range_error
from ooc.storage.neighbors import InMemoryNeighbors, NeighborRequest, NeighborSource, source_path
from ooc.storage.offsets import NodeOffsets

__all__ = ["SampledBatch", "NeighborSampler", "derive_seed", "epoch_batches"]

_M64 = (1 << 64) - 1


@dataclass
class SampledBatch:
    """One sampled mini-batch (PyG NeighborLoader conventions).

    Attributes:
        node_ids: int64 [n] unique global ids: the seeds first (in seed
            order), then hop 1's new nodes, hop 2's, ...
        num_seeds: number of seeds (``node_ids[:num_seeds]``).
        edge_index: int64 [2, m] local ids; row 0 = source (the neighbour),
            row 1 = target (the sampled node); hop 1's edges first.
        num_sampled_nodes: per hop, ``[num_seeds, new nodes hop 1, ...]``.
        num_sampled_edges: per hop, ``[edges hop 1, edges hop 2, ...]``.
    """

    node_ids: np.ndarray
    num_seeds: int
    edge_index: np.ndarray
    num_sampled_nodes: list[int] = field(default_factory=list)
    num_sampled_edges: list[int] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return int(self.node_ids.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def equals(self, other: "SampledBatch") -> bool:
        """Bit-identical to ``other``."""
        return (self.num_seeds == other.num_seeds
                and self.num_sampled_nodes == other.num_sampled_nodes
                and self.num_sampled_edges == other.num_sampled_edges
                and np.array_equal(self.node_ids, other.node_ids)
                and np.array_equal(self.edge_index, other.edge_index))


def _mix(z: int) -> int:
    return K.py_mix64(z)


def derive_seed(seed: int, epoch: int, batch: int) -> int:
    """Seed of batch ``batch`` of epoch ``epoch``: an independent stream per batch.

    A non-negative int < 2**63, a pure function of its arguments.
    """
    z = _mix((int(seed) & _M64) ^ 0x6F6F632D73616D70)
    z = _mix(z ^ (int(epoch) & _M64))
    z = _mix(z ^ (int(batch) & _M64))
    return z >> 1


def epoch_batches(train_idx: np.ndarray, batch_size: int, seed: int, epoch: int,
                  shuffle: bool = True) -> list[np.ndarray]:
    """Split ``train_idx`` into seed batches of ``batch_size`` (the last may be smaller).

    With ``shuffle`` the order is a permutation drawn from ``(seed, epoch)``.
    """
    if batch_size <= 0:
        raise InvalidValue(f"batch_size must be positive, got {batch_size}")
    ids = np.asarray(train_idx, dtype=np.int64)
    if shuffle:
        rng = np.random.default_rng([int(seed) & _M64, int(epoch) & _M64, 0x0B47C4])
        ids = ids[rng.permutation(ids.shape[0])]
    return [ids[a:a + batch_size].copy() for a in range(0, ids.shape[0], batch_size)]


@contextlib.contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    old = numba.get_num_threads()
    # numba.config sets its NUMBA_* settings at import time, out of its type hints' sight
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        numba.set_num_threads(old)


class NeighborSampler:
    """Uniform neighbour sampler without replacement over a CSC graph.

    Args:
        indptr: CSC offsets [N+1] (in-neighbours of v are list ``indptr[v]:indptr[v+1]``):
            a :class:`~ooc.storage.offsets.NodeOffsets` (what a dataset's
            ``node_offsets()`` shares between its samplers), or an int array or memmap,
            which is made into one (4.125 bytes per node).
        source: a :class:`~ooc.storage.neighbors.NeighborSource`, or an
            indices array / memmap (wrapped in ``InMemoryNeighbors``).
        fanouts: neighbours per node per hop; ``-1`` = all.
        num_threads: numba threads (default: numba's current setting).
        group_size: batches sampled together by :meth:`sample_many` (bounds
            its working memory; one source request per hop per group).
    """

    def __init__(self, indptr: "np.ndarray | NodeOffsets", source, fanouts: Sequence[int],
                 num_threads: int | None = None, group_size: int = 64):
        self.offsets = indptr if isinstance(indptr, NodeOffsets) else \
            NodeOffsets(np.asarray(indptr))
        self.num_nodes = self.offsets.num_nodes
        if not isinstance(source, NeighborSource):
            source = InMemoryNeighbors(source)
        if isinstance(source, InMemoryNeighbors):
            source.check_length(self.offsets.num_edges)
        self.source = source
        self.fanouts = [int(f) for f in fanouts]
        if not self.fanouts or any(f < -1 for f in self.fanouts):
            raise InvalidValue(f"fanouts must be a non-empty list of ints >= -1, got {list(fanouts)}")
        self.num_threads = num_threads
        self.group_size = max(1, int(group_size))

    def sample(self, seeds: np.ndarray, batch_seed: int) -> SampledBatch:
        """Sample one batch from ``seeds`` (unique node ids)."""
        return self.sample_many([seeds], [batch_seed])[0]

    def sample_many(self, seed_batches: list[np.ndarray], batch_seeds: list[int]) -> list[SampledBatch]:
        """Sample many batches on all cores; ``batch_seeds[i]`` seeds batch i.

        Identical to ``[self.sample(s, b) for s, b in zip(...)]``.

        Raises:
            DatasetError: a neighbour id from the source is outside
                ``[0, N)``; names the indices file and the id's position.
        """
        if len(seed_batches) != len(batch_seeds):
            raise InvalidValue("seed_batches and batch_seeds differ in length")
        out: list[SampledBatch] = []
        with _threads(self.num_threads):
            for a in range(0, len(seed_batches), self.group_size):
                out.extend(self._sample_group(seed_batches[a:a + self.group_size],
                                              batch_seeds[a:a + self.group_size]))
        return out

    def _sample_group(self, seed_batches, batch_seeds) -> list[SampledBatch]:
        """Sample the batches of one group together: one source request per hop."""
        all_nodes, ptr = self._check_seeds(seed_batches)
        bseeds = np.array([int(s) & _M64 for s in batch_seeds], dtype=np.uint64).view(np.int64)
        all_ptr = ptr
        front = all_nodes
        front_ptr = ptr.copy()
        hop_new: list[np.ndarray] = []          # per hop: new-node counts per batch
        hop_edges: list[tuple] = []             # per hop: (src, dst, edge offsets per batch)
        for h, fanout in enumerate(self.fanouts, start=1):
            offsets, epos, nbr = self._draw(front, front_ptr, bseeds, h, fanout)
            src, dst, new_nodes, new_cnt = self._dedup(all_nodes, all_ptr, front_ptr, offsets,
                                                       epos, nbr)
            eptr = offsets[front_ptr]
            hop_new.append(new_cnt)
            hop_edges.append((src, dst, eptr))
            # append new nodes; they are the next frontier
            all_nodes, all_ptr, front, front_ptr = _merge_new(all_nodes, all_ptr, new_nodes,
                                                              eptr, new_cnt)
        return _assemble(ptr, all_nodes, all_ptr, hop_new, hop_edges)

    def _check_seeds(self, seed_batches) -> tuple[np.ndarray, np.ndarray]:
        """The group's seeds concatenated (int64 [S]) and each batch's range in them
        (int64 [B + 1]).

        Raises:
            InvalidValue: a batch with duplicate seeds or a seed outside ``[0, N)``.
        """
        B = len(seed_batches)
        seeds = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seed_batches]
        ptr = np.zeros(B + 1, dtype=np.int64)
        np.cumsum([s.shape[0] for s in seeds], out=ptr[1:])
        all_nodes = np.concatenate(seeds) if B else np.zeros(0, np.int64)
        bad = np.zeros(B, dtype=np.int8)
        K.check_seeds(all_nodes, ptr, self.num_nodes, bad)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            what = "duplicate seed ids" if bad[b] == 1 else f"seed ids outside [0, {self.num_nodes})"
            raise InvalidValue(f"batch {b}: {what}")
        return all_nodes, ptr

    def _draw(self, front: np.ndarray, front_ptr: np.ndarray, bseeds: np.ndarray, h: int,
              fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw hop ``h``'s neighbours of the frontier and fetch their ids from the source.

        ``front``: int64 [f] the frontier nodes, batch by batch (batch ``b`` at
        ``front_ptr[b]:front_ptr[b+1]``, int64 [B + 1]); ``bseeds``: int64 [B] batch
        seeds. Returns ``offsets`` (int64 [f + 1]: node ``i``'s draws at
        ``offsets[i]:offsets[i+1]``), ``epos`` (int64 [m]: the edge position of each
        draw) and ``nbr`` (int64 [m]: the neighbour ids there).
        """
        f = front.shape[0]
        B = front_ptr.shape[0] - 1
        counts = np.empty(f, dtype=np.int64)
        K.hop_counts(front, self.offsets.base, self.offsets.rel, fanout, counts)
        offsets = np.zeros(f + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        m = int(offsets[-1])
        rel = np.empty(m, dtype=np.int64)
        epos = np.empty(m, dtype=np.int64)
        front_batch = np.repeat(np.arange(B, dtype=np.int64), np.diff(front_ptr))
        K.hop_select(front, front_batch, bseeds, h, self.offsets.base, self.offsets.rel,
                     offsets, rel, epos)
        nbr = self.source.gather(NeighborRequest(front, offsets, rel, epos))
        nbr = np.ascontiguousarray(nbr, dtype=np.int64)
        if nbr.shape[0] != m:
            raise RuntimeError(f"neighbour source returned {nbr.shape[0]} ids for {m} positions")
        return offsets, epos, nbr

    def _dedup(self, all_nodes: np.ndarray, all_ptr: np.ndarray, front_ptr: np.ndarray,
               offsets: np.ndarray, epos: np.ndarray, nbr: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One hop's edges in local ids and its new nodes, per batch.

        ``all_nodes`` (int64, batch ``b`` at ``all_ptr[b]:all_ptr[b+1]``): the nodes
        sampled so far; ``front_ptr``, ``offsets``, ``epos``, ``nbr``: as in
        :meth:`_draw`. Returns ``src`` and ``dst`` (int64 [m], local ids), ``new_nodes``
        (int64 [m], batch ``b``'s new nodes from ``offsets[front_ptr[b]]``) and
        ``new_cnt`` (int64 [B]).

        Raises:
            DatasetError: a neighbour id outside ``[0, N)`` (file and position named).
        """
        m = nbr.shape[0]
        B = front_ptr.shape[0] - 1
        src = np.empty(m, dtype=np.int64)
        dst = np.empty(m, dtype=np.int64)
        new_nodes = np.empty(m, dtype=np.int64)
        new_cnt = np.zeros(B, dtype=np.int64)
        bad_pos = np.full(B, -1, dtype=np.int64)
        K.hop_dedup(all_nodes, all_ptr, front_ptr, offsets, nbr, self.num_nodes, src, dst,
                    new_nodes, new_cnt, bad_pos)
        if (bad_pos >= 0).any():
            e = int(bad_pos[bad_pos >= 0].min())
            raise index_range_error(source_path(self.source), int(epos[e]), int(nbr[e]),
                                    self.num_nodes)
        return src, dst, new_nodes, new_cnt


def _merge_new(all_nodes: np.ndarray, all_ptr: np.ndarray, new_nodes: np.ndarray,
               eptr: np.ndarray, new_cnt: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each batch's new nodes appended to its nodes.

    ``all_nodes`` (int64, batch ``b`` at ``all_ptr[b]:all_ptr[b+1]``, int64 [B + 1]);
    ``new_nodes`` (int64 [m], batch ``b``'s ``new_cnt[b]`` new nodes from
    ``eptr[b]``; ``eptr``: int64 [B + 1]). Returns the merged nodes and their
    offsets, and the new nodes alone (the next frontier) and their offsets.
    """
    B = all_ptr.shape[0] - 1
    sizes = np.diff(all_ptr) + new_cnt
    out_ptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(sizes, out=out_ptr[1:])
    nfront_ptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(new_cnt, out=nfront_ptr[1:])
    out_nodes = np.empty(int(out_ptr[-1]), dtype=np.int64)
    nfront = np.empty(int(nfront_ptr[-1]), dtype=np.int64)
    K.merge_nodes(all_nodes, all_ptr, new_nodes, eptr[:-1].copy(), new_cnt,
                  out_nodes, out_ptr, nfront, nfront_ptr)
    return out_nodes, out_ptr, nfront, nfront_ptr


def _assemble(ptr: np.ndarray, all_nodes: np.ndarray, all_ptr: np.ndarray,
              hop_new: list[np.ndarray], hop_edges: list[tuple]) -> list[SampledBatch]:
    """One :class:`SampledBatch` per batch of the group.

    ``ptr``: int64 [B + 1] the seed ranges; ``all_nodes``/``all_ptr``: every batch's
    nodes; ``hop_new``: per hop, int64 [B] new-node counts; ``hop_edges``: per hop,
    ``(src, dst, eptr)``, batch ``b``'s edges at ``eptr[b]:eptr[b+1]`` of ``src`` and
    ``dst`` (int64, local ids).
    """
    result = []
    for b in range(ptr.shape[0] - 1):
        srcs = [s[e[b]:e[b + 1]] for s, _, e in hop_edges]
        dsts = [d[e[b]:e[b + 1]] for _, d, e in hop_edges]
        ei = np.empty((2, sum(x.shape[0] for x in srcs)), dtype=np.int64)
        if srcs:
            np.concatenate(srcs, out=ei[0])
            np.concatenate(dsts, out=ei[1])
        result.append(SampledBatch(
            node_ids=all_nodes[all_ptr[b]:all_ptr[b + 1]].copy(),
            num_seeds=int(ptr[b + 1] - ptr[b]),
            edge_index=ei,
            num_sampled_nodes=[int(ptr[b + 1] - ptr[b])] + [int(c[b]) for c in hop_new],
            num_sampled_edges=[int(e[b + 1] - e[b]) for _, _, e in hop_edges],
        ))
    return result
