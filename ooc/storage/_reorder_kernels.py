"""Numba kernels of :mod:`ooc.storage.reorder`: size-capped label propagation over a CSC
graph and the counting sort that turns labels into a node order."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def propagate_window(ptr, window, v0, label, size, cap, count):
    """One label-propagation sweep over nodes ``v0 .. v0 + len(ptr) - 2``.

    ``ptr`` is ``indptr[v0 : v1 + 1]`` (absolute offsets) and ``window`` the in-neighbour
    ids ``indices[ptr[0] : ptr[-1]]``. Each node takes the label most frequent among its
    in-neighbours (ties: its own label, then the smaller one), moving only into a label
    that holds fewer than ``cap`` nodes; ``size`` counts the nodes per label and is kept
    up to date. ``count`` ([N], zeros, label dtype) tallies a node's neighbour labels and
    is zero again on return. Returns how many nodes moved.
    """
    moved = 0
    base = ptr[0]
    maxd = 0
    for k in range(ptr.shape[0] - 1):
        maxd = max(maxd, ptr[k + 1] - ptr[k])
    labs = np.empty(maxd, label.dtype)  # a node's neighbour labels: one random read each
    for k in range(ptr.shape[0] - 1):
        a = ptr[k] - base
        d = ptr[k + 1] - ptr[k]
        if d == 0:
            continue
        v = v0 + k
        for j in range(d):  # independent loads first: many of them in flight at once
            labs[j] = label[window[a + j]]
        for j in range(d):
            count[labs[j]] += 1
        cur = label[v]
        best, best_cnt = cur, 0
        for j in range(d):  # each distinct label once: its tally is cleared as it is read
            lab = labs[j]
            c = count[lab]
            if c == 0:
                continue
            count[lab] = 0
            if lab != cur and size[lab] >= cap:
                continue
            if c > best_cnt or (c == best_cnt and (lab == cur or (best != cur and lab < best))):
                best, best_cnt = lab, c
        if best != cur:
            size[cur] -= 1
            size[best] += 1
            label[v] = best
            moved += 1
    return moved


@njit(cache=True, nogil=True)
def order_by_label(label, count, out):
    """Node ids grouped by label into ``out`` ([N], int32 or int64): labels in increasing
    order, nodes in id order within a label (a stable counting sort). ``count`` is a
    zeroed scratch of N + 1 integers (labels are node ids)."""
    n = label.shape[0]
    for v in range(n):
        count[label[v] + 1] += 1
    for r in range(n):
        count[r + 1] += count[r]
    for v in range(n):
        r = label[v]
        out[count[r]] = v
        count[r] += 1


@njit(cache=True, nogil=True)
def inverse_into(perm, rank):
    """``rank[perm[i]] = i`` for every i (``rank``: [N], int32 or int64)."""
    for i in range(perm.shape[0]):
        rank[perm[i]] = i


@njit(cache=True, nogil=True)
def first_repeat(values, n, seen):
    """Position in ``values`` of the first value outside ``[0, n)`` or already marked in
    the bitmap ``seen`` (uint8 [ceil(n / 8)], updated), else -1: checks, a chunk at a
    time, that a file holds a permutation of ``0 .. n-1``."""
    for i in range(values.shape[0]):
        v = values[i]
        if v < 0 or v >= n:
            return i
        byte, bit = v >> 3, np.uint8(1 << (v & 7))
        if seen[byte] & bit:
            return i
        seen[byte] |= bit
    return -1
