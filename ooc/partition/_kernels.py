"""numba kernels shared by the partitioners: degrees, hashing, ownership,
replica bookkeeping, the halo BFS and the per-partition edge extraction.

Every kernel that walks a chunk of the CSC edge stream takes
``(indptr, a, first_dst, src)``: position ``a + i`` has source ``src[i]`` and
a destination found by advancing ``dst`` while ``indptr[dst + 1] <= k``.
"""
from __future__ import annotations

import numba as nb
import numpy as np

_NB = dict(nogil=True, cache=True)


@nb.njit(**_NB)
def add_out_degrees(deg, src):
    for i in range(src.shape[0]):
        deg[src[i]] += 1


@nb.njit(**_NB)
def expand_dst(indptr, a, first_dst, out):
    """Destinations of CSC positions ``a .. a+len(out)`` into ``out``."""
    dst = first_dst
    for i in range(out.shape[0]):
        while indptr[dst + 1] <= a + i:
            dst += 1
        out[i] = dst


@nb.njit(**_NB)
def mix64(x):
    """splitmix64 finaliser: a good 64-bit hash of an integer."""
    x = np.uint64(x)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@nb.njit(**_NB)
def hash_node(v, seed, p):
    return np.int64(mix64(np.uint64(v) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed))
                    % np.uint64(p))


@nb.njit(**_NB)
def vote(cand, cnt, v, part):
    """Boyer-Moore majority vote step: node ``v`` sees one edge in ``part``."""
    if cnt[v] == 0:
        cand[v] = part
        cnt[v] = 1
    elif cand[v] == part:
        cnt[v] += 1
    else:
        cnt[v] -= 1


@nb.njit(**_NB)
def finish_owner(cand_in, cand_out, seed, p):
    """Owner of every node from the majority votes.

    In-edge majority winner when the node has in-edges; else the out-edge
    majority winner; else (isolated) a hash of the node id.
    """
    n = cand_in.shape[0]
    owner = np.empty(n, dtype=np.int32)
    for v in range(n):
        if cand_in[v] >= 0:
            owner[v] = cand_in[v]
        elif cand_out[v] >= 0:
            owner[v] = cand_out[v]
        else:
            owner[v] = hash_node(v, seed, p)
    return owner


@nb.njit(**_NB)
def replica_chunk(indptr, a, first_dst, src, owner, bits, cut, edges_local):
    """Mark (src, owner[dst]) replica pairs in ``bits`` (uint64 [N, words]).

    ``cut[0]`` counts edges whose endpoints have different owners;
    ``edges_local[q]`` counts edges whose destination is owned by q.
    """
    dst = first_dst
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        u = src[i]
        q = owner[dst]
        edges_local[q] += 1
        if owner[u] != q:
            cut[0] += 1
            bits[u, q >> 6] |= np.uint64(1) << np.uint64(q & 63)


@nb.njit(**_NB)
def popcount_total(bits):
    n, words = bits.shape
    total = 0
    for v in range(n):
        for w in range(words):
            x = bits[v, w]
            while x:
                x &= x - np.uint64(1)
                total += 1
    return total


@nb.njit(**_NB)
def replica_counts(bits, p):
    """Per partition, the number of replicas (popcount per bit column)."""
    n, words = bits.shape
    out = np.zeros(p, dtype=np.int64)
    for v in range(n):
        for w in range(words):
            x = bits[v, w]
            while x:
                low = x & (~x + np.uint64(1))
                q = w * 64
                y = low
                while y > np.uint64(1):
                    y >>= np.uint64(1)
                    q += 1
                out[q] += 1
                x ^= low
    return out


@nb.njit(**_NB)
def replicas_of(bits, q, like):
    """Global ids of the replicas of partition ``q`` (ascending), in ``like``'s dtype (the
    dataset's index dtype)."""
    n = bits.shape[0]
    w = q >> 6
    m = np.uint64(1) << np.uint64(q & 63)
    cnt = 0
    for v in range(n):
        if bits[v, w] & m:
            cnt += 1
    out = np.empty(cnt, dtype=like.dtype)
    j = 0
    for v in range(n):
        if bits[v, w] & m:
            out[j] = v
            j += 1
    return out


@nb.njit(**_NB)
def mark_halo_chunk(indptr, a, first_dst, src, layer, h):
    """One hop of the halo BFS by in-edges over a chunk of the edge stream.

    ``layer`` (int64 [N]) holds the halo layer of every node present in the
    partition and -1 elsewhere; every edge ``s -> d`` with ``layer[d] == h-1``
    and ``layer[s] < 0`` sets ``layer[s] = h``. A node marked ``h`` here is
    not ``h-1``, so the marks of one pass do not cascade and the result does
    not depend on the chunk order. Returns the number of nodes marked.
    """
    dst = first_dst
    marked = 0
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        if layer[dst] == h - 1:
            s = src[i]
            if layer[s] < 0:
                layer[s] = h
                marked += 1
    return marked


@nb.njit(**_NB)
def nodes_by_layer(layer, hops):
    """Global ids of the present nodes ordered by (layer, id).

    ``layer``: int [N], the halo layer ``0..hops`` of every present node and
    -1 elsewhere. Returns [n_q] ids in ``layer``'s dtype: layer 0 ascending, then layer 1
    ascending, ... layer ``hops`` ascending.
    """
    counts = np.zeros(hops + 2, dtype=np.int64)
    for v in range(layer.shape[0]):
        if layer[v] >= 0:
            counts[layer[v] + 1] += 1
    for h in range(hops + 1):
        counts[h + 1] += counts[h]
    out = np.empty(counts[hops + 1], dtype=layer.dtype)
    for v in range(layer.shape[0]):
        h = layer[v]
        if h >= 0:
            out[counts[h]] = v
            counts[h] += 1
    return out


@nb.njit(**_NB)
def halo_local_chunk(indptr, a, first_dst, src, g2l, n_inner, local_indptr, out):
    """Scatter a chunk's edges into a partition's local CSC (any halo depth).

    ``g2l`` (int64 [N]) maps present nodes to local ids (-1 elsewhere); the
    nodes with local id ``< n_inner`` (layers ``0..H-1``) get their full
    in-neighbour list. The edge at CSC position ``k`` with destination ``d``
    goes to ``out[local_indptr[g2l[d]] + (k - indptr[d])]`` as ``g2l[src]``:
    the ``k - indptr[d]``-th entry of ``d``'s row, so every row keeps the
    source order whatever the order of the chunks. ``local_indptr``: int64
    [n_q + 1]. Returns the number of edges written.
    """
    dst = first_dst
    written = 0
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        loc = g2l[dst]
        if 0 <= loc < n_inner:
            out[local_indptr[loc] + (k - indptr[dst])] = g2l[src[i]]
            written += 1
    return written


@nb.njit(**_NB)
def refine_chunk(indptr, a, first_dst, src, owner, load, cap, cnt, touched, nt, moved):
    """One chunk of the refinement pass (see :mod:`ooc.partition.refine`).

    The stream must be in CSC order (unshuffled), so a node's in-neighbour
    list is contiguous; it may span chunks: ``cnt`` int64 [p] (in-neighbours
    per owning partition so far), ``touched`` int32 [p] and ``nt`` int64 [1]
    (partitions with a non-zero count) carry over to the next chunk. When a
    node's list is complete the node moves to the partition owning the most
    of its in-neighbours if that count is strictly larger than its own
    partition's and ``load[q] < cap`` (ties: the first partition met in the
    list). ``owner`` int32 [N] and ``load`` int64 [p] are updated in place;
    ``moved`` int64 [1] counts moves.
    """
    dst = first_dst
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        q = owner[src[i]]
        if cnt[q] == 0:
            touched[nt[0]] = q
            nt[0] += 1
        cnt[q] += 1
        if k + 1 == indptr[dst + 1]:  # the in-neighbour list of dst is complete
            cur = owner[dst]
            best = cur
            bc = cnt[cur]
            for j in range(nt[0]):
                t = touched[j]
                if cnt[t] > bc and load[t] < cap:
                    best = t
                    bc = cnt[t]
            for j in range(nt[0]):
                cnt[touched[j]] = 0
            nt[0] = 0
            if best != cur:
                owner[dst] = best
                load[cur] -= 1
                load[best] += 1
                moved[0] += 1


#: Bits of a key :func:`radix_order` sorts by per pass.
RADIX_BITS = 11


@nb.njit(**_NB)
def radix_order(values, out, tmp):
    """The stable ascending order of ``values`` (non-negative ints), by least significant
    digit first: ``out`` and ``tmp`` (int [n], the same dtype) are its two buffers, and the
    one returned holds the order, ``values[order]`` ascending."""
    n = values.shape[0]
    for i in range(n):
        out[i] = i
    top = 0
    for i in range(n):
        if values[i] > top:
            top = values[i]
    radix = 1 << RADIX_BITS
    mask = radix - 1
    counts = np.empty(radix + 1, dtype=np.int64)
    shift = 0
    while n and (shift == 0 or (top >> shift) > 0):
        counts[:] = 0
        for i in range(n):
            counts[((values[out[i]] >> shift) & mask) + 1] += 1
        for d in range(radix):
            counts[d + 1] += counts[d]
        for i in range(n):
            d = (values[out[i]] >> shift) & mask
            tmp[counts[d]] = out[i]
            counts[d] += 1
        out, tmp = tmp, out
        shift += RADIX_BITS
    return out
