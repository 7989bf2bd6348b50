"""The feature protocol every feature layer implements (GraphBolt's ``Feature``).

A feature is a table of node rows, [num_rows, dim] in one dtype, read by id.
The disk readers (:class:`~ooc.storage.direct.DirectFeatures`: O_DIRECT through a
read backend; :class:`~ooc.storage.mmap_features.ThreadedMmapFeatures`: a memmap
copied by threads) implement it, and so do the caches that wrap one of them as
their fallback (:mod:`ooc.caches`).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import DTypeLike

from ooc.core.errors import IdOutOfRange, InvalidValue


@runtime_checkable
class Feature(Protocol):
    """Rows of a node-feature table.

    ``read(ids, out=None)``: ids int64 [n] in ``[0, shape[0])``, any order,
    repeats allowed; returns [n, shape[1]] of ``dtype`` (``out`` when given,
    which must be C-contiguous of that shape and dtype).
    """

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def read(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    # a ``stats()`` method, or a counters object held as ``stats`` (DirectFeatures): read
    # either with :func:`counters`
    @property
    def stats(self) -> Any: ...

    def close(self) -> None: ...


def counters(feature) -> dict:
    """A feature's counters as a dict: its ``stats()``, or a counters dataclass held
    as ``stats`` (:class:`~ooc.storage.direct.DirectFeatures`); ``{}`` without one."""
    s = getattr(feature, "stats", None)
    if s is None:
        return {}
    s = s() if callable(s) else s
    return dict(s) if isinstance(s, dict) else dict(vars(s))


def read_counted(feature, ids: np.ndarray, row_bytes: int) -> tuple[np.ndarray, int]:
    """``feature.read(ids)`` and the bytes it read: the difference of its ``bytes_read``
    counter (:func:`counters`), or ``len(ids) * row_bytes`` for a reader that keeps none
    (any object with ``read(ids)``)."""
    before = counters(feature).get("bytes_read")
    rows = feature.read(ids)
    if before is None:
        return rows, len(ids) * int(row_bytes)
    return rows, int(counters(feature)["bytes_read"]) - int(before)


def check_out(out: np.ndarray | None, n: int, dim: int, dtype: DTypeLike, what: str) -> np.ndarray:
    """``out`` checked against [n, dim] of ``dtype`` (C-contiguous), or a new array.

    Raises:
        ValueError: one line naming ``what`` and the mismatch.
    """
    if out is None:
        return np.empty((n, dim), dtype=dtype)
    if out.shape != (n, dim) or out.dtype != np.dtype(dtype) or not out.flags.c_contiguous:
        raise InvalidValue(f"{what}: out must be a C-contiguous {np.dtype(dtype)} array of shape "
                         f"({n}, {dim}), got {out.dtype} {tuple(out.shape)}")
    return out


class NodeRows:
    """A feature table stored in another row order, read by node id.

    Node ``v``'s row is row ``row_of[v]`` of ``source``; ``read(ids)`` returns the rows of
    ``ids`` in the order given, as if the table were stored in node order. Every other
    attribute (``stats``, ``backend``, ``layout``, ...) is the source's.

    Args:
        source: a :class:`Feature` of the stored table (its ids are stored rows).
        row_of: int32/int64 [N], node id -> stored row (a memmap of the dataset's
            ``feature_rows.npy``: 4 bytes a node, paged in as batches touch it).
        what: the file named in errors.
    """

    def __init__(self, source, row_of: np.ndarray, what: str):
        self.source = source
        self.row_of = row_of
        self.what = what
        if hasattr(source, "read_into"):
            self.read_into = self._read_into

    def __getattr__(self, name: str) -> Any:
        if name in ("source", "row_of", "what"):  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.source, name)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Stored rows of node ``ids`` (int64 [n]).

        Raises:
            IdOutOfRange: an id outside ``[0, N)``, named with the file.
        """
        ids = np.asarray(ids, dtype=np.int64)
        n = self.row_of.shape[0]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IdOutOfRange(f"{self.what}: node id {bad} out of range [0, {n})")
        return np.asarray(self.row_of[ids], dtype=np.int64)

    def read(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of node ``ids`` (int64 [n]) as [n, dim] of the table's dtype."""
        return self.source.read(self.rows(ids), out)

    def storage_order(self, ids: np.ndarray) -> np.ndarray:
        """A permutation of ``range(len(ids))`` that puts ``ids`` in the order their rows are
        stored: a reader of many rows in chunks reads them in this order, so each chunk
        covers a stretch of the file instead of pages all over it (read again by the next
        chunk)."""
        return np.argsort(self.rows(ids), kind="stable")

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray,
                   also: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        if also is not None:
            also = (self.rows(also[0]), also[1], also[2])
        return self.source.read_into(self.rows(ids), out, rows, also)
