"""Page layout of ``features.bin`` (format v1) and of raw index files.

A feature row of ``row_bytes`` bytes never straddles a 4 KiB page when it fits
in one: ``rows_per_page = PAGE // row_bytes`` rows share a page and row ``r``
starts at byte ``(r // rows_per_page) * PAGE + (r % rows_per_page) * row_bytes``.
A larger row is padded to ``pages_per_row`` whole pages and row ``r`` starts
at ``r * pages_per_row * PAGE``. Either way a row is read with whole-page,
page-aligned O_DIRECT reads.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass

import numpy as np

from ooc.core.errors import InvalidValue

PAGE = 4096
#: The smallest ``O_DIRECT`` read: a logical block of most devices (others take ``PAGE``).
SECTOR = 512

FEATURE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class FeatureLayout:
    """Where each feature row lives in ``features.bin``.

    Attributes:
        num_rows: number of rows (nodes).
        dim: values per row.
        dtype: numpy dtype name of the values (``float32`` or ``float16``).
    """

    num_rows: int
    dim: int
    dtype: str

    @property
    def row_bytes(self) -> int:
        return self.dim * np.dtype(self.dtype).itemsize

    @property
    def rows_per_page(self) -> int:
        """Rows sharing one page; 0 when a row needs more than one page."""
        return PAGE // self.row_bytes if self.row_bytes <= PAGE else 0

    @property
    def pages_per_row(self) -> int:
        """Whole pages a row occupies; 1 when rows share pages."""
        return 1 if self.row_bytes <= PAGE else -(-self.row_bytes // PAGE)

    @property
    def packed(self) -> bool:
        """Whether rows follow each other with no padding (they fill pages exactly), so
        the file's bytes are the rows as a C-contiguous array."""
        return self.row_bytes % PAGE == 0 or (self.rows_per_page > 0
                                             and self.rows_per_page * self.row_bytes == PAGE)

    @property
    def num_pages(self) -> int:
        if self.rows_per_page:
            return -(-self.num_rows // self.rows_per_page)
        return self.num_rows * self.pages_per_row

    @property
    def file_bytes(self) -> int:
        return self.num_pages * PAGE

    def row_offsets(self, rows: np.ndarray) -> np.ndarray:
        """Byte offsets of ``rows`` (int64 [n]) in the file, int64 [n]."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.rows_per_page:
            rpp = self.rows_per_page
            return (rows // rpp) * PAGE + (rows % rpp) * self.row_bytes
        return rows * (self.pages_per_row * PAGE)

    def view(self, buf: np.ndarray) -> "RowView":
        """A row-indexable view over the file's bytes (uint8 [file_bytes])."""
        return RowView(self, buf)

    def to_meta(self) -> dict:
        return {
            "feature_dim": self.dim,
            "feature_dtype": self.dtype,
            "row_bytes": self.row_bytes,
            "rows_per_page": self.rows_per_page,
            "pages_per_row": self.pages_per_row,
        }


class RowTable:
    """Mixin for a feature table with a ``layout``: its ``shape`` and ``dtype``."""

    layout: FeatureLayout

    @property
    def shape(self) -> tuple[int, int]:
        return (self.layout.num_rows, self.layout.dim)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.layout.dtype)


class RowView:
    """Rows of a page-laid-out byte buffer, without copying.

    ``view[ids]`` returns an array of shape [len(ids), dim] (a copy);
    ``view[a:b] = rows`` writes rows ``a..b`` in place.
    """

    def __init__(self, layout: FeatureLayout, buf: np.ndarray):
        self.layout = layout
        dt = np.dtype(layout.dtype)
        if buf.size < layout.file_bytes:
            raise InvalidValue(f"buffer has {buf.size} bytes, layout needs {layout.file_bytes}")
        buf = buf[: layout.file_bytes]
        if layout.rows_per_page:
            rpp = layout.rows_per_page
            pages = buf.reshape(layout.num_pages, PAGE)[:, : rpp * layout.row_bytes]
            # [pages, rows_per_page, dim]; a flat 2-D view is impossible when
            # PAGE is not a multiple of row_bytes.
            self._arr = pages.view(dt).reshape(layout.num_pages, rpp, layout.dim)
        else:
            stride = layout.pages_per_row * PAGE
            rows = buf.reshape(layout.num_rows, stride)[:, : layout.row_bytes]
            self._arr = rows.view(dt)

    def _split(self, ids: np.ndarray):
        if self.layout.rows_per_page:
            rpp = self.layout.rows_per_page
            return ids // rpp, ids % rpp
        return (ids,)

    def __len__(self) -> int:
        return self.layout.num_rows

    def __getitem__(self, ids) -> np.ndarray:
        if isinstance(ids, slice):
            ids = np.arange(*ids.indices(self.layout.num_rows))
        ids = np.asarray(ids, dtype=np.int64)
        return self._arr[self._split(ids)]

    def __setitem__(self, ids, rows: np.ndarray) -> None:
        if isinstance(ids, slice):
            ids = np.arange(*ids.indices(self.layout.num_rows))
        ids = np.asarray(ids, dtype=np.int64)
        self._arr[self._split(ids)] = rows


def read_rows(f, layout: FeatureLayout, a: int, b: int) -> np.ndarray:
    """Rows ``a .. b`` of a page-laid-out feature file open for reading (``a`` at a page
    boundary: a multiple of ``rows_per_page``) as a C-contiguous [b - a, dim] array, read
    with plain reads (nothing mapped into the process).

    Raises:
        OSError: the file ends before row ``b``.
    """
    local = FeatureLayout(b - a, layout.dim, layout.dtype)
    f.seek(int(layout.row_offsets(np.array([a]))[0]))
    buf = np.empty(local.file_bytes, dtype=np.uint8)  # read into: no bytes object beside it
    got = 0
    while got < buf.shape[0]:
        k = f.readinto(buf[got:].data)
        if not k:
            raise OSError(errno.EIO, "short read", str(getattr(f, "name", "")))
        got += k
    if layout.packed:
        return buf[:(b - a) * layout.row_bytes].view(layout.dtype).reshape(b - a, layout.dim)
    return np.ascontiguousarray(local.view(buf)[0:b - a])


def index_dtype(num_nodes: int) -> np.dtype:
    """dtype of ``indices.bin``: int32 when num_nodes < 2**31, else int64."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


def padded_bytes(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole number of pages."""
    return -(-nbytes // PAGE) * PAGE


def aligned_empty(nbytes: int, align: int = PAGE) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data is ``align``-aligned."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise InvalidValue("nbytes must be >= 0")
    return aligned_part(np.empty(nbytes + align, dtype=np.uint8), nbytes, align)


def aligned_part(raw: np.ndarray, nbytes: int, align: int = PAGE) -> np.ndarray:
    """The first ``nbytes`` of uint8 ``raw`` from its first ``align``-aligned byte (a view)."""
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]
