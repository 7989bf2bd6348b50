"""Readers: how a preset reads ``indices.bin`` and ``features.bin`` without caches.

A reader kind opens the two uncached sources of a dataset, a
:class:`~ooc.storage.neighbors.NeighborSource` and a
:class:`~ooc.storage.features.Feature`, and tells the memory planner what it maps:

:class:`MmapReaders` (``baseline``)
    both files through memmaps, readahead off, ``io_threads`` threads copying
    with nogil kernels so page faults overlap; the page cache is the cache.
:class:`DirectReaders` (``static``, ``ooc``)
    O_DIRECT reads through a read backend (``--io-backend``: io_uring, liburing,
    preadv, mmap); a neighbor cache may sit in front of the neighbour reads.

:class:`TimedFeature` wraps a feature to count the seconds spent in ``read``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from ooc.storage.direct import DirectFeatures, DirectReader
from ooc.storage.features import Also, Feature, FeatureWrapper
from ooc.storage.mmap_features import FAULT_AROUND_BYTES, ThreadedMmapFeatures, mapped_bytes_bound
from ooc.storage.neighbors import DirectNeighbors, MmapNeighbors, NeighborSource
from ooc.storage.pagecache import drop_page_cache, release_mapped


@dataclass
class Sources:
    """A dataset's uncached sources, what describes them, and how to close them."""

    neighbors: NeighborSource
    features: Feature
    info: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            c()
        self.closers.clear()


class Readers:
    """A reader kind (see the module docstring)."""

    name: ClassVar[str] = ""
    #: whether a neighbor cache may sit in front of its neighbour reads
    neighbor_cache: ClassVar[bool] = False
    #: whether its feature reads go through the kernel's page cache, which then keeps
    #: rows across batches in whatever memory the process leaves free
    page_cache: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def open(self, dataset, options) -> Sources:  # pragma: no cover - interface
        raise NotImplementedError

    def mapped_bytes_bound(self, dataset, options, max_edges: int) -> int:
        """The most of the files the readers map into the process at once (bytes)."""
        return 0

    def before_probe(self, dataset) -> None:
        """Make the planner's probe see what it must measure (see :class:`MmapReaders`)."""

    def after_probe(self, dataset) -> None:
        """Undo what the probe left mapped."""


class MmapReaders(Readers):
    """Features and neighbour lists read through memory maps (the page cache holds what is read)."""
    name: ClassVar[str] = "mmap"
    page_cache: ClassVar[bool] = True

    def open(self, dataset, options) -> Sources:
        nsrc = MmapNeighbors(dataset.indices, options.io_threads)
        feats = ThreadedMmapFeatures(dataset.features_file, dataset.file_layout,
                                     options.io_threads)
        info = {"io_threads": options.io_threads, "readahead": "off (MADV_RANDOM)",
                "reader_backend": "mmap", "neighbor_reader_backend": "mmap"}
        return Sources(nsrc, dataset.by_node(feats), info, [nsrc.close, feats.close])

    def mapped_bytes_bound(self, dataset, options, max_edges: int) -> int:
        """A page fault maps the page-cache pages around it too (fault-around,
        64 KiB), so a warm page cache maps more than the pages read: the feature
        reader drops each chunk's region when it is copied (``io_threads`` chunks
        in flight), the neighbour reader the whole map after each request (a
        request touches at most one window per sampled edge)."""

        feats = mapped_bytes_bound(dataset.layout, options.io_threads)
        nbrs = min(int(dataset.file("indices.bin").stat().st_size),
                   int(max_edges) * FAULT_AROUND_BYTES)
        return int(feats + nbrs)

    def before_probe(self, dataset) -> None:
        """A cold page cache: faults then map no neighbouring pages (their bound
        is :meth:`mapped_bytes_bound`, computed, not measured)."""

        for path in (dataset.features_file, dataset.file("indices.bin")):
            drop_page_cache(path)

    def after_probe(self, dataset) -> None:
        release_mapped(dataset.indices)


class DirectReaders(Readers):
    """Features and neighbour lists read with O_DIRECT through the chosen I/O backend, around
    the page cache; a neighbour cache may sit in front of the neighbour reads."""
    name: ClassVar[str] = "direct"
    neighbor_cache: ClassVar[bool] = True

    def open(self, dataset, options) -> Sources:
        reader = DirectReader(dataset.file("indices.bin"), queue_depth=options.queue_depth,
                              backend=options.io_backend, page_reads=options.page_reads,
                              max_gap_bytes=options.read_gap)
        nsrc = DirectNeighbors(dataset.file("indices.bin"), dataset.indptr, reader=reader,
                               dtype=dataset.index_dtype, owns_reader=True)
        try:
            feats = DirectFeatures(dataset.features_file, dataset.file_layout,
                                   queue_depth=options.queue_depth, backend=options.io_backend,
                                   page_reads=options.page_reads, max_gap_bytes=options.read_gap)
        except BaseException:
            nsrc.close()
            raise
        info = {"queue_depth": options.queue_depth, "reader_backend": feats.backend,
                "neighbor_reader_backend": reader.backend,
                "read_align": feats.reader.read_align, "neighbor_read_align": reader.read_align,
                "read_gap_pages": feats.reader.max_gap_pages}
        return Sources(nsrc, dataset.by_node(feats), info, [nsrc.close, feats.close])


#: Reader kinds by name.
READERS: dict[str, type[Readers]] = {r.name: r for r in (MmapReaders, DirectReaders)}


class TimedFeature(FeatureWrapper):
    """A feature that counts the seconds spent in its reads (``read_s``, also in
    :meth:`stats`); the rest is the inner feature's."""

    def __init__(self, inner: Feature):
        super().__init__(inner)
        self.read_s = 0.0

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        t0 = time.perf_counter()
        try:
            self.inner._read_into(ids, out, rows)
        finally:
            self.read_s += time.perf_counter() - t0

    def _read_also(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                   also: Also) -> None:
        t0 = time.perf_counter()
        try:
            self.inner._read_also(ids, out, rows, also)
        finally:
            self.read_s += time.perf_counter() - t0

    def stats(self) -> dict:
        return {**self.inner.stats(), "read_s": self.read_s}
