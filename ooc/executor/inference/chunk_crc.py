"""CRC-32s of the chunk files of a finished layer-wise inference output.

:func:`~.store.seal` records, in the group's ``ooc`` attributes under ``crc32``, one
entry per array it keeps (``h1`` .. ``hL``, ``pred``, ``row_of_node``): ``chunk_bytes``
(the size of every chunk file: Zarr writes each chunk whole, uncompressed here) and
``crc``, the CRC-32 (:func:`zlib.crc32`) of each chunk file in the order of the chunk
grid (row-major), ``None`` for a chunk Zarr did not write (all fill value).

:func:`check_chunks` checks the chunks a reader is about to read; :func:`check_output`
checks a finished output before ``ooc.infer`` reuses it: every chunk file's size and the
CRCs of a sample of chunks (:func:`sample`), or of every chunk. An output sealed by an
ooc that recorded no CRCs (no ``crc32`` attribute, or no entry for an array) is read
as it is, with no check.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np

from ooc.core.errors import DatasetError

#: The key of the record in the group's ``ooc`` attributes.
CRC_KEY = "crc32"
#: Chunks :func:`sample` checks beside the first and the last of an array.
SPREAD = 16
#: Bytes read at a time while a chunk file is checksummed.
_PIECE = 8 << 20
#: What the user does about an output that fails its check.
REMEDY = "run the same ooc.infer command with --overwrite to make it again"


def _key(arr, index: int) -> str:
    """The chunk file (relative to the array's folder) of flat chunk ``index``."""
    coords = np.unravel_index(index, arr.cdata_shape)
    return arr.metadata.encode_chunk_key(tuple(int(c) for c in coords))


def _chunk_bytes(arr) -> int | None:
    """The size of each chunk file of ``arr`` (None when a codec compresses it)."""
    if arr.compressors:
        return None
    return int(np.prod(arr.chunks)) * arr.dtype.itemsize


def file_crc(path: Path) -> int | None:
    """CRC-32 of the file at ``path`` (None when it does not exist)."""
    crc = 0
    try:
        with open(path, "rb") as f:
            while piece := f.read(_PIECE):
                crc = zlib.crc32(piece, crc)
    except FileNotFoundError:
        return None
    return crc


def record(folder: Path, group) -> dict:
    """The ``crc32`` record of every array of ``group`` (in ``folder``): each chunk file
    read once (just written: from the page cache)."""
    rec = {}
    # the arrays are the folders holding a zarr.json (group.array_keys() would warn about
    # the progress file and the marker still beside them)
    for name in sorted(p.name for p in folder.iterdir() if (p / "zarr.json").is_file()):
        arr = group[name]
        n = int(np.prod(arr.cdata_shape))
        rec[name] = {"chunk_bytes": _chunk_bytes(arr),
                     "crc": [file_crc(folder / name / _key(arr, i)) for i in range(n)]}
    return rec


def _entry(sealed: dict, name: str) -> dict | None:
    """The record of array ``name`` (None for an output sealed without CRCs)."""
    rec = sealed.get(CRC_KEY)
    entry = rec.get(name) if isinstance(rec, dict) else None
    return entry if isinstance(entry, dict) and isinstance(entry.get("crc"), list) else None


def _failed(path: Path, name: str, what: str) -> DatasetError:
    return DatasetError(path, f"chunk of {name} {what}; {REMEDY}")


def _check_one(folder: Path, name: str, arr, index: int, entry: dict, crc: bool) -> None:
    """Chunk ``index`` of array ``name``: present when written, of the size Zarr writes,
    and (``crc``) of its recorded CRC."""
    path = folder / name / _key(arr, index)
    want = entry["crc"][index] if index < len(entry["crc"]) else None
    if want is None:  # Zarr wrote nothing there (every value the fill value)
        if os.path.lexists(path):
            raise _failed(path, name, "was not written by ooc.infer (edited)")
        return
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise _failed(path, name, "is missing (deleted)") from None
    if entry.get("chunk_bytes") is not None and size != entry["chunk_bytes"]:
        raise _failed(path, name, f"holds {size} bytes, not the {entry['chunk_bytes']} "
                                  f"ooc.infer wrote (edited or truncated)")
    if crc and file_crc(path) != want:
        raise _failed(path, name, "does not match its checksum (edited or corrupted)")


def check_chunks(folder: Path, sealed: dict, group, name: str,
                 rows: Iterable[int] | None = None, skip: set[int] | None = None) -> None:
    """Check the chunks of array ``name`` holding ``rows`` (every chunk when None) against
    their recorded CRCs; a one-line :class:`DatasetError` naming the chunk file and the
    array when one fails. An output sealed without CRCs is not checked. ``skip``: chunks
    checked before, left out; those checked here are added to it."""
    entry = _entry(sealed, name)
    if entry is None:
        return
    arr = group[name]
    across = int(np.prod(arr.cdata_shape[1:]))  # chunks side by side in a row of chunks
    if rows is None:
        chunks: Iterable[int] = range(int(np.prod(arr.cdata_shape)))
    else:
        first = np.unique(np.asarray(rows, dtype=np.int64) // arr.chunks[0]) * across
        chunks = (int(f) + j for f in first for j in range(across))
    for i in chunks:
        if skip is not None and i in skip:
            continue
        _check_one(folder, name, arr, i, entry, True)
        if skip is not None:
            skip.add(i)


def sample(n: int) -> list[int]:
    """The chunks :func:`check_output` checksums of an array of ``n``: the first, the
    last and up to :data:`SPREAD` spread evenly between them."""
    if n <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, n - 1, SPREAD + 2).round()})


def check_output(folder: Path, sealed: dict, group, full: bool = False) -> None:
    """Check a finished output before it is reused: every recorded array is there, every
    chunk file has the size Zarr writes, and the chunks of :func:`sample` (every chunk
    when ``full``) match their CRCs. Raises the one-line :class:`DatasetError` of the
    first that fails."""
    rec = sealed.get(CRC_KEY)
    if not isinstance(rec, dict):
        return
    for name in sorted(rec):
        entry = _entry(sealed, name)
        if entry is None:
            continue
        if name not in group:
            raise DatasetError(folder / name, f"array {name} of the output is missing; {REMEDY}")
        arr = group[name]
        n = int(np.prod(arr.cdata_shape))
        crc = set(range(n)) if full else set(sample(n))
        for i in range(n):
            _check_one(folder, name, arr, i, entry, i in crc)
