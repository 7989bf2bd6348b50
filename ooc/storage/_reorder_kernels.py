"""Numba kernels of :mod:`ooc.storage.reorder`: size-capped label propagation over a CSC
graph and the counting sort that turns labels into a node order."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ooc.core.threading_layer import parallel_kernel

#: In-neighbour lists up to this long are tallied in a thread's small hash table; longer
#: ones (few) are sorted, one at a time.
HASHED = 4096
_TABLE = 2 * HASHED  # a power of two: the table stays at most half full


@njit(cache=True, nogil=True)
def _better(lab, c, cur, best, best_cnt):
    """Whether label ``lab`` with ``c`` votes beats ``best`` with ``best_cnt``: more votes;
    ties go to the node's own label ``cur``, then to the smaller label (a total order, so
    the labels may be visited in any order)."""
    return c > best_cnt or (c == best_cnt and (lab == cur or (best != cur and lab < best)))


@njit(cache=True, nogil=True)
def _hashed_best(labs, d, cur, size, cap, keys, cnt, used):
    """The winning label among ``labs[:d]`` (``d <= HASHED``), tallied in the open-addressing
    table ``keys``/``cnt`` (all -1/0, and so again on return; ``used``: scratch), and its
    votes less those of ``cur``."""
    m = 16
    while m < 2 * d:
        m *= 2
    mask = m - 1
    nd = 0
    for j in range(d):
        lab = labs[j]
        h = (np.int64(lab) * 2654435761) & mask
        while keys[h] != -1 and keys[h] != lab:
            h = (h + 1) & mask
        if keys[h] == -1:
            keys[h] = lab
            used[nd] = h
            nd += 1
        cnt[h] += 1
    best, best_cnt, cur_cnt = cur, 0, 0
    for i in range(nd):
        h = used[i]
        lab, c = keys[h], cnt[h]
        keys[h] = -1
        cnt[h] = 0
        if lab == cur:
            cur_cnt = c
        # the tie-break first: ``size`` is read (a cache miss on large graphs) only for a
        # label that would win
        if _better(lab, c, cur, best, best_cnt) and (lab == cur or size[lab] < cap):
            best, best_cnt = lab, c
    return best, best_cnt - cur_cnt


@njit(cache=True, nogil=True)
def _sorted_best(labs, d, cur, size, cap):
    """The winning label among ``labs[:d]``, counted as runs after sorting them in place,
    and its votes less those of ``cur``."""
    s = labs[:d]
    s.sort()
    best, best_cnt, cur_cnt = cur, 0, 0
    j = 0
    while j < d:
        lab = s[j]
        k = j + 1
        while k < d and s[k] == lab:
            k += 1
        if lab == cur:
            cur_cnt = k - j
        if _better(lab, k - j, cur, best, best_cnt) and (lab == cur or size[lab] < cap):
            best, best_cnt = lab, k - j
        j = k
    return best, best_cnt - cur_cnt


@njit(cache=True, nogil=True)
def _choose(ptr, window, k, v, label, size, cap, labs, keys, cnt, used, votes):
    """The label node ``v`` (``ptr[k]``..``ptr[k+1]``: its list in ``window``) proposes, and
    how many more of its counted in-neighbours hold it than hold its own. A list longer
    than ``votes`` (when positive) counts ``votes`` of its entries, evenly spaced: entry
    ``(j * d) // votes`` for ``j < votes`` of a list of ``d``."""
    a = ptr[k] - ptr[0]
    d = ptr[k + 1] - ptr[k]
    if 0 < votes < d:
        for j in range(votes):  # independent loads first: many of them in flight at once
            labs[j] = label[window[a + (j * d) // votes]]
        d = votes
    else:
        for j in range(d):
            labs[j] = label[window[a + j]]
    if d <= HASHED:
        return _hashed_best(labs, d, label[v], size, cap, keys, cnt, used)
    return _sorted_best(labs, d, label[v], size, cap)


@parallel_kernel
@njit(cache=True, nogil=True, parallel=True)
def propagate_window(ptr, window, v0, label, size, cap, block, prop, gains, threads, votes):
    """Label propagation over nodes ``v0 .. v0 + len(ptr) - 2``, part of a sweep.

    ``ptr`` is ``indptr[v0 : v1 + 1]`` (absolute offsets) and ``window`` the in-neighbour
    ids ``indices[ptr[0] : ptr[-1]]``. Nodes go in blocks of ``block`` consecutive ids
    (block b: ``b*block .. (b+1)*block - 1``, whatever the window): every node of a block
    proposes the label most frequent among its in-neighbours (``votes`` of them, evenly
    spaced, in a longer list when ``votes`` is positive; ties: its own, then the
    smaller) among those with room (``size`` below ``cap``) as labels stood when the
    block began, on ``threads`` threads; once the block is complete its nodes move, in
    id order, to the labels they proposed that still have room. ``size`` counts the nodes
    per label. ``prop`` (``block`` labels) and ``gains`` (int64 [block]) carry a block's
    proposals from one window to the next. With ``block`` 1 this is the sequential sweep;
    the result never depends on ``threads`` nor on where windows end.

    Returns ``(moved, gain)``: how many nodes moved, and by how many their counted
    in-neighbours sharing their label grew (each mover's votes for its new label less
    those for its old one, as the labels stood when its block began).
    """
    n = label.shape[0]
    v1 = v0 + ptr.shape[0] - 1
    labs_t = np.empty((threads, HASHED), label.dtype)
    keys_t = np.full((threads, _TABLE), -1, label.dtype)
    cnt_t = np.zeros((threads, _TABLE), np.int32)
    used_t = np.empty((threads, HASHED), np.int64)
    # lists that count more than HASHED entries are sorted one at a time, below; with
    # ``votes`` up to HASHED every list is tallied on the threads
    sorts = votes <= 0 or votes > HASHED
    big = 0
    for k in range(v1 - v0):
        d = ptr[k + 1] - ptr[k]
        if sorts and d > HASHED and d > big:
            big = d
    labs_big = np.empty(big, label.dtype)
    moved = 0
    gain = 0
    s = v0
    while s < v1:
        b0 = (s // block) * block
        b1 = min(n, b0 + block)
        e = min(v1, b1)
        step = (e - s + threads - 1) // threads
        for t in prange(threads):
            lo = s + t * step
            hi = min(e, lo + step)
            for v in range(lo, hi):
                k = v - v0
                if not (sorts and ptr[k + 1] - ptr[k] > HASHED):
                    prop[v - b0], gains[v - b0] = _choose(
                        ptr, window, k, v, label, size, cap, labs_t[t], keys_t[t], cnt_t[t],
                        used_t[t], votes)
        for v in range(s, e):
            k = v - v0
            if sorts and ptr[k + 1] - ptr[k] > HASHED:
                prop[v - b0], gains[v - b0] = _choose(ptr, window, k, v, label, size, cap,
                                                      labs_big, keys_t[0], cnt_t[0], used_t[0],
                                                      votes)
        if e == b1:  # the block is complete: its moves, in id order
            for v in range(b0, b1):
                best = prop[v - b0]
                cur = label[v]
                if best != cur and size[best] < cap:
                    size[cur] -= 1
                    size[best] += 1
                    label[v] = best
                    moved += 1
                    gain += gains[v - b0]
        s = e
    return moved, gain


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


@parallel_kernel
@njit(cache=True, nogil=True, parallel=True)
def place_rows(out, group_rows, group_bytes, rows, dest, a, seen):
    """Row ``i`` of ``rows`` (uint8 [k, row_bytes], the rows' bytes) placed as row
    ``dest[i] - a`` of the page-laid-out bytes ``out`` (uint8 [m bytes]): row ``t`` starts at
    ``(t // group_rows) * group_bytes + (t % group_rows) * row_bytes`` (``group_rows`` rows
    to a page, or 1 row to its ``group_bytes`` of whole pages). ``seen`` (uint8 [rows
    ``out`` holds], all 0) gets 1 for every row placed. Returns how many destinations fell
    outside ``out`` (their rows are skipped)."""
    rb = rows.shape[1]
    cap = seen.shape[0]
    bad = 0
    for i in prange(dest.shape[0]):
        t = dest[i] - a
        if t < 0 or t >= cap:
            bad += 1
        else:
            o = (t // group_rows) * group_bytes + (t % group_rows) * rb
            out[o:o + rb] = rows[i]
            seen[t] = 1
    return bad


@njit(cache=True, nogil=True)
def group_by_part(dest, limit, part, parts, order, ends):
    """A stable counting sort of ``dest`` (int64 [k], each in ``0 .. limit - 1``, ``limit <=
    part * parts``) by ``dest // part``: ``order`` (int64 [k]) gets the positions of part 0's
    entries, then part 1's, ..., each in their order; ``ends`` (int64 [parts]) where each
    part's positions end. Returns the first position whose value is outside
    ``0 .. limit - 1``, else -1."""
    ends[:] = 0
    for i in range(dest.shape[0]):
        if dest[i] < 0 or dest[i] >= limit:
            return i
        ends[dest[i] // part] += 1
    acc = 0
    for p in range(parts):
        c = ends[p]
        ends[p] = acc
        acc += c
    for i in range(dest.shape[0]):
        p = dest[i] // part
        order[ends[p]] = i
        ends[p] += 1
    return -1
