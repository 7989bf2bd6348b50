"""The feature protocol every feature layer implements (GraphBolt's ``Feature``).

A feature is a table of node rows, [num_rows, dim] in one dtype, read by id.
The disk readers (:class:`~ooc.storage.direct.DirectFeatures`: O_DIRECT through a
read backend; :class:`~ooc.storage.mmap_features.ThreadedMmapFeatures`: a memmap
copied by threads) implement it, and so do the caches that wrap one of them as
their fallback (:mod:`ooc.executor.cache`).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import DTypeLike

from .errors import InvalidValue


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
