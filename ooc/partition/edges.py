"""The edge stream of a dataset, read from disk in bounded chunks.

A dataset stores its adjacency as CSC (``indptr`` in RAM, ``indices.bin`` on
disk): the in-neighbours of node ``v`` are ``indices[indptr[v]:indptr[v+1]]``.
The partitioners see it as a stream of directed edges ``(src, dst) =
(indices[k], v)`` with ``indptr[v] <= k < indptr[v+1]``.

Stream order
    The stream is cut into chunks of ``chunk_edges`` consecutive CSC
    positions. Inside a chunk edges come in CSC order (by destination id,
    then in the order of ``indices``). With ``shuffle=True`` the *order of
    the chunks* is a seeded random permutation; with ``shuffle=False`` the
    chunks come in file order, i.e. the whole stream is in CSC order. The
    same seed always gives the same order.

Memory
    Chunks are read with ``pread`` into one reusable buffer (not through a
    memory map, so the pages read do not accumulate in this process's
    resident set). ``indptr`` stays a memmap of ``indptr.npy``: the kernels
    walk the part of it a chunk spans, and its pages leave the resident set
    after each chunk (8 bytes a node would otherwise stay mapped from the
    first pass on: 888 MiB at 111M nodes). Memory is ``chunk_edges`` ids and
    the pages of ``indptr`` one chunk spans; the edge list is never
    materialised.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ooc.core.errors import IOFailure
from ooc.partition._kernels import add_out_degrees
from ooc.storage import Dataset
from ooc.storage.dataset import index_range_error
from ooc.storage.pagecache import release_mapped

#: Default number of edges per chunk (1 Mi edges = 4 MiB of int32 ids).
DEFAULT_CHUNK_EDGES = 1 << 20


@dataclass
class EdgeChunk:
    """Edges ``a..b`` (CSC positions) of the stream.

    ``src`` holds ``indices[a:b]``; the destination of position ``k`` is the
    node ``v`` with ``indptr[v] <= k < indptr[v+1]``; ``first_dst`` is the
    destination of position ``a`` (kernels walk ``indptr`` from there).
    """

    a: int
    b: int
    first_dst: int
    src: np.ndarray


class EdgeStream:
    """Iterate a dataset's edges in chunks (see the module docstring).

    Args:
        dataset: an opened dataset.
        chunk_edges: edges per chunk (the bounded buffer).
        shuffle: visit chunks in a seeded random order.
        seed: seed for the chunk order.
    """

    def __init__(self, dataset: Dataset, chunk_edges: int = DEFAULT_CHUNK_EDGES,
                 shuffle: bool = False, seed: int = 0):
        self.dataset = dataset
        self.indptr = dataset.indptr
        self.num_nodes = dataset.num_nodes
        self.num_edges = dataset.num_edges
        self.chunk_edges = max(1, int(chunk_edges))
        self.shuffle = shuffle
        self.seed = seed
        self.dtype = dataset.index_dtype
        self.path = dataset.file("indices.bin")

    @property
    def num_chunks(self) -> int:
        return -(-self.num_edges // self.chunk_edges)

    def chunk_order(self, epoch: int = 0) -> np.ndarray:
        """The order in which chunks are visited (int64 [num_chunks])."""
        order = np.arange(self.num_chunks, dtype=np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def __iter__(self) -> Iterator[EdgeChunk]:
        return self.chunks()

    def chunks(self, epoch: int = 0) -> Iterator[EdgeChunk]:
        """Yield the chunks; ``src`` is a view into a reused buffer (copy to keep)."""
        if self.num_edges == 0:
            return
        buf = np.empty(self.chunk_edges, dtype=self.dtype)
        item = self.dtype.itemsize
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for c in self.chunk_order(epoch):
                a = int(c) * self.chunk_edges
                b = min(a + self.chunk_edges, self.num_edges)
                # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (a buffer at runtime)
                view = memoryview(buf[: b - a]).cast("B")  # type: ignore[arg-type]
                got = 0
                while got < view.nbytes:
                    n = os.preadv(fd, [view[got:]], a * item + got)
                    if n <= 0:
                        raise IOFailure(f"{self.path}: short read at edge {a}")
                    got += n
                src = buf[: b - a]
                if src.min() < 0 or src.max() >= self.num_nodes:  # would crash the kernels
                    k = int(np.flatnonzero((src < 0) | (src >= self.num_nodes))[0])
                    raise index_range_error(self.path, a + k, int(src[k]), self.num_nodes)
                first = int(np.searchsorted(self.indptr, a, side="right")) - 1
                yield EdgeChunk(a, b, first, src)
                release_mapped(self.indptr)
        finally:
            os.close(fd)

    def in_degrees(self) -> np.ndarray:
        """int64 [N] in-degrees, ``indptr`` read a chunk at a time (its pages dropped
        after each)."""
        out = np.empty(self.num_nodes, dtype=np.int64)
        for a in range(0, self.num_nodes, self.chunk_edges):
            b = min(self.num_nodes, a + self.chunk_edges)
            np.subtract(self.indptr[a + 1:b + 1], self.indptr[a:b], out=out[a:b])
            release_mapped(self.indptr)
        return out

    def out_degrees(self, progress=None) -> np.ndarray:
        """int64 [N] out-degrees (one streaming pass)."""

        deg = np.zeros(self.num_nodes, dtype=np.int64)
        for ch in self.chunks():
            add_out_degrees(deg, ch.src)
            if progress is not None:
                progress.update(ch.b - ch.a)
        return deg

    def degrees(self, progress=None) -> np.ndarray:
        """int64 [N] total degree d(v) = in-degree + out-degree (one pass)."""
        return self.in_degrees() + self.out_degrees(progress)
