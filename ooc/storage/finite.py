"""Non-finite feature values (NaN, infinity) in rows read from a feature file.

One check serves every reader that hands rows out (ooc.infer's layer outputs,
:class:`~ooc.executor.loader.node_loader.NodeLoader`'s batches, :mod:`ooc.pyg`'s
feature store) and ``ooc.prepare verify``'s scan of a whole file: the values' exponent
bits, tested by a numba kernel at memory speed (:mod:`._finite_kernels`).
"""
from __future__ import annotations

import os

import numpy as np

from ooc.core.errors import DatasetError
from ooc.storage import _finite_kernels as K

#: The exponent bits of each float dtype (all set: NaN or infinite), with the unsigned
#: integer type of the same width.
_EXPONENT = {2: (np.uint16, 0x7C00), 4: (np.uint32, 0x7F800000),
             8: (np.uint64, 0x7FF0000000000000)}


def _words(values: np.ndarray) -> tuple[np.ndarray, object]:
    """``values`` (a float array) flattened as unsigned words, and its exponent mask."""
    values = np.ascontiguousarray(values)
    word, mask = _EXPONENT[values.dtype.itemsize]
    return values.reshape(-1).view(word), word(mask)


def count_nonfinite(values: np.ndarray) -> int:
    """NaN and infinite values in ``values`` (float16/32/64, any shape)."""
    if values.size == 0:
        return 0
    words, mask = _words(values)
    return int(K.count_nonfinite(words, mask))


def first_nonfinite_row(rows: np.ndarray) -> int:
    """Index of the first row of ``rows`` (float16/32/64 [n, dim]) holding a NaN or an
    infinity, -1 when every value is finite."""
    rows = np.asarray(rows)
    if rows.size == 0 or count_nonfinite(rows) == 0:
        return -1
    words, mask = _words(rows)
    return int(K.first_nonfinite(words, mask)) // max(1, rows.shape[-1])


def nonfinite_row_error(path: str | os.PathLike, node: int) -> DatasetError:
    """The one-line error for node ``node``'s feature row in the file ``path`` holding a
    NaN or an infinity."""
    return DatasetError(path, f"the feature row of node {node} holds NaN or infinite values "
                              f"(a corrupted page?); python -m ooc.prepare verify DATASET checks "
                              f"every row")


def check_finite_rows(rows: np.ndarray, nodes: np.ndarray, path: str | os.PathLike) -> None:
    """Raise :func:`nonfinite_row_error` for the first of ``rows`` (float [n, dim], row ``k``
    the features of node ``nodes[k]``) holding a NaN or an infinity.

    Raises:
        DatasetError: naming ``path`` and the node.
    """
    k = first_nonfinite_row(rows)
    if k >= 0:
        raise nonfinite_row_error(path, int(nodes[k]))
