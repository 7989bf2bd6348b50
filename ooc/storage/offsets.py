"""Where each node's in-neighbour list starts in ``indices``: the CSC ``indptr``, compact.

The sampler reads ``indptr[v]`` and ``indptr[v + 1]`` of every node it expands. As the
int64 ``indptr.npy`` map that is 8 bytes per node, all of it resident once a few batches
have touched every page (888 MiB at 111M nodes). :class:`NodeOffsets` holds
``indptr[v] - indptr[v - v % 64]`` as uint32 and one int64 base per 64 nodes: 4.125 bytes
per node with the same O(1) lookup (:func:`~ooc.sampling._sampler_kernels.list_start`). A
graph where 64 consecutive lists hold 2^32 ids or more keeps int64 offsets (8.125 bytes).
"""
from __future__ import annotations

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.storage.pagecache import release_mapped

#: Nodes per int64 base (a power of two: the kernels shift by its log).
BLOCK = 64
SHIFT = 6
#: indptr entries read from the map at once while building.
CHUNK = BLOCK << 16


class NodeOffsets:
    """``indptr`` as ``base`` (int64 [ceil((N+1)/64)]) and ``rel`` (uint32 [N+1], or int64
    where a block spans 2^32 ids): ``indptr[v] == base[v >> 6] + rel[v]``.

    Built in one streaming pass over ``indptr`` (a memmap's pages are dropped chunk by chunk).

    Attributes:
        num_nodes: N.
        num_edges: ``indptr[N]``.
    """

    def __init__(self, indptr: np.ndarray):
        if indptr.ndim != 1 or indptr.shape[0] < 1:
            raise InvalidValue("indptr must be a 1-D array of length N+1")
        n1 = int(indptr.shape[0])
        self.num_nodes = n1 - 1
        self.num_edges = int(indptr[-1])
        self.base = np.empty(-(-n1 // BLOCK), dtype=np.int64)
        wide = self.num_edges >= 1 << 32 and _widest_block(indptr) >= 1 << 32
        self.rel = np.empty(n1, dtype=np.int64 if wide else np.uint32)
        for a in range(0, n1, CHUNK):
            part = np.asarray(indptr[a:a + CHUNK], dtype=np.int64)
            starts = part[::BLOCK]
            self.base[a // BLOCK:a // BLOCK + starts.shape[0]] = starts
            self.rel[a:a + part.shape[0]] = part - np.repeat(starts, BLOCK)[:part.shape[0]]
            # a chunk at a time: the map's pages would otherwise all be resident at the end
            # of the pass (888 MiB at 111M nodes) beside the 4.125 bytes a node being built
            release_mapped(indptr)

    @property
    def nbytes(self) -> int:
        return int(self.base.nbytes + self.rel.nbytes)

    @staticmethod
    def bytes_for(num_nodes: int) -> int:
        """What the offsets of ``num_nodes`` nodes take where no 64 consecutive lists hold
        2^32 ids (uint32 relative offsets): 4.125 bytes a node."""
        n1 = int(num_nodes) + 1
        return 8 * -(-n1 // BLOCK) + 4 * n1

    def __len__(self) -> int:
        return self.num_nodes + 1

    def __getitem__(self, v) -> np.ndarray:
        """``indptr[v]`` for an int or an int array of node positions (0..N)."""
        v = np.asarray(v, dtype=np.int64)
        return self.base[v >> SHIFT] + self.rel[v].astype(np.int64)


def _widest_block(indptr: np.ndarray) -> int:
    """The most ids 64 consecutive lists hold (streamed over ``indptr``)."""
    widest = 0
    for a in range(0, int(indptr.shape[0]), CHUNK):
        part = np.asarray(indptr[a:a + CHUNK + 1], dtype=np.int64)
        starts = part[::BLOCK]
        ends = np.append(starts[1:], part[-1])
        widest = max(widest, int((ends - starts).max(initial=0)))
    return widest
