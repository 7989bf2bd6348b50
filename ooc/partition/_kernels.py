"""numba kernels shared by the partitioners: degrees, hashing, ownership,
replica bookkeeping and the per-partition edge extraction.

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
def hash_nodes(n, seed, p):
    out = np.empty(n, dtype=np.int32)
    for v in range(n):
        out[v] = hash_node(v, seed, p)
    return out


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
def local_chunk(indptr, a, first_dst, src, owner, q, g2l, out, pos):
    """Copy the edges of chunk into partition ``q``'s local indices.

    Edges whose destination is owned by ``q`` are written, in stream (CSC)
    order, as ``g2l[src]`` into ``out`` starting at ``pos``; returns the new
    position. Used with an unshuffled stream so the output is the CSC of
    the owned nodes in ascending global id.
    """
    dst = first_dst
    for i in range(src.shape[0]):
        k = a + i
        while indptr[dst + 1] <= k:
            dst += 1
        if owner[dst] == q:
            out[pos] = g2l[src[i]]
            pos += 1
    return pos


@nb.njit(**_NB)
def replicas_of(bits, q):
    """Global ids of the replicas of partition ``q`` (ascending)."""
    n = bits.shape[0]
    w = q >> 6
    m = np.uint64(1) << np.uint64(q & 63)
    cnt = 0
    for v in range(n):
        if bits[v, w] & m:
            cnt += 1
    out = np.empty(cnt, dtype=np.int64)
    j = 0
    for v in range(n):
        if bits[v, w] & m:
            out[j] = v
            j += 1
    return out
