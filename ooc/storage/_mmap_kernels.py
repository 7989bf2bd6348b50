"""numba kernels of :mod:`ooc.storage.mmap_features` (nogil: run from many threads).

Each call copies a chunk of rows out of a memory map; the
page faults of one thread overlap with those of the others because the kernels
release the GIL.
"""
from __future__ import annotations

import numba as nb


@nb.njit(nogil=True, cache=True)
def copy_rows(src, offsets, order, row_bytes, out, start, end):
    """out[r] = src[offsets[r] : offsets[r] + row_bytes] for r = order[k], k in [start, end).

    src uint8 [file_bytes] (a memmap); offsets int64 [n] byte offsets; order
    int64 [n], a permutation (the rows in file order, so a chunk is one
    region of the file); out uint8 [n, row_bytes].
    """
    for k in range(start, end):
        r = order[k]
        o = offsets[r]
        for j in range(row_bytes):
            out[r, j] = src[o + j]
