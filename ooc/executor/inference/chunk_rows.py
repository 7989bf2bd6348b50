"""Rows of a written layer read straight from its Zarr chunk files.

The layer arrays are stored without a compressor (:func:`~.store.layer_array`), so
chunk ``c`` of array ``h{l}`` is the file ``h{l}/c/<c>/0`` holding ``chunk_rows`` rows
of raw little-endian values, C order (the last chunk padded to the full shape; no file for a chunk of
fill values, which reads as zeros). When
a layer's blocks would re-read whole chunks (a chunk cache too small for the input's
spread), reading the rows each block needs is cheaper: :class:`ChunkFileRows` maps
each chunk file a block touches read-only with ``MADV_RANDOM`` (each fault reads one
page, no readahead), copies the rows out, and unmaps it, so the pages leave the
process's RSS with the map (the kernel's page cache may keep them).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ...storage.errors import DatasetError
from ...storage.layout import PAGE


class ChunkFileRows:
    """Rows of one finished layer array, read from its chunk files.

    Args:
        array_dir: the array's folder (``<group>/h{l}``).
        num_rows, chunk_rows, dim: the array's shape and chunking.
        dtype: its stored dtype (float32 or float16).
    """

    def __init__(self, array_dir: Path, num_rows: int, chunk_rows: int, dim: int, dtype):
        self.dir = Path(array_dir)
        self.num_rows, self.chunk_rows, self.dim = int(num_rows), int(chunk_rows), int(dim)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.row_bytes = self.dim * self.dtype.itemsize
        #: pages the reads touched (each read from the device unless the page cache has it)
        self.pages = 0

    def chunk_file(self, c: int) -> Path:
        return self.dir / "c" / str(int(c)) / "0"

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = row rows[i]`` (rows int64 [k] in ``[0, num_rows)``; out float32
        [k, dim]), one chunk file at a time in ascending row order."""
        if rows.shape[0] == 0:
            return
        order = np.argsort(rows, kind="stable")
        srows = rows[order]
        chunk = srows // self.chunk_rows
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [srows.shape[0]]))
        for a, z in zip(starts.tolist(), ends.tolist()):
            c = int(chunk[a])
            local = srows[a:z] - c * self.chunk_rows
            self._read_chunk(c, local, order[a:z], out)

    def _read_chunk(self, c: int, local: np.ndarray, at: np.ndarray, out: np.ndarray) -> None:
        """Rows ``local`` (int64, ascending, within chunk ``c``) into ``out[at]``."""
        path = self.chunk_file(c)
        need = self.chunk_rows * self.row_bytes
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # Zarr writes no file for a chunk of fill values
            out[at] = 0.0
            return
        except OSError as e:
            raise DatasetError(path, f"cannot open a chunk of the previous layer "
                                     f"({e.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            if size < need:
                raise DatasetError(path, f"{size} bytes, a chunk of {self.chunk_rows} rows x "
                                         f"{self.dim} {self.dtype.name} needs {need} "
                                         f"(truncated?)")
            m = mmap.mmap(fd, need, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            m.madvise(mmap.MADV_RANDOM)
            view = np.frombuffer(m, dtype=self.dtype).reshape(self.chunk_rows, self.dim)
            out[at] = view[local]
            del view
        finally:
            m.close()
        first = local * self.row_bytes // PAGE
        last = ((local + 1) * self.row_bytes - 1) // PAGE
        if self.row_bytes >= PAGE:  # rows of a page or more: their pages, ends shared
            self.pages += int((last - first + 1).sum())
        else:
            self.pages += int(np.unique(np.concatenate((first, last))).shape[0])
