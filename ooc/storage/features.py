"""The feature base every feature reader implements (GraphBolt's ``Feature``).

A feature is a table of node rows, [num_rows, dim] in one dtype, read by id.
:class:`Feature` is an abstract class with template methods (as PyG's
``FeatureStore.get_tensor`` / ``_get_tensor``): the public :meth:`Feature.read` and
:meth:`Feature.read_into` check the ids, ``out`` and the target rows once, then call the
one hook a reader implements, :meth:`Feature._read_into`. The disk readers
(:class:`~ooc.storage.direct.DirectFeatures`: O_DIRECT through a read backend;
:class:`~ooc.storage.mmap_features.ThreadedMmapFeatures`: a memmap copied by threads;
:class:`~ooc.storage.dataset.MmapFeatures`), :class:`InMemoryFeatures` and the inference's
chunk rows implement it; the wrappers (:class:`NodeRows`, the loader's ``TimedFeature``,
the caches' ``CachedFeature``) derive from :class:`FeatureWrapper`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import cast

import numpy as np
from numpy.typing import DTypeLike

from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.storage._direct_kernels import check_targets

#: ``(ids, out, rows)`` of a second read in the same request (see :meth:`Feature.read_into`)
Also = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


class Feature(ABC):
    """Rows of a node-feature table.

    ``read(ids, out=None)``: ids integers [n] in ``[0, shape[0])``, any order, repeats
    allowed; returns [n, shape[1]] of ``dtype`` (``out`` when given, which must be
    C-contiguous of that shape and dtype). ``read_into(ids, out, rows)``: the same rows
    into chosen rows of a larger array. Both check their arguments, then call
    :meth:`_read_into` (or :meth:`_read_also` for a second read in the same request).

    Attributes:
        what: the file (or thing) errors name.
        id_kind: what an id is, in errors (``"row"``; ``"node"`` for rows read by node id).
    """

    what: str = "features"
    id_kind: str = "row"

    @property
    @abstractmethod
    def shape(self) -> tuple[int, int]:
        """``(num_rows, dim)``."""

    @property
    @abstractmethod
    def dtype(self) -> np.dtype:
        """The rows' dtype."""

    @abstractmethod
    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        """``out[rows[i]] = row ids[i]`` (``rows`` None: ``out[i]``).

        Called with checked arguments only: ``ids`` int64 [n > 0] C-contiguous, in range;
        ``out`` C-contiguous [m, dim] of :attr:`dtype`; ``rows`` int64 [n], distinct, in
        ``[0, m)``, or None with ``m == n``.
        """

    def _read_also(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                   also: Also) -> None:
        """:meth:`_read_into` of ``(ids, out, rows)`` and of ``also`` (checked, either may
        have no ids); a reader that reads both in one request (a page holding rows of
        each read once) overrides this."""
        if ids.shape[0]:
            self._read_into(ids, out, rows)
        if also[0].shape[0]:
            self._read_into(*also)

    def _new_out(self, n: int) -> np.ndarray:
        """A new [n, dim] array of :attr:`dtype` for :meth:`read` to fill."""
        return np.empty((n, self.shape[1]), dtype=self.dtype)

    def read(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``ids`` as [n, dim] of :attr:`dtype` (into ``out`` when given).

        Raises:
            IdOutOfRange: an id outside ``[0, shape[0])``, named with :attr:`what`.
            InvalidValue: ids not integers, or ``out`` not a C-contiguous [n, dim] array of
                :attr:`dtype`.
        """
        ids = self._checked_ids(ids)
        n = ids.shape[0]
        if out is None:
            out = self._new_out(n)
        else:
            check_out(out, n, self.shape[1], self.dtype, self.what)
        if n:
            self._read_into(ids, out, None)
        return out

    def read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                  also: Also | None = None) -> np.ndarray:
        """Rows ``ids`` into ``out[rows]`` (``rows`` int64 [n], distinct rows of ``out``;
        None: ``out[i]``, ``out`` of n rows; ``out`` C-contiguous [m, dim] of
        :attr:`dtype`); returns ``out``.

        ``also = (ids2, out2, rows2)``: more rows into a second array in the same request,
        so a reader that reads pages reads a page holding rows of both once.

        Raises:
            IdOutOfRange: an id outside ``[0, shape[0])``, named with :attr:`what`.
            InvalidValue: ids not integers, a bad ``out``, or target rows out of range,
                repeated or not one per id.
        """
        ids, rows = self._checked_targets(ids, out, rows)
        if also is None:
            if ids.shape[0]:
                self._read_into(ids, out, rows)
            return out
        ids2, rows2 = self._checked_targets(*also)
        if ids.shape[0] or ids2.shape[0]:
            self._read_also(ids, out, rows, (ids2, also[1], rows2))
        return out

    def storage_order(self, ids: np.ndarray) -> np.ndarray:
        """A permutation of ``range(len(ids))`` that puts ``ids`` in the order their rows are
        stored: a reader of many rows in chunks reads them in this order, so each chunk
        covers a stretch of the file instead of pages all over it."""
        return np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")

    def stats(self) -> dict:
        """Counters of the reads so far (``bytes_read`` where the reader counts bytes)."""
        return {}

    def close(self) -> None:
        """Release what the reader holds (files, threads); closing twice is fine."""
        return None  # a reader holding nothing has nothing to release

    def _checked_ids(self, ids) -> np.ndarray:
        """``ids`` as C-contiguous int64 [n], every one in ``[0, shape[0])``."""
        a = np.asarray(ids)
        if a.size and a.dtype.kind not in "iu":
            raise InvalidValue(f"{self.what}: {self.id_kind} ids must be integers, got {a.dtype}")
        a = np.ascontiguousarray(a, dtype=np.int64).reshape(-1)
        n = self.shape[0]
        if a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= n:
                raise IdOutOfRange(f"{self.what}: {self.id_kind} id {lo if lo < 0 else hi} "
                                   f"out of range [0, {n})")
        return a

    def _checked_targets(self, ids, out: np.ndarray, rows) -> tuple[np.ndarray, np.ndarray | None]:
        """``(ids, rows)`` checked (see :meth:`read_into`), after checking ``out``."""
        ids = self._checked_ids(ids)
        if not isinstance(out, np.ndarray) or out.ndim != 2:
            raise InvalidValue(f"{self.what}: out must be a C-contiguous {self.dtype} array of "
                               f"shape (rows, {self.shape[1]}), got {type(out).__name__}")
        check_out(out, out.shape[0], self.shape[1], self.dtype, self.what)
        if rows is None:
            if out.shape[0] != ids.shape[0]:
                raise InvalidValue(f"{self.what}: {ids.shape[0]} ids but out has "
                                   f"{out.shape[0]} rows")
            return ids, None
        dst = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if dst.shape != ids.shape:
            raise InvalidValue(f"{self.what}: {ids.shape[0]} ids but {dst.shape[0]} target rows")
        bad, why = check_targets(dst, out.shape[0])
        if bad >= 0:
            raise InvalidValue(f"{self.what}: target row {dst[bad]} " + (
                f"out of range [0, {out.shape[0]})" if why == 1 else "given twice"))
        return ids, dst


class FeatureWrapper(Feature):
    """A feature over another (``inner``): its shape, dtype, name, stats and close are the
    inner's, and so are its reads unless a wrapper changes them."""

    def __init__(self, inner: Feature):
        self.inner = inner

    @property
    def shape(self) -> tuple[int, int]:
        return cast("tuple[int, int]", tuple(self.inner.shape))

    @property
    def dtype(self) -> np.dtype:
        return self.inner.dtype

    @property
    def what(self) -> str:  # type: ignore[override]
        return self.inner.what

    def _new_out(self, n: int) -> np.ndarray:
        return self.inner._new_out(n)

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        self.inner._read_into(ids, out, rows)

    def _read_also(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                   also: Also) -> None:
        self.inner._read_also(ids, out, rows, also)

    def storage_order(self, ids: np.ndarray) -> np.ndarray:
        return self.inner.storage_order(ids)

    def stats(self) -> dict:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class InMemoryFeatures(Feature):
    """A feature table held in memory: ``array`` [num_rows, dim] (any array numpy can index,
    a memmap too)."""

    def __init__(self, array: np.ndarray, what: str = "features"):
        array = np.asarray(array) if not isinstance(array, np.memmap) else array
        if array.ndim != 2:
            raise InvalidValue(f"{what}: a feature table must be 2-D, got shape {array.shape}")
        self.array = array
        self.what = what
        self.requests = self.rows = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.array.shape[0]), int(self.array.shape[1]))

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        if rows is None:
            np.take(self.array, ids, axis=0, out=out)
        else:
            out[rows] = self.array[ids]
        self.requests += 1
        self.rows += ids.shape[0]

    def stats(self) -> dict:
        return {"requests": self.requests, "rows": self.rows,
                "bytes_read": self.rows * self.shape[1] * self.dtype.itemsize}


def read_counted(feature: Feature, ids: np.ndarray, row_bytes: int) -> tuple[np.ndarray, int]:
    """``feature.read(ids)`` and the bytes it read: the difference of its ``bytes_read``
    counter (:meth:`Feature.stats`), or ``len(ids) * row_bytes`` for a reader that keeps
    none."""
    before = feature.stats().get("bytes_read")
    rows = feature.read(ids)
    if before is None:
        return rows, len(ids) * int(row_bytes)
    return rows, int(feature.stats()["bytes_read"]) - int(before)


def check_out(out: np.ndarray | None, n: int, dim: int, dtype: DTypeLike, what: str) -> np.ndarray:
    """``out`` checked against [n, dim] of ``dtype`` (C-contiguous), or a new array.

    Raises:
        InvalidValue: one line naming ``what`` and the mismatch.
    """
    if out is None:
        return np.empty((n, dim), dtype=dtype)
    if out.shape != (n, dim) or out.dtype != np.dtype(dtype) or not out.flags.c_contiguous:
        raise InvalidValue(f"{what}: out must be a C-contiguous {np.dtype(dtype)} array of shape "
                         f"({n}, {dim}), got {out.dtype} {tuple(out.shape)}")
    return out


class NodeRows(FeatureWrapper):
    """A feature table stored in another row order, read by node id.

    Node ``v``'s row is row ``row_of[v]`` of ``source``; reads return the rows of ``ids``
    in the order given, as if the table were stored in node order.

    Args:
        source: a :class:`Feature` of the stored table (its ids are stored rows).
        row_of: int32/int64 [N], node id -> stored row (a memmap of the dataset's
            ``feature_rows.npy``: 4 bytes a node, paged in as batches touch it).
        what: the file named in errors.
    """

    id_kind = "node"

    def __init__(self, source: Feature, row_of: np.ndarray, what: str):
        super().__init__(source)
        self.row_of = row_of
        self._what = what

    @property
    def source(self) -> Feature:
        """The stored table."""
        return self.inner

    @property
    def what(self) -> str:  # type: ignore[override]
        return self._what

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.row_of.shape[0]), int(self.inner.shape[1]))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Stored rows of node ``ids`` (int64 [n]).

        Raises:
            IdOutOfRange: an id outside ``[0, N)``, named with the file.
        """
        return np.asarray(self.row_of[self._checked_ids(ids)], dtype=np.int64)

    def storage_order(self, ids: np.ndarray) -> np.ndarray:
        return np.argsort(self.rows(ids), kind="stable")

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        self.inner._read_into(self._stored(ids), out, rows)

    def _read_also(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None,
                   also: Also) -> None:
        self.inner._read_also(self._stored(ids), out, rows,
                              (self._stored(also[0]), also[1], also[2]))

    def _stored(self, ids: np.ndarray) -> np.ndarray:
        """Stored rows of checked node ids, checked against the stored table (a row map
        that points past it is an error, not a read outside the file)."""
        return self.inner._checked_ids(self.row_of[ids])
