"""numba kernels for layer-wise inference (see :mod:`ooc.executor.inference.layerwise`).

All kernels take the CSC adjacency (``indptr`` int64 [N+1], ``indices``
int32/int64 [E], in-neighbours of v are ``indices[indptr[v]:indptr[v+1]]``),
the processing order ``perm`` (row -> node) and its inverse ``rowof``
(node -> row), both [N] of one integer dtype (int32 below 2^31 nodes).
"""
from __future__ import annotations

import numba
import numpy as np

from ooc.core.threading_layer import parallel_kernel


@parallel_kernel
@numba.njit(cache=True, parallel=True)
def nonloop_in_degree(indptr, indices):
    """int64 [N]: in-edges of every node that are not self loops."""
    n = indptr.shape[0] - 1
    out = np.zeros(n, dtype=np.int64)
    for v in numba.prange(n):
        c = 0
        for j in range(indptr[v], indptr[v + 1]):
            if indices[j] != v:
                c += 1
        out[v] = c
    return out


@numba.njit(cache=True)
def plan_blocks(indptr, indices, perm, max_targets, costs, limits, stamp):
    """Cut rows 0..N into blocks of consecutive rows, each within every cost limit.

    Row ``r`` is target ``perm[r]`` with in-neighbours ``indices[indptr[v]:indptr[v+1]]``
    (the graph's CSC, or a block's local graph with ``perm`` the identity to cut it
    into sub-blocks). A block's cost ``k`` is ``targets * costs[k, 0] + local_nodes *
    costs[k, 1] + in_edges * costs[k, 2]`` (``costs`` int64 [K, 3], one row per phase of a
    block's life), at most ``limits[k]`` (int64 [K]), with ``local_nodes`` the distinct
    nodes among its targets and their in-neighbours, counted exactly (``stamp``: int64
    [number of nodes] of -1, left as found; a repeated in-neighbour of one target counts
    twice). A block holds at most ``max_targets`` targets; a single target over a limit
    gets a block to itself. Blocks may span output chunks. Returns int64 block starts
    followed by N.
    """
    n = perm.shape[0]
    nk = costs.shape[0]
    starts = np.empty(n + 1, dtype=np.int64)
    cost = np.zeros(nk, dtype=np.int64)
    nb = 0
    r = 0
    while r < n:
        starts[nb] = r
        cost[:] = 0
        cnt = 0
        while r < n and cnt < max_targets:
            v = perm[r]
            deg = indptr[v + 1] - indptr[v]
            new = 1 if stamp[v] != nb else 0
            for j in range(indptr[v], indptr[v + 1]):
                u = indices[j]
                if stamp[u] != nb and u != v:
                    new += 1
            over = False
            for k in range(nk):
                if cost[k] + costs[k, 0] + new * costs[k, 1] + deg * costs[k, 2] > limits[k]:
                    over = True
            if cnt > 0 and over:
                break  # row r starts the next block (its stamps are not set yet)
            stamp[v] = nb
            for j in range(indptr[v], indptr[v + 1]):
                stamp[indices[j]] = nb
            for k in range(nk):
                cost[k] += costs[k, 0] + new * costs[k, 1] + deg * costs[k, 2]
            cnt += 1
            r += 1
        nb += 1
    starts[nb] = n
    for r in range(n):
        v = perm[r]
        stamp[v] = -1
        for j in range(indptr[v], indptr[v + 1]):
            stamp[indices[j]] = -1
    return starts[: nb + 1].copy()


@numba.njit(cache=True)
def access_plan(indptr, indices, perm, rowof, block_starts, chunk_rows, num_chunks,
                serpentine=True):
    """Previous-layer chunks each block reads, in block order.

    Returns ``(ptr, chunks)``: block b reads the chunk ids
    ``chunks[ptr[b]:ptr[b+1]]`` -- the chunks holding its targets' rows and
    all their in-neighbours' rows -- sorted ascending, or with
    ``serpentine`` descending in odd blocks, so that the chunks read last by
    one block are the first the next block asks for (a plain ascending scan
    is a cyclic pattern on which LRU and FIFO never hit).
    """
    nblocks = block_starts.shape[0] - 1
    stamp = np.full(num_chunks, -1, dtype=np.int64)
    ptr = np.zeros(nblocks + 1, dtype=np.int64)
    cap = nblocks * 4 + 16
    out = np.empty(cap, dtype=np.int64)
    k = 0
    buf = np.empty(num_chunks, dtype=np.int64)
    for b in range(nblocks):
        m = 0
        for r in range(block_starts[b], block_starts[b + 1]):
            v = perm[r]
            c = rowof[v] // chunk_rows
            if stamp[c] != b:
                stamp[c] = b
                buf[m] = c
                m += 1
            for j in range(indptr[v], indptr[v + 1]):
                c = rowof[indices[j]] // chunk_rows
                if stamp[c] != b:
                    stamp[c] = b
                    buf[m] = c
                    m += 1
        if k + m > cap:
            while k + m > cap:
                cap *= 2
            tmp = np.empty(cap, dtype=np.int64)
            tmp[:k] = out[:k]
            out = tmp
        srt = np.sort(buf[:m])
        if serpentine and b % 2 == 1:
            srt = srt[::-1]
        out[k:k + m] = srt
        k += m
        ptr[b + 1] = k
    return ptr, out[:k].copy()


@numba.njit(cache=True)
def build_local(indptr, indices, perm, s, e, scratch, drop_self_loops):
    """The local graph of the targets ``perm[s:e]`` (in-neighbours of v are
    ``indices[indptr[v]:indptr[v+1]]``: the graph's CSC, or a block's local graph with
    ``perm`` the identity to take a sub-block of it).

    Local ids: targets first (0 .. e-s-1, in row order), then their
    in-neighbours in order of first appearance. ``scratch`` is an integer array of -1, one
    per node (left as it was found). Returns ``(nodes, src, eptr)``:
    ``nodes`` int64 the global node id of every local node, ``src`` int64 [m] the
    local source of every in-edge, target by target (self loops skipped when
    ``drop_self_loops``), ``eptr`` int64 [e-s+1]: target ``t``'s in-edges are
    ``src[eptr[t]:eptr[t+1]]``. While it runs it holds ``nodes`` at its largest possible
    size (targets plus in-edges, at most the node count) and its copy, and ``src`` twice
    only where self loops were dropped.
    """
    nt = e - s
    m = 0
    for r in range(s, e):
        v = perm[r]
        m += indptr[v + 1] - indptr[v]
    nodes = np.empty(min(nt + m, scratch.shape[0]), dtype=np.int64)
    src = np.empty(m, dtype=np.int64)
    eptr = np.empty(nt + 1, dtype=np.int64)
    for i in range(nt):
        v = perm[s + i]
        nodes[i] = v
        scratch[v] = i
    nn = nt
    k = 0
    for i in range(nt):
        eptr[i] = k
        v = perm[s + i]
        for j in range(indptr[v], indptr[v + 1]):
            u = indices[j]
            if drop_self_loops and u == v:
                continue
            lu = scratch[u]
            if lu < 0:
                lu = nn
                scratch[u] = nn
                nodes[nn] = u
                nn += 1
            src[k] = lu
            k += 1
    eptr[nt] = k
    for i in range(nn):
        scratch[nodes[i]] = -1
    return nodes[:nn].copy(), src if k == m else src[:k].copy(), eptr


@numba.njit(cache=True)
def count_block_keys(indptr, indices, perm, block_starts, keyof, key_div, num_keys):
    """Sum over blocks of the distinct keys ``keyof[node] // key_div`` (``keyof`` empty:
    ``node // key_div``) of the block's targets and in-neighbours (e.g. the pages of
    their rows a block reads)."""
    nblocks = block_starts.shape[0] - 1
    mapped = keyof.shape[0] > 0
    stamp = np.full(num_keys, -1, dtype=np.int64)
    total = 0
    for b in range(nblocks):
        for r in range(block_starts[b], block_starts[b + 1]):
            v = perm[r]
            k = (keyof[v] if mapped else v) // key_div
            if stamp[k] != b:
                stamp[k] = b
                total += 1
            for j in range(indptr[v], indptr[v + 1]):
                u = indices[j]
                k = (keyof[u] if mapped else u) // key_div
                if stamp[k] != b:
                    stamp[k] = b
                    total += 1
    return total


@numba.njit(cache=True)
def gather_rows(vals, offsets, at, out):
    """``out[at[i]] = vals[offsets[i] : offsets[i] + out.shape[1]]`` (vals [*] and out
    [k, dim] of one dtype; offsets int64 [m] in elements; at int64 [m], rows of out)."""
    d = out.shape[1]
    for i in range(offsets.shape[0]):
        o = offsets[i]
        r = at[i]
        for j in range(d):
            out[r, j] = vals[o + j]


@numba.njit(cache=True)
def bucket_edges(indptr, src, a, first_dst, key_out, key_in, group_rows, src_rows,
                 num_src_chunks, num_buckets, bid, pairs):
    """Sort the CSC positions ``a .. a + len(src)`` into buckets of (target group, source
    chunk), for streamed aggregation.

    ``src``: the in-neighbours at those positions (``indices[a:a + m]``); the destination
    of position ``k`` is the node ``v`` with ``indptr[v] <= k < indptr[v+1]``, found by
    walking ``indptr`` from ``first_dst``. A target's group is ``key_out[v] //
    group_rows``, a source's chunk ``key_in[u] // src_rows`` (``key_out``, ``key_in``:
    int [N] node -> row of the output, of the input). Edge ``(u, v)`` goes to bucket
    ``group * num_src_chunks + chunk`` as the pair ``(key_in[u] % src_rows,
    key_out[v] % group_rows)``. ``bid``: int32 [m] scratch; ``pairs``: int32 [m, 2], filled
    bucket after bucket (edges of a bucket in CSC order). Returns int64 [num_buckets + 1],
    where each bucket's pairs start.
    """
    m = src.shape[0]
    counts = np.zeros(num_buckets + 1, dtype=np.int64)
    v = first_dst
    for i in range(m):
        while indptr[v + 1] <= a + i:
            v += 1
        b = (key_out[v] // group_rows) * num_src_chunks + key_in[src[i]] // src_rows
        bid[i] = b
        counts[b + 1] += 1
    for b in range(num_buckets):
        counts[b + 1] += counts[b]
    pos = counts[:-1].copy()
    v = first_dst
    for i in range(m):
        while indptr[v + 1] <= a + i:
            v += 1
        p = pos[bid[i]]
        pos[bid[i]] = p + 1
        pairs[p, 0] = key_in[src[i]] % src_rows
        pairs[p, 1] = key_out[v] % group_rows
    return counts


@numba.njit(cache=True)
def accumulate_rows(acc, x, pairs, use_max):
    """``acc[t] += x[s]`` (or the elementwise max, ``use_max``) for every pair ``(s, t)`` of
    ``pairs`` (int32 [m, 2]); ``acc`` float32 [targets, d], ``x`` float32 [sources, d].

    One thread: splitting the row's columns between two threads (no two writing one
    value) ran faster alone but slower inside ``ooc.infer`` (``docs/benchmarks.md``)."""
    for i in range(pairs.shape[0]):
        _reduce_into(acc, pairs[i, 1], x, pairs[i, 0], use_max)


@numba.njit(cache=True, inline="always")
def _reduce_into(acc, t, x, s, use_max):
    """``acc[t] += x[s]``, or the elementwise max with ``use_max``."""
    if use_max:
        for j in range(acc.shape[1]):
            if x[s, j] > acc[t, j]:
                acc[t, j] = x[s, j]
    else:
        for j in range(acc.shape[1]):
            acc[t, j] += x[s, j]


@numba.njit(cache=True, inline="always")
def _starts(deg):
    """int64 [R + 1]: where each row's edges start (``deg`` int [R]), and their total."""
    first = np.empty(deg.shape[0] + 1, dtype=np.int64)
    first[0] = 0
    for r in range(deg.shape[0]):
        first[r + 1] = first[r] + deg[r]
    return first


@parallel_kernel
@numba.njit(cache=True, parallel=True)
def reduce_rows(x, src, deg, out, use_max):
    """``out[r]`` = the sum (or elementwise max, ``use_max``) of ``x[s]`` over row ``r``'s
    sources: ``deg`` int [R] edges a row, ``src`` int [sum(deg)] the sources' rows of ``x``
    (float32 [rows, d]) row after row; ``out`` float32 [R, d]. A row without edges gets 0.
    Rows in parallel, each summed in its edges' order (the same result on any thread
    count)."""
    d = x.shape[1]
    first = _starts(deg)
    for r in numba.prange(deg.shape[0]):
        k = first[r]
        m = first[r + 1] - k
        if m == 0:
            out[r] = 0.0
            continue
        s = src[k]
        for j in range(d):
            out[r, j] = x[s, j]
        for i in range(k + 1, k + m):
            _reduce_into(out, r, x, src[i], use_max)


@parallel_kernel
@numba.njit(cache=True, parallel=True)
def reduce_rows_half(bits, value, src, deg, out, use_max):
    """:func:`reduce_rows` of float16 values held as their bits (numba has no float16):
    ``bits`` uint16 [rows, d], ``value`` float32 [65536] the value of every bit pattern;
    ``out`` float32 [R, d], each row reduced in float32 in its edges' order."""
    d = bits.shape[1]
    first = _starts(deg)
    for r in numba.prange(deg.shape[0]):
        k = first[r]
        m = first[r + 1] - k
        if m == 0:
            out[r] = 0.0
            continue
        s = src[k]
        for j in range(d):
            out[r, j] = value[bits[s, j]]
        for i in range(k + 1, k + m):
            s = src[i]
            if use_max:
                for j in range(d):
                    v = value[bits[s, j]]
                    if v > out[r, j]:
                        out[r, j] = v
            else:
                for j in range(d):
                    out[r, j] += value[bits[s, j]]


@numba.njit(cache=True)
def group_edge_counts(indptr, rowof, group_rows, groups):
    """int64 [groups]: the in-edges of the targets of each group of ``group_rows``
    consecutive rows (``rowof`` node -> row)."""
    out = np.zeros(groups, dtype=np.int64)
    for v in range(indptr.shape[0] - 1):
        out[rowof[v] // group_rows] += indptr[v + 1] - indptr[v]
    return out


@numba.njit(cache=True)
def place_by_row(pairs, r0, local_rows, halo, deg, ldeg, out):
    """Counting sort of a group's ``pairs`` (int32 [m, 2]: source key, row in the group;
    the group's first row is ``r0``) by row, the order of a row's edges kept. An edge is
    *local* when ``local_rows > 0`` and its source key lies within ``halo`` rows of its
    target's block of ``local_rows`` rows (``[b * local_rows - halo, (b + 1) * local_rows +
    halo)``, ``b = row // local_rows``). ``deg``, ``ldeg`` (int32 [rows]) get each row's
    other and local edges; ``out`` (int32 [m]) the others' source keys row after row, then
    the local ones'. Returns the local edges."""
    rows = deg.shape[0]
    for i in range(rows):
        deg[i] = 0
        ldeg[i] = 0
    nloc = 0
    for i in range(pairs.shape[0]):
        t = pairs[i, 1]
        if _is_local(pairs[i, 0], r0 + t, local_rows, halo):
            ldeg[t] += 1
            nloc += 1
        else:
            deg[t] += 1
    pos = np.empty(rows, dtype=np.int64)
    lpos = np.empty(rows, dtype=np.int64)
    p = 0
    q = pairs.shape[0] - nloc
    for i in range(rows):
        pos[i] = p
        lpos[i] = q
        p += deg[i]
        q += ldeg[i]
    for i in range(pairs.shape[0]):
        t = pairs[i, 1]
        if _is_local(pairs[i, 0], r0 + t, local_rows, halo):
            out[lpos[t]] = pairs[i, 0]
            lpos[t] += 1
        else:
            out[pos[t]] = pairs[i, 0]
            pos[t] += 1
    return nloc


@numba.njit(cache=True, inline="always")
def _is_local(key, row, local_rows, halo):
    if local_rows <= 0:
        return False
    b = row // local_rows
    return b * local_rows - halo <= key < (b + 1) * local_rows + halo


@numba.njit(cache=True)
def local_share(indptr, indices, perm, key_in, rows, local_rows, halo):
    """The share of the in-edges of output rows ``rows`` (int64, a sample) whose source's
    key (``key_in`` node -> input row) is local to the row (see :func:`place_by_row`)."""
    loc = 0
    tot = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        v = perm[r]
        for j in range(indptr[v], indptr[v + 1]):
            tot += 1
            if _is_local(key_in[indices[j]], r, local_rows, halo):
                loc += 1
    return loc / tot if tot else 0.0
