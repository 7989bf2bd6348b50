"""Kernels of :mod:`.activation`: ReLU or ELU and dropout in one pass, and their backward
passes.

The dropout noise is counter-based: element ``i`` of a call keeps its value when the
32-bit half ``i % 2`` (the high half first) of ``mix64(seed + GOLDEN * (i // 2 + 1))`` is
below ``threshold`` (``round((1 - p) * 2^32)``), so a draw depends only on the seed and
the element's position, never on the threads that ran it.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ooc.core._random_kernels import GOLDEN, mix64
from ooc.core.threading_layer import parallel_kernel

#: pairs of elements (one 64-bit draw each) per parallel task
_BLOCK = 1 << 14
_ONE = np.uint64(1)
_S32 = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)


@nb.njit(inline="always", cache=True)
def _keep_one(h, i, draw, threshold, scale, zero, out, keep):
    """Element ``i`` by its 32-bit ``draw``: kept when the draw is below ``threshold`` and
    ``h[i] > 0``; ``x * scale * kept + 0`` gives +0.0 for a dropped element and keeps a
    NaN as ``F.relu`` does, without a branch (the loop vectorises)."""
    x = h[i]
    k = (draw < threshold) & (x > zero)
    keep[i] = k
    out[i] = x * scale * k + zero


@nb.njit(inline="always", cache=True)
def _elu_keep_one(h, i, draw, threshold, scale, zero, out, keep):
    """Element ``i`` by its 32-bit ``draw``: ``elu(h[i]) * scale`` when the draw is below
    ``threshold``, else +0.0 (a NaN stays NaN). ``expm1`` (a libm call, most of the
    kernel's time) runs for kept non-positive elements only: a dropped one takes 0 in its
    place (NaN for a NaN), which the zero factor turns into what ``elu(x) * 0`` gives."""
    x = h[i]
    k = draw < threshold
    keep[i] = k
    if x > zero:
        v = x
    elif k:
        v = np.expm1(x)
    else:
        v = zero if x == x else x
    out[i] = v * scale * k + zero


@nb.njit(inline="always", cache=True)
def _one(h, i, draw, threshold, scale, zero, out, keep, elu):
    if elu:
        _elu_keep_one(h, i, draw, threshold, scale, zero, out, keep)
    else:
        _keep_one(h, i, draw, threshold, scale, zero, out, keep)


@nb.njit(inline="always", cache=True)
def _forward_pairs(h, seed, threshold, scale, out, keep, lo, hi, elu):
    """Pairs ``lo .. hi - 1`` (elements ``2 lo .. 2 hi - 1``), one draw each; then, when
    ``hi`` is the last pair and ``h`` has an odd length, its last element (the high half
    of the next pair's draw). ``elu``: ELU, else ReLU (a constant of the calling kernel:
    the branch folds away)."""
    zero = scale - scale
    for j in range(lo, hi):
        r = mix64(seed + GOLDEN * (np.uint64(j) + _ONE))
        _one(h, 2 * j, r >> _S32, threshold, scale, zero, out, keep, elu)
        _one(h, 2 * j + 1, r & _LOW, threshold, scale, zero, out, keep, elu)
    n = h.shape[0]
    if hi == n // 2 and n % 2:
        r = mix64(seed + GOLDEN * (np.uint64(hi) + _ONE))
        _one(h, n - 1, r >> _S32, threshold, scale, zero, out, keep, elu)


@nb.njit(inline="always", cache=True)
def _forward_blocks(h, seed, threshold, scale, out, keep, elu):
    """Every pair of ``h`` in blocks of :data:`_BLOCK` pairs, the blocks in parallel (the
    calling kernel's ``prange`` once inlined)."""
    pairs = h.shape[0] // 2
    blocks = max(1, (pairs + _BLOCK - 1) // _BLOCK)
    for b in nb.prange(blocks):
        _forward_pairs(h, seed, threshold, scale, out, keep, b * _BLOCK,
                       min(pairs, (b + 1) * _BLOCK), elu)


@nb.njit(inline="always", cache=True)
def _scale_range(grad, keep, scale, out, lo, hi):
    zero = scale - scale
    for i in range(lo, hi):
        out[i] = grad[i] * scale if keep[i] else zero


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def relu_dropout_forward(h, seed, threshold, scale, out, keep):
    """``out[i] = h[i] * scale`` where ``h[i] > 0`` and the draw keeps element ``i``, else
    +0.0 (NaN stays NaN); ``keep[i]`` whether it was kept. Blocks of pairs in parallel.

    Args:
        h: float32 or float64 [n] (the layer's output, flattened).
        seed: uint64, the call's seed.
        threshold: uint64 in ``[0, 2^32]``: a draw below it keeps the element.
        scale: ``1 / (1 - p)`` in ``h``'s dtype.
        out: [n], ``h``'s dtype (written).
        keep: bool [n] (written).
    """
    _forward_blocks(h, seed, threshold, scale, out, keep, False)


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def elu_dropout_forward(h, seed, threshold, scale, out, keep):
    """:func:`relu_dropout_forward` with ELU: ``out[i] = elu(h[i]) * scale`` where the
    draw keeps element ``i`` (the same draws), else +0.0; ``keep[i]`` the draw's verdict.
    Arguments as :func:`relu_dropout_forward`'s."""
    _forward_blocks(h, seed, threshold, scale, out, keep, True)


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def masked_scale(grad, keep, scale, out):
    """``out[i] = grad[i] * scale`` where ``keep[i]``, else 0 (the backward pass).
    Blocks in parallel.

    Args:
        grad: float32 or float64 [n]; keep: bool [n]; scale: in ``grad``'s dtype.
        out: [n], ``grad``'s dtype (written).
    """
    n = grad.shape[0]
    step = 2 * _BLOCK
    for b in nb.prange((n + step - 1) // step):
        _scale_range(grad, keep, scale, out, b * step, min(n, (b + 1) * step))


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def elu_masked_scale(grad, keep, out, scale, res):
    """The backward pass of :func:`elu_dropout_forward` from its output: ``res[i] =
    grad[i] * scale`` where kept and ``out[i] > 0``, ``grad[i] * (out[i] + scale)`` where
    kept and not (``scale * elu'(h) = scale * (elu(h) + 1)``, as torch's ELU backward
    takes it from its result), else 0.

    Args:
        grad, out: float32 or float64 [n]; keep: bool [n]; scale: in ``grad``'s dtype.
        res: [n], ``grad``'s dtype (written).
    """
    n = grad.shape[0]
    step = 2 * _BLOCK
    zero = scale - scale
    for b in nb.prange((n + step - 1) // step):
        for i in range(b * step, min(n, (b + 1) * step)):
            o = out[i]
            d = scale if o > zero else o + scale
            res[i] = grad[i] * d if keep[i] else zero
