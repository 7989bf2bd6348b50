"""Rows of a written layer read straight from its Zarr chunk files.

The layer arrays are stored without a compressor (:func:`~.store.layer_array`), so
chunk ``c`` of array ``h{l}`` is the file ``h{l}/c/<c>/0`` holding ``chunk_rows`` rows
of raw little-endian values, C order (the last chunk padded to the full shape; no file for a chunk of
fill values, which reads as zeros). When
a layer's blocks would re-read whole chunks (a chunk cache too small for the input's
spread), reading the rows each block needs is cheaper: :class:`ChunkFileRows` reads the
pages of those rows with the storage's batched page reader
(:class:`~ooc.storage.direct.DirectReader`: io_uring where the machine has it, many
reads in flight, adjacent pages coalesced, each page once) into one reused page buffer
and copies the rows out. The reads go through the page cache, readahead off: the file
was written by this run a layer ago, and whatever of it the kernel still holds is a
copy rather than a disk read (``O_DIRECT`` reads it all from the device: slower where
the cache held the layer, a little faster where it did not; ``docs/benchmarks.md``).
A chunk file whose size is not a whole number of pages has its partial last page read
with one ``pread``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ooc.core.errors import DatasetError, OocError
from ooc.executor.inference import _kernels as K
from ooc.storage.direct import DirectReader, aligned_empty, grown, read_ranges
from ooc.storage.features import Feature
from ooc.storage.layout import PAGE

#: Pages read in one batched request (the page buffer's size): 8 MiB.
READ_PAGES = 2048


class ChunkFileRows(Feature):
    """Rows of one finished layer array, read from its chunk files, as float32 (a
    :class:`~ooc.storage.features.Feature`).

    Args:
        array_dir: the array's folder (``<group>/h{l}``).
        num_rows, chunk_rows, dim: the array's shape and chunking.
        dtype: its stored dtype (float32 or float16).
        backend: the page reader's backend (``"auto"`` or a name of
            :data:`ooc.storage.io_backends.REGISTRY`); ``queue_depth``: reads in flight.

    Memory: a page buffer of at most :data:`READ_PAGES` pages and the rows of one
    request in the stored dtype (no more bytes than the buffer).
    """

    def __init__(self, array_dir: Path, num_rows: int, chunk_rows: int, dim: int, dtype,
                 backend: str = "auto", queue_depth: int = 64):
        self.dir = Path(array_dir)
        self.what = str(self.dir)
        self.num_rows, self.chunk_rows, self.dim = int(num_rows), int(chunk_rows), int(dim)
        #: the dtype of the chunk files (rows are read as float32)
        self.stored_dtype = np.dtype(dtype).newbyteorder("<")
        self.row_bytes = self.dim * self.stored_dtype.itemsize
        self.backend, self.queue_depth = backend, int(queue_depth)
        #: pages read (each from the device unless the backend reads through the page cache)
        self.pages = 0
        #: the backend that read the last chunk (e.g. ``io_uring``)
        self.backend_used = ""
        self._buf = aligned_empty(0)

    def chunk_file(self, c: int) -> Path:
        return self.dir / "c" / str(int(c)) / "0"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.dim)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def stats(self) -> dict:
        return {"pages": self.pages}

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        """``out[rows[i]] = row ids[i]``, one chunk file at a time in ascending row order."""
        order = np.argsort(ids, kind="stable")
        at = order if rows is None else rows[order]
        srows = ids[order]
        chunk = srows // self.chunk_rows
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [srows.shape[0]]))
        for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
            c = int(chunk[a])
            local = srows[a:z] - c * self.chunk_rows
            self._read_chunk(c, local, at[a:z], out)

    def _read_chunk(self, c: int, local: np.ndarray, at: np.ndarray, out: np.ndarray) -> None:
        """Rows ``local`` (int64, ascending, within chunk ``c``) into ``out[at]``."""
        path = self.chunk_file(c)
        need = self.chunk_rows * self.row_bytes
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:  # Zarr writes no file for a chunk of fill values
            out[at] = 0.0
            return
        except OSError as e:
            raise DatasetError(path, f"cannot open a chunk of the previous layer "
                                     f"({e.strerror})") from None
        if size < need:
            raise DatasetError(path, f"{size} bytes, a chunk of {self.chunk_rows} rows x "
                                     f"{self.dim} {self.stored_dtype.name} needs {need} "
                                     f"(truncated?)")
        rb = self.row_bytes
        first = local * rb // PAGE
        last = ((local + 1) * rb - 1) // PAGE
        prev = np.concatenate(([-1], last[:-1]))
        fresh = np.maximum(first, prev + 1)         # a row's first page no earlier row read
        new_pages = np.maximum(last - fresh + 1, 0)
        direct = int(np.searchsorted(last, need // PAGE))  # rows before the partial page
        try:
            reader = DirectReader(path, queue_depth=self.queue_depth, backend=self.backend,
                                  page_cache=True)
        except OocError as e:
            why = str(e).removeprefix(f"{path}: ")
            raise DatasetError(path, f"cannot read a chunk of the previous layer: {why}") from None
        try:
            self.backend_used = reader.backend
            for a, z in _groups(first > prev, new_pages[:direct], READ_PAGES):
                npages = int(new_pages[a:z].sum())
                self._buf = grown(self._buf, npages * PAGE, READ_PAGES * PAGE)
                buf, offs = read_ranges(reader, local[a:z] * rb, (local[a:z] + 1) * rb,
                                        self._buf[:npages * PAGE])
                self._copy_out(buf, offs, at[a:z], out)
                self.pages += npages
        finally:
            reader.close()
        if direct < local.shape[0]:  # rows in the partial last page: one buffered read
            s0 = int(local[direct]) * rb
            tail = _pread(path, s0, need - s0)
            self._copy_out(tail, local[direct:] * rb - s0, at[direct:], out)
            self.pages += int(new_pages[direct:].sum())

    def _copy_out(self, buf: np.ndarray, offs: np.ndarray, at: np.ndarray,
                  out: np.ndarray) -> None:
        """Rows at byte offsets ``offs`` (int64 [m]) of uint8 ``buf`` into ``out[at]``
        (float32 rows straight there; float16 rows through their bits, then cast)."""
        size = self.stored_dtype.itemsize
        eoffs = offs // size
        if self.stored_dtype == np.float32:
            K.gather_rows(buf[:buf.size - buf.size % 4].view(np.float32), eoffs, at, out)
            return
        bits = np.dtype(f"<u{size}")                  # numba has no float16: move the bits
        rows = np.empty((offs.shape[0], self.dim), bits)
        K.gather_rows(buf[:buf.size - buf.size % size].view(bits), eoffs,
                      np.arange(offs.shape[0], dtype=np.int64), rows)
        out[at] = rows.view(self.stored_dtype)


def _groups(fresh: np.ndarray, new_pages: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Cut rows ``0..len(new_pages)`` into runs of consecutive rows reading at most
    ``limit`` pages each (more only for one row), cut only where a row starts on a page
    no earlier row read (``fresh``, bool [>= len]), so no page is read twice."""
    n = new_pages.shape[0]
    cum = np.concatenate(([0], np.cumsum(new_pages)))
    cuts = np.flatnonzero(fresh[:n])
    out: list[tuple[int, int]] = []
    a = 0
    while a < n:
        if cum[n] - cum[a] <= limit:
            out.append((a, n))
            break
        # the last fresh row after a whose pages before it stay within the limit
        k = int(np.searchsorted(cum[cuts], cum[a] + limit, side="right"))
        z = int(cuts[k - 1]) if k > 0 else a
        if z <= a:  # one row (or one run of shared pages) beyond the limit
            nxt = int(np.searchsorted(cuts, a, side="right"))
            z = int(cuts[nxt]) if nxt < cuts.shape[0] else n
        out.append((a, z))
        a = z
    return out


def _pread(path: Path, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of ``path`` from ``offset`` (buffered), uint8 [nbytes]."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)
    if len(data) < nbytes:
        raise DatasetError(path, f"short read at offset {offset} (truncated while reading?)")
    return np.frombuffer(data, np.uint8)
