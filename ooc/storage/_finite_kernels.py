"""numba kernels of :mod:`ooc.storage.finite`: non-finite values found by their bits.

A float is NaN or infinite exactly when its exponent bits are all ones; the kernels
test those bits on the values viewed as unsigned integers of the same width (uint16
for float16, uint32 for float32, uint64 for float64), so one kernel serves every
feature dtype, float16 included (numba has no float16 arithmetic).
"""
from __future__ import annotations

import numba as nb


@nb.njit(nogil=True, cache=True)
def count_nonfinite(words, mask):
    """How many of ``words`` (uint16/32/64 [n], a float array's bits) have every bit of
    ``mask`` (the float's exponent bits) set: its NaN and infinite values. No early exit,
    so the loop vectorises (a streaming check at memory speed)."""
    c = 0
    for i in range(words.shape[0]):
        c += (words[i] & mask) == mask
    return c


@nb.njit(nogil=True, cache=True)
def first_nonfinite(words, mask):
    """Position of the first of ``words`` (as :func:`count_nonfinite`) whose exponent bits
    are all set, -1 when there is none."""
    for i in range(words.shape[0]):
        if (words[i] & mask) == mask:
            return i
    return -1
