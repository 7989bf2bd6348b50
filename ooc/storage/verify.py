"""``ooc.prepare verify DATASET``: every page of a dataset against its checksums, every
feature row checked finite.

Opening a dataset checks what is cheap (sizes, ``meta.json``'s fields and checksum, the
small files' sha256, sampled pages of the large ones); a page outside the sample is
read as it is. Verifying reads every byte once, in large sequential reads (plain
buffered reads of ``READ_BYTES``, the next one issued on a thread while the last is
checked), and checks:

* every ``INDEX_BLOCK`` bytes of a file whose entry lists ``block_crc32`` against its
  CRC-32 (``indices.bin``, ``features.bin`` and every ``.npy`` too large for a full
  sha256; the small ones are checked whole at open);
* every id of ``indices.bin`` within ``[0, N)``;
* every value of every feature row finite (unless the dataset was written with
  ``--allow-nonfinite``), by the exponent bits (:mod:`.finite`), a numba kernel at
  memory speed.

The first problem is one :class:`~.errors.DatasetError` naming the file and where.
"""
from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np

from ooc.core.errors import DatasetError
from ooc.storage.dataset import INDEX_BLOCK, Dataset, index_range_error, open_dataset
from ooc.storage.finite import count_nonfinite, first_nonfinite_row
from ooc.storage.ingest.edgelist import progress_bar as bar
from ooc.storage.layout import PAGE, FeatureLayout

#: Bytes of one read (a whole number of checksum blocks).
READ_BYTES = 4 * INDEX_BLOCK


def _chunks(path: Path, nbytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(offset, bytes)`` of the first ``nbytes`` of ``path`` in reads of ``READ_BYTES``
    (uint8 arrays), the next read running on a thread while the caller checks one.

    Raises:
        DatasetError: the file ends before ``nbytes``.
    """
    def read(f, a: int) -> np.ndarray:
        want = min(READ_BYTES, nbytes - a)
        buf = np.empty(want, dtype=np.uint8)
        got = 0
        while got < want:
            k = f.readinto(buf[got:].data)
            if not k:
                raise DatasetError(path, f"truncated: ends at byte {a + got}, meta.json "
                                         f"says {nbytes}")
            got += k
        return buf

    with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(1) as pool:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        nxt = pool.submit(read, f, 0) if nbytes else None
        for a in range(0, nbytes, READ_BYTES):
            buf = nxt.result()  # type: ignore[union-attr]
            nxt = pool.submit(read, f, a + READ_BYTES) if a + READ_BYTES < nbytes else None
            yield a, buf


def _check_blocks(path: Path, a: int, buf: np.ndarray, crcs: list[int], covered: int) -> None:
    """The ``INDEX_BLOCK`` blocks of ``buf`` (the file's bytes from ``a``) against ``crcs``,
    each block cut at byte ``covered`` (the end of what the checksums cover)."""
    for b in range(a, min(a + buf.shape[0], covered), INDEX_BLOCK):
        block = buf[b - a:min(b + INDEX_BLOCK, covered) - a]
        if zlib.crc32(block) != crcs[b // INDEX_BLOCK]:  # type: ignore[arg-type]
            raise DatasetError(path, f"bytes {b}..{b + block.shape[0] - 1} (page "
                                     f"{b // PAGE} on) do not match their checksum in "
                                     f"meta.json (corrupted file)")


def _check_ids(path: Path, a: int, buf: np.ndarray, dtype: np.dtype, num_edges: int,
               num_nodes: int) -> None:
    """The ids of ``indices.bin`` in ``buf`` (its bytes from ``a``) within ``[0, num_nodes)``."""
    isz = dtype.itemsize
    k = max(0, min(buf.shape[0], num_edges * isz - a)) // isz
    ids = buf[:k * isz].view(dtype)
    if k and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        j = int(np.flatnonzero((ids < 0) | (ids >= num_nodes))[0])
        raise index_range_error(path, a // isz + j, int(ids[j]), num_nodes)


def _first_bad_row(layout: FeatureLayout, a: int, buf: np.ndarray) -> int:
    """The first row of ``layout`` whose values in ``buf`` (the file's bytes from ``a``, a
    page boundary) hold a NaN or an infinity, -1 when none does. The whole buffer is
    counted first (padding between rows is zero as written); only a buffer with a hit is
    walked row by row."""
    values = buf.view(layout.dtype)
    if count_nonfinite(values) == 0:
        return -1
    rb, stride = layout.row_bytes, (PAGE if layout.rows_per_page else layout.pages_per_row * PAGE)
    per = max(1, layout.rows_per_page)           # rows per stride
    first = a // stride * per
    for s in range(0, buf.shape[0], stride):     # a row never straddles a stride
        unit = buf[s:s + stride]
        rows = min(per, unit.shape[0] // rb, layout.num_rows - first - s // stride * per)
        if rows <= 0:
            break
        k = first_nonfinite_row(unit[:rows * rb].view(layout.dtype).reshape(rows, layout.dim))
        if k >= 0:
            return first + s // stride * per + k
    return -1


def _node_of(ds: Dataset, row: int) -> int | None:
    """The node whose features are row ``row`` of the feature file (None: no node of
    this dataset reads it, a linked file's other rows)."""
    if ds.row_of is None:
        return row
    hit = np.flatnonzero(np.asarray(ds.row_of) == row)
    return int(hit[0]) if hit.size else None


def _files(ds: Dataset) -> list[tuple[str, Path, int]]:
    """``(name, path, bytes)`` of every file the dataset lists."""
    out = []
    for name, entry in ds.meta["files"].items():
        p = ds.features_file if name == "features.bin" else ds.file(name)
        out.append((name, p, int(entry["bytes"])))
    return out


def verify_dataset(path: str | os.PathLike, progress: bool = True) -> dict:
    """Check every page of the dataset at ``path`` and every feature row (see the module
    docstring); returns a summary: ``bytes`` read, ``files`` checked, ``rows`` checked
    finite, ``uncovered`` (files without page checksums: written by an older ooc).

    Raises:
        DatasetError: naming the first bad file and where (a block, an id, a row's node).
    """
    ds = open_dataset(path)  # the cheap checks and the small files' sha256 first
    files = _files(ds)
    total = sum(n for _, _, n in files)
    finite = not int(ds.meta.get("nonfinite_features", 0) or 0)

    uncovered = []
    with bar(total, f"verify {ds.path.name}", progress) as pbar:
        for name, p, nbytes in files:
            entry = ds.meta["files"][name]
            crcs = entry.get("block_crc32")
            if crcs is None and "sha256" not in entry:
                uncovered.append(name)
            covered = (ds.num_edges * ds.index_dtype.itemsize if name == "indices.bin"
                       else nbytes)
            for a, buf in _chunks(p, nbytes):
                if crcs is not None:
                    _check_blocks(p, a, buf, crcs, covered)
                if name == "indices.bin":
                    _check_ids(p, a, buf, ds.index_dtype, ds.num_edges, ds.num_nodes)
                elif name == "features.bin" and finite:
                    _raise_bad_row(ds, p, a, buf)
                pbar.update(buf.shape[0])
    return {"dataset": str(ds.path), "bytes": total, "files": len(files),
            "rows": ds.file_layout.num_rows if finite else 0, "uncovered": uncovered}


def _raise_bad_row(ds: Dataset, p: Path, a: int, buf: np.ndarray) -> None:
    """Raise for the first non-finite feature row in ``buf`` (the feature file's bytes
    from ``a``), naming its node (:func:`~.finite.nonfinite_row_error`)."""
    row = _first_bad_row(ds.file_layout, a, buf)
    if row < 0:
        return
    node = _node_of(ds, row)
    who = f"row {row}" if node is None else f"the row of node {node} (row {row} of the file)"
    raise DatasetError(p, f"{who} holds NaN or infinite values (the dataset was written "
                          f"without --allow-nonfinite: a corrupted page)")
