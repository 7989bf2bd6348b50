"""Numba kernels for streaming ingest: text parsing, degree counting, windowed
scatter into CSC, per-node sort/dedup, and the synthetic generator's
counter-based random numbers (deterministic regardless of thread count)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ooc.core._random_kernels import GOLDEN as _GOLDEN
from ooc.core._random_kernels import M2 as _M2
from ooc.core._random_kernels import mix64 as _mix
from ooc.core.threading_layer import parallel_kernel

# -- text edge lists ----------------------------------------------------------

#: status codes of :func:`parse_edges_text`
TXT_OK, TXT_MALFORMED, TXT_NEGATIVE, TXT_RANGE, TXT_OVERFLOW = 0, 1, 2, 3, 4

_MAXID = np.int64(1) << np.int64(62)


@njit(cache=True, nogil=True)
def parse_edges_text(buf, src, dst, num_nodes):
    """Parse complete lines of ``buf`` (uint8) holding two integer fields each.

    Fields are separated by blanks, tabs or one comma; blank lines and lines
    starting with ``#`` or ``%`` are skipped. ``num_nodes`` < 0 disables the
    upper range check. Returns ``(n_edges, n_lines, status, bad_line, bad_value)``
    where ``bad_line`` is the 0-based line within ``buf`` of the first error.
    """
    n = buf.shape[0]
    i = 0
    line = 0
    ne = 0
    while i < n:
        # start of a line
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i >= n:
            break
        c = buf[i]
        if c == 10:
            i += 1
            line += 1
            continue
        if c == 35 or c == 37:  # '#' or '%'
            while i < n and buf[i] != 10:
                i += 1
            i += 1
            line += 1
            continue
        nf = 0
        a = np.int64(0)
        b = np.int64(0)
        while True:
            # one field
            neg = False
            if i < n and buf[i] == 45:  # '-'
                neg = True
                i += 1
            if i >= n or buf[i] < 48 or buf[i] > 57:
                return ne, line, TXT_MALFORMED, line, 0
            v = np.int64(0)
            while i < n and 48 <= buf[i] <= 57:
                v = v * 10 + (buf[i] - 48)
                if v > _MAXID:
                    return ne, line, TXT_OVERFLOW, line, 0
                i += 1
            if neg:
                v = -v
            if nf == 0:
                a = v
            elif nf == 1:
                b = v
            nf += 1
            # separator
            sep = False
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
                sep = True
            if i < n and buf[i] == 44:  # ','
                i += 1
                sep = True
                while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                    i += 1
            if i >= n or buf[i] == 10:
                break
            if not sep:
                return ne, line, TXT_MALFORMED, line, 0
        if nf != 2:
            return ne, line, TXT_MALFORMED, line, 0
        if a < 0:
            return ne, line, TXT_NEGATIVE, line, a
        if b < 0:
            return ne, line, TXT_NEGATIVE, line, b
        if num_nodes >= 0:
            if a >= num_nodes:
                return ne, line, TXT_RANGE, line, a
            if b >= num_nodes:
                return ne, line, TXT_RANGE, line, b
        src[ne] = a
        dst[ne] = b
        ne += 1
        i += 1
        line += 1
    return ne, line, TXT_OK, -1, 0


@njit(cache=True, nogil=True)
def parse_floats_rows(buf, out, ncols):
    """Parse comma/blank separated floats, ``ncols`` per line, into ``out``
    (float64 [rows, ncols]). ``nan`` is accepted. Returns ``(rows, status,
    bad_line)``; status 1 = malformed line."""
    n = buf.shape[0]
    i = 0
    row = 0
    line = 0
    while i < n:
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i >= n:
            break
        if buf[i] == 10:
            i += 1
            line += 1
            continue
        col = 0
        while True:
            if col >= ncols:
                return row, 1, line
            # parse one float: [-+]digits[.digits][e[-+]digits] or nan
            neg = False
            if i < n and (buf[i] == 45 or buf[i] == 43):
                neg = buf[i] == 45
                i += 1
            if i + 2 < n + 0 and (buf[i] | 32) == 110 and (buf[i + 1] | 32) == 97 \
                    and (buf[i + 2] | 32) == 110:
                val = np.nan
                i += 3
            else:
                mant = 0.0
                nd = 0
                while i < n and 48 <= buf[i] <= 57:
                    mant = mant * 10.0 + (buf[i] - 48)
                    i += 1
                    nd += 1
                scale = 0
                if i < n and buf[i] == 46:
                    i += 1
                    while i < n and 48 <= buf[i] <= 57:
                        mant = mant * 10.0 + (buf[i] - 48)
                        scale -= 1
                        i += 1
                        nd += 1
                if nd == 0:
                    return row, 1, line
                if i < n and (buf[i] | 32) == 101:
                    i += 1
                    eneg = False
                    if i < n and (buf[i] == 45 or buf[i] == 43):
                        eneg = buf[i] == 45
                        i += 1
                    ev = 0
                    ned = 0
                    while i < n and 48 <= buf[i] <= 57:
                        ev = ev * 10 + (buf[i] - 48)
                        i += 1
                        ned += 1
                    if ned == 0:
                        return row, 1, line
                    scale += -ev if eneg else ev
                val = mant * 10.0 ** scale
                if neg:
                    val = -val
            out[row, col] = val
            col += 1
            sep = False
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
                sep = True
            if i < n and buf[i] == 44:
                i += 1
                sep = True
                while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                    i += 1
            if i >= n or buf[i] == 10:
                break
            if not sep:
                return row, 1, line
        if col != ncols:
            return row, 1, line
        row += 1
        line += 1
        i += 1
    return row, 0, -1


# -- validation and counting --------------------------------------------------

@njit(cache=True, nogil=True)
def first_bad_id(src, dst, num_nodes):
    """Index of the first edge with an id < 0 or >= num_nodes (num_nodes < 0:
    only negatives), else -1; and the max id seen."""
    mx = np.int64(-1)
    for k in range(src.shape[0]):
        a = src[k]
        b = dst[k]
        if a < 0 or b < 0:
            return k, mx
        if num_nodes >= 0 and (a >= num_nodes or b >= num_nodes):
            return k, mx
        if a > mx:
            mx = a
        if b > mx:
            mx = b
    return -1, mx


@njit(cache=True, nogil=True)
def count_in_degrees(src, dst, counts, undirected, drop_self):
    """counts[d] += 1 per edge s->d (and counts[s] += 1 for the reverse edge
    when ``undirected`` and s != d). Self loops are skipped with ``drop_self``."""
    for k in range(src.shape[0]):
        s = src[k]
        d = dst[k]
        if s == d:
            if drop_self:
                continue
            counts[d] += 1
            continue
        counts[d] += 1
        if undirected:
            counts[s] += 1


@njit(cache=True, nogil=True)
def scatter_window(src, dst, lo, hi, cursor, seg, undirected, drop_self):
    """Place the sources of edges whose target is in [lo, hi) into ``seg``
    at ``cursor[target - lo]`` (then advance it)."""
    for k in range(src.shape[0]):
        s = src[k]
        d = dst[k]
        if s == d:
            if drop_self:
                continue
            if lo <= d < hi:
                seg[cursor[d - lo]] = s
                cursor[d - lo] += 1
            continue
        if lo <= d < hi:
            seg[cursor[d - lo]] = s
            cursor[d - lo] += 1
        if undirected and lo <= s < hi:
            seg[cursor[s - lo]] = d
            cursor[s - lo] += 1


@njit(cache=True, nogil=True)
def route_entries(src, dst, ends, first, shift, undirected, drop_self, counts, win, out):
    """The stored entries of the edges ``src[k] -> dst[k]`` (ids checked in range), each a
    (target, source) pair, grouped by the window of their target.

    An edge gives the entry (dst, src), and with ``undirected`` also (src, dst) unless it
    is a self loop; ``drop_self`` drops self loops. Window w holds the targets below
    ``ends[w]`` (int64 [W], increasing, the last the node count) and not below
    ``ends[w - 1]``; ``first`` (int32) holds the window of node ``b << shift`` for every
    b (:func:`window_lookup`). ``counts`` (int64 [W], zeroed) gets each window's entries, ``win``
    (int32, room for two entries an edge) is scratch, and ``out`` (ids [2 * len(src), 2])
    the entries, window 0's first, each window's in input order. Returns the number of
    entries, or ``-(k + 1)`` for the first edge k with an id outside ``[0, ends[-1])``
    (nothing placed then).
    """
    n = ends[-1]
    pos = np.zeros(counts.shape[0], np.int64)
    m = 0
    for place in range(2):  # count each window's entries, then place them
        j = 0
        for k in range(src.shape[0]):
            s = src[k]
            d = dst[k]
            if not place and (s < 0 or s >= n or d < 0 or d >= n):
                return -(k + 1)
            if s == d and drop_self:
                continue
            for r in range(2 if undirected and s != d else 1):
                t, u = (d, s) if r == 0 else (s, d)
                if place:
                    p = pos[win[j]]
                    out[p, 0] = t
                    out[p, 1] = u
                    pos[win[j]] = p + 1
                else:
                    w = first[t >> shift]
                    while ends[w] <= t:
                        w += 1
                    win[j] = w
                    counts[w] += 1
                j += 1
        m = j
        acc = 0
        for w in range(counts.shape[0]):
            pos[w] = acc
            acc += counts[w]
    return m


@njit(cache=True, nogil=True)
def window_lookup(ends, shift, first):
    """``first[b]``: the window of node ``b << shift`` (``ends``: int64 [W], each window's
    end), so that a node's window is found from ``first[v >> shift]`` in a step or few."""
    w = 0
    for b in range(first.shape[0]):
        while ends[w] <= (b << shift):
            w += 1
        first[b] = w


@njit(cache=True, nogil=True)
def scatter_entries(pairs, lo, cursor, ends, seg):
    """Place each entry's source ``pairs[k, 1]`` at ``seg[cursor[t]]`` for its target
    ``t = pairs[k, 0] - lo`` (then advance ``cursor[t]``). ``ends[t]`` is where node t's
    segment ends. Returns the index of the first entry whose target is not in the window
    (``0 <= t < len(cursor)``) or whose segment is already full, else -1."""
    nw = cursor.shape[0]
    for k in range(pairs.shape[0]):
        t = pairs[k, 0] - lo
        if t < 0 or t >= nw or cursor[t] >= ends[t]:
            return k
        seg[cursor[t]] = pairs[k, 1]
        cursor[t] += 1
    return -1


@parallel_kernel
@njit(cache=True, parallel=True)
def sort_segments(seg, ptr, dedup, newdeg):
    """Sort each node's segment ``seg[ptr[i]:ptr[i+1]]`` in place; with
    ``dedup`` drop repeats (kept at the segment's front). ``newdeg[i]`` gets
    the segment's resulting length."""
    m = ptr.shape[0] - 1
    for i in prange(m):
        a = ptr[i]
        b = ptr[i + 1]
        if b - a > 1:
            seg[a:b].sort()
            if dedup:
                w = a + 1
                for r in range(a + 1, b):
                    if seg[r] != seg[w - 1]:
                        seg[w] = seg[r]
                        w += 1
                newdeg[i] = w - a
            else:
                newdeg[i] = b - a
        else:
            newdeg[i] = b - a


@njit(cache=True, nogil=True)
def compact_segments(seg, ptr, newdeg):
    """Move each segment's first ``newdeg[i]`` entries left so segments are
    contiguous; returns the total length."""
    w = 0
    for i in range(ptr.shape[0] - 1):
        a = ptr[i]
        k = newdeg[i]
        if w != a:
            for r in range(k):
                seg[w + r] = seg[a + r]
        w += k
    return w


# -- counter-based random numbers (synthetic generator) -----------------------

_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0


@njit(inline="always")
def _stream(seed, stream, counter):
    """Initial state of the random stream number ``counter`` of ``stream``."""
    return _mix(_mix(np.uint64(seed) * _GOLDEN + np.uint64(stream)) ^ (np.uint64(counter) * _M2))


@njit(inline="always")
def _next(state):
    state = state + _GOLDEN
    return state, _mix(state)


@njit(inline="always")
def _uniform(z):
    return np.float64(z >> _S11) * _INV53


@parallel_kernel
@njit(cache=True, parallel=True)
def rmat_edges(seed, start, n, levels, pa, pab, pabc, classes, p_in, cover,
               perm, out_src, out_dst):
    """Edges ``start .. start+len(out_src)`` of the synthetic stream.

    Internal ids come from R-MAT (quadrant probabilities a, b, c, d per level
    over 2**levels ids, ids >= n redrawn). Internal id r belongs to community
    ``r % classes``; with probability ``p_in`` the target is moved into the
    source's community (keeping its rank, hence its skew). Edge g < ``cover``
    has source g so every node has at least one edge. Self loops are redrawn.
    Output ids are ``perm[r]``. Each edge has its own random stream, so the
    result does not depend on chunking or thread count.
    """
    m = out_src.shape[0]
    for k in prange(m):
        g = start + k
        st = _stream(seed, 1, g)
        s = np.int64(0)
        d = np.int64(0)
        for _attempt in range(64):
            s = np.int64(0)
            d = np.int64(0)
            for _level in range(levels):
                st, z = _next(st)
                u = _uniform(z)
                s <<= 1
                d <<= 1
                if u < pa:
                    pass
                elif u < pab:
                    d |= 1
                elif u < pabc:
                    s |= 1
                else:
                    s |= 1
                    d |= 1
            if g < cover:
                s = g
            if s >= n or d >= n:
                continue
            st, z = _next(st)
            if _uniform(z) < p_in:
                d = d - d % classes + s % classes
                if d >= n:
                    d -= classes
                if d < 0:
                    continue
            if d != s:
                break
        if d == s:
            d = (s + classes) % n if n > classes else (s + 1) % n
        out_src[k] = perm[s]
        out_dst[k] = perm[d]


@parallel_kernel
@njit(cache=True, parallel=True)
def noisy_features(seed, start, labels, centroids, noise, out):
    """Rows ``start ..`` of ``centroids[label] + noise * N(0, 1)`` into ``out``
    (float32 [rows, dim]); one random stream per row."""
    rows, dim = out.shape
    for r in prange(rows):
        st = _stream(seed, 2, start + r)
        c = labels[r]
        j = 0
        while j < dim:
            st, z1 = _next(st)
            st, z2 = _next(st)
            u1 = 1.0 - _uniform(z1)
            u2 = _uniform(z2)
            rad = np.sqrt(-2.0 * np.log(u1))
            g1 = rad * np.cos(2.0 * np.pi * u2)
            g2 = rad * np.sin(2.0 * np.pi * u2)
            out[r, j] = centroids[c, j] + noise * g1
            if j + 1 < dim:
                out[r, j + 1] = centroids[c, j + 1] + noise * g2
            j += 2


@parallel_kernel
@njit(cache=True, parallel=True)
def node_uniforms(seed, stream, start, out):
    """One uniform [0, 1) per node ``start ..`` (deterministic per node)."""
    for r in prange(out.shape[0]):
        st = _stream(seed, stream, start + r)
        st, z = _next(st)
        out[r] = _uniform(z)


@njit(cache=True)
def window_ends(counts, cap, max_nodes, out):
    """Split nodes ``0..N`` into windows of at most ``max_nodes`` consecutive nodes whose
    ``counts`` (int [N]) sum to at most ``cap`` (a node over ``cap`` alone in its
    window); the windows' ends go to ``out`` (int64, room for
    ``2 * sum(counts) // cap + N // max_nodes + 2``). Returns how many windows."""
    n = counts.shape[0]
    k = 0
    lo = 0
    while lo < n:
        acc = counts[lo]
        hi = lo + 1
        while hi < n and hi - lo < max_nodes and acc + counts[hi] <= cap:
            acc += counts[hi]
            hi += 1
        out[k] = hi
        k += 1
        lo = hi
    return k
