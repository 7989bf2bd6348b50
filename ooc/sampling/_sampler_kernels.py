"""numba kernels of the neighbour sampler (see :mod:`ooc.sampling.sampler`).

Randomness is counter based: the choice for node ``v`` at hop ``h`` of a batch
is a pure function of ``(batch_seed, h, v, degree)`` (splitmix64 of those),
so results never depend on thread scheduling, on batch grouping or on where
the neighbour list comes from. :func:`py_node_key` / :func:`py_select` are the
pure-Python twins used by the test reference.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import prange

from ooc.core._random_kernels import GOLDEN as _GOLDEN
from ooc.core._random_kernels import mix64
from ooc.core.threading_layer import parallel_kernel

_ONE = np.uint64(1)
_SMALL_K = 64  # Floyd membership by linear scan up to this many picks


@nb.njit(inline="always", cache=True)
def node_key(batch_seed, hop, v, deg):
    z = mix64(np.uint64(batch_seed) + _GOLDEN)
    z = mix64(z ^ (np.uint64(hop) + _GOLDEN))
    z = mix64(z ^ np.uint64(v))
    return mix64(z ^ np.uint64(deg))


@nb.njit(cache=True)
def select_positions(key, d, k, out, o):
    """Write ``k`` distinct positions in ``[0, d)`` to ``out[o:o+k]``, ascending.

    Robert Floyd's algorithm: for ``j = d-k .. d-1`` draw ``t`` uniform in
    ``[0, j]``; take ``t`` unless already taken, else ``j``. Draw ``n`` uses
    ``mix64(key + (n+1) * golden)``.
    """
    if k <= 0:
        return
    if k >= d:
        for i in range(d):
            out[o + i] = i
        return
    if k <= _SMALL_K:
        n = 0
        for j in range(d - k, d):
            x = mix64(key + np.uint64(n + 1) * _GOLDEN)
            t = np.int64(x % np.uint64(j + 1))
            for q in range(n):
                if out[o + q] == t:
                    t = j
                    break
            out[o + n] = t
            n += 1
        # insertion sort (k is small)
        for a in range(1, k):
            val = out[o + a]
            b = a - 1
            while b >= 0 and out[o + b] > val:
                out[o + b + 1] = out[o + b]
                b -= 1
            out[o + b + 1] = val
        return
    cap = 16
    while cap < 2 * k:
        cap *= 2
    mask = cap - 1
    table = np.full(cap, -1, dtype=np.int64)
    n = 0
    for j in range(d - k, d):
        x = mix64(key + np.uint64(n + 1) * _GOLDEN)
        t = np.int64(x % np.uint64(j + 1))
        h = np.int64(mix64(np.uint64(t)) & np.uint64(mask))
        while table[h] != -1 and table[h] != t:
            h = (h + 1) & mask
        if table[h] == t:  # taken: take j (never taken yet, all picks < j)
            t = j
            h = np.int64(mix64(np.uint64(t)) & np.uint64(mask))
            while table[h] != -1:
                h = (h + 1) & mask
        table[h] = t
        out[o + n] = t
        n += 1
    out[o:o + k] = np.sort(out[o:o + k])


@nb.njit(inline="always", cache=True)
def list_start(base, rel, v):
    """``indptr[v]`` from its compact form (:class:`~ooc.storage.offsets.NodeOffsets`)."""
    return base[v >> 6] + np.int64(rel[v])


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def hop_counts(front, base, rel, fanout, counts):
    """counts[i] = number of neighbours sampled for front[i]."""
    for i in prange(front.shape[0]):
        v = front[i]
        d = list_start(base, rel, v + 1) - list_start(base, rel, v)
        counts[i] = d if (fanout < 0 or d < fanout) else fanout


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def hop_select(front, front_batch, batch_seeds, hop, base, rel, offsets, rel_pos, edge_pos):
    """Fill the sampled positions of every frontier node (relative and absolute)."""
    for i in prange(front.shape[0]):
        v = front[i]
        start = list_start(base, rel, v)
        d = list_start(base, rel, v + 1) - start
        o = offsets[i]
        k = offsets[i + 1] - o
        if k == 0:
            continue
        key = node_key(batch_seeds[front_batch[i]], hop, v, d)
        select_positions(key, d, k, rel_pos, o)
        for e in range(o, o + k):
            edge_pos[e] = start + rel_pos[e]


@nb.njit(inline="always", cache=True)
def _slot(u, mask):
    return np.int64(mix64(np.uint64(u)) & np.uint64(mask))


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def check_seeds(nodes, ptr, num_nodes, bad):
    """bad[b] = 1 when batch b has a duplicate seed, 2 when one is out of range."""
    for b in prange(ptr.shape[0] - 1):
        a0 = ptr[b]
        n = ptr[b + 1] - a0
        cap = 16
        while cap < 2 * n:
            cap *= 2
        mask = cap - 1
        keys = np.full(cap, -1, dtype=np.int64)
        for i in range(n):
            u = nodes[a0 + i]
            if u < 0 or u >= num_nodes:
                bad[b] = 2
                break
            h = _slot(u, mask)
            while keys[h] != -1 and keys[h] != u:
                h = (h + 1) & mask
            if keys[h] == u:
                bad[b] = 1
                break
            keys[h] = u


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def hop_dedup(all_nodes, all_ptr, front_ptr, offsets, nbr, num_nodes, src, dst, new_nodes,
              new_cnt, bad):
    """Map sampled neighbours to local ids, appending unseen ones in frontier order.

    For batch b the frontier is the last ``front_ptr[b+1]-front_ptr[b]`` of its
    ``all_ptr[b+1]-all_ptr[b]`` nodes so far. New nodes of batch b go to
    ``new_nodes[offsets[front_ptr[b]]:]``; their count to ``new_cnt[b]``.
    Every neighbour id is bounds-checked: ``bad[b]`` (preset to -1) gets the
    position in ``nbr`` of batch b's first id outside ``[0, num_nodes)``, and
    that batch stops there.
    """
    for b in prange(all_ptr.shape[0] - 1):
        a0 = all_ptr[b]
        n0 = all_ptr[b + 1] - a0
        f0 = front_ptr[b]
        f1 = front_ptr[b + 1]
        fcnt = f1 - f0
        e0 = offsets[f0]
        ne = offsets[f1] - e0
        if ne == 0:
            new_cnt[b] = 0
            continue
        cap = 16
        while cap < 2 * (n0 + ne):
            cap *= 2
        mask = cap - 1
        keys = np.full(cap, -1, dtype=np.int64)
        vals = np.empty(cap, dtype=np.int64)
        for i in range(n0):
            u = all_nodes[a0 + i]
            h = _slot(u, mask)
            while keys[h] != -1:
                h = (h + 1) & mask
            keys[h] = u
            vals[h] = i
        cnt = 0
        bad_e = -1
        for i in range(f0, f1):
            ldst = n0 - fcnt + (i - f0)
            for e in range(offsets[i], offsets[i + 1]):
                u = nbr[e]
                if u < 0 or u >= num_nodes:
                    bad_e = e
                    break
                h = _slot(u, mask)
                lid = -1
                while True:
                    kk = keys[h]
                    if kk == u:
                        lid = vals[h]
                        break
                    if kk == -1:
                        lid = n0 + cnt
                        keys[h] = u
                        vals[h] = lid
                        new_nodes[e0 + cnt] = u
                        cnt += 1
                        break
                    h = (h + 1) & mask
                src[e] = lid
                dst[e] = ldst
            if bad_e >= 0:
                break
        bad[b] = bad_e
        new_cnt[b] = cnt


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def merge_nodes(all_nodes, all_ptr, new_nodes, new_src, new_cnt, out_nodes, out_ptr, front, front_ptr):
    """Append each batch's new nodes to its node list; the new ones become the frontier.

    ``new_src[b]`` is where batch b's new nodes start in ``new_nodes``.
    """
    for b in prange(all_ptr.shape[0] - 1):
        a0 = all_ptr[b]
        n0 = all_ptr[b + 1] - a0
        o = out_ptr[b]
        for i in range(n0):
            out_nodes[o + i] = all_nodes[a0 + i]
        s = new_src[b]
        fo = front_ptr[b]
        for i in range(new_cnt[b]):
            u = new_nodes[s + i]
            out_nodes[o + n0 + i] = u
            front[fo + i] = u


# ---------------------------------------------------------------- pure Python twins

_MASK = (1 << 64) - 1


def py_mix64(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def py_node_key(batch_seed: int, hop: int, v: int, deg: int) -> int:
    g = 0x9E3779B97F4A7C15
    z = py_mix64((batch_seed & _MASK) + g)
    z = py_mix64(z ^ ((hop + g) & _MASK))
    z = py_mix64(z ^ (v & _MASK))
    return py_mix64(z ^ (deg & _MASK))


def py_select(key: int, d: int, k: int) -> list[int]:
    """Floyd's sample of ``k`` of ``range(d)``, ascending (reference twin)."""
    if k >= d:
        return list(range(d))
    chosen: list[int] = []
    seen: set[int] = set()
    for n, j in enumerate(range(d - k, d)):
        x = py_mix64(key + (n + 1) * 0x9E3779B97F4A7C15)
        t = x % (j + 1)
        if t in seen:
            t = j
        seen.add(t)
        chosen.append(t)
    return sorted(chosen)
