"""numba kernels for Belady changesets and cache-policy miss counting.

Keys: a cache candidate's priority is the triple
``(next_iteration, flag, local_id)`` (smaller = kept first), where ``flag``
is 0 for an entry that was cached before the current step and 1 for a miss
of the current step. All keys are distinct, so every selection is
deterministic. Entries that are never accessed again have
``next_iteration == S`` and are never kept.
"""
from __future__ import annotations

import numba
import numpy as np

# -- trace preprocessing -----------------------------------------------------


@numba.njit(cache=True, nogil=True)
def next_use(lid: np.ndarray, ptr: np.ndarray, M: int):
    """Next access iteration of every occurrence (backward scan).

    Args:
        lid: int64 [T] local ids in ``[0, M)``, batches concatenated.
        ptr: int64 [S+1] batch offsets into ``lid``.
    Returns:
        (nxt int64 [T] with ``S`` for "never again", index of the first
        duplicate id inside a batch or -1, first int32 [M]: each id's first batch, ``S``
        where it has none).
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    last = np.full(M, S, np.int32)  # S < 2**31 - 1 (checked by the caller)
    nxt = np.empty(T, np.int64)
    for i in range(S - 1, -1, -1):
        for p in range(ptr[i], ptr[i + 1]):
            x = lid[p]
            if last[x] == i:
                return nxt, p, last
            nxt[p] = last[x]
            last[x] = i
    return nxt, -1, last


# -- LRU stack distances -------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def lru_stack_distances(lid: np.ndarray, ptr: np.ndarray, M: int) -> np.ndarray:
    """Batch-granular LRU stack distance of every access.

    The recency stamp of an id is the flat trace position of its last access;
    the cache of capacity K during batch i holds the K ids with the largest
    stamps among accesses before batch i. An access is a hit iff its distance
    (number of distinct ids with a larger stamp, counting only batches < i)
    is < K. Cold accesses get ``2**62``.

    Returns: int64 [T].
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    last = np.full(M, -1, np.int64)
    tree = np.zeros(T + 1, np.int64)  # Fenwick over flat positions
    dist = np.empty(T, np.int64)
    big = np.int64(1) << 62
    for i in range(S):
        a = ptr[i]
        b = ptr[i + 1]
        # prefix(a) = number of "latest" markers at positions < a
        tot = 0
        q = a
        while q > 0:
            tot += tree[q]
            q -= q & (-q)
        for p in range(a, b):
            lp = last[lid[p]]
            if lp < 0:
                dist[p] = big
            else:
                s = 0
                q = lp + 1
                while q > 0:
                    s += tree[q]
                    q -= q & (-q)
                dist[p] = tot - s
        for p in range(a, b):
            x = lid[p]
            lp = last[x]
            if lp >= 0:
                q = lp + 1
                while q <= T:
                    tree[q] -= 1
                    q += q & (-q)
            q = p + 1
            while q <= T:
                tree[q] += 1
                q += q & (-q)
            last[x] = p
    return dist


# -- bucket-queue Belady (the CPU changeset path) ------------------------------
#
# Keys are (next use, flag, id) with next use an integer batch index, so the
# cached entries are kept in buckets by next use. Bucket ``n`` holds ids of
# batch ``n`` only, so it lives in that batch's slot of a flat array
# (``mem[ptr[n]:ptr[n] + cnt[n]]``, appends only, no pointer chasing), with a
# bit in a bitmap of non-empty buckets; ``st[x]`` is 0 (not cached), 1
# (cached), 2 (inserted by the current step, flag 1: a miss or a page-mate) or
# 3 (a miss of the current step left out). Bucket ``i`` holds
# exactly the hits of batch ``i`` and is emptied whole at step ``i``;
# evictions take whole buckets from the top (highest next use) and at most
# one bucket partially, chosen by the tie-break with a linear-time partition.
# Each access costs O(1), a partial bucket O(its size) <= the size of that
# future batch, and finding the top bucket O(1 + gap / 64).


@numba.njit(cache=True, inline="always")
def _bit_set(bits, n):
    bits[n >> 6] |= np.uint64(1) << np.uint64(n & 63)


@numba.njit(cache=True, inline="always")
def _bit_clear(bits, n):
    bits[n >> 6] &= ~(np.uint64(1) << np.uint64(n & 63))


@numba.njit(cache=True)
def _top_bucket(bits, cnt, n):
    """Highest non-empty bucket <= n (its bit set in ``bits``), or -1."""
    if n < 0 or cnt[n] > 0:
        return n
    w = n >> 6
    r = n & 63
    word = bits[w]
    if r != 63:
        word &= (np.uint64(1) << np.uint64(r + 1)) - np.uint64(1)
    while word == 0:
        w -= 1
        if w < 0:
            return -1
        word = bits[w]
    hb = 0
    for sh in (32, 16, 8, 4, 2, 1):
        if (word >> np.uint64(sh)) != 0:
            word >>= np.uint64(sh)
            hb += sh
    return (w << 6) + hb


@numba.njit(cache=True, inline="always")
def _push(mem, ptr, cnt, bits, n, x):
    mem[ptr[n] + cnt[n]] = x
    if cnt[n] == 0:
        _bit_set(bits, n)
    cnt[n] += 1


@numba.njit(cache=True, inline="always")
def _gather(mem, base, c, st, want, sc):
    """Copy the ids of ``mem[base:base + c]`` with ``st == want`` to ``sc``; returns the count."""
    m = 0
    for j in range(base, base + c):
        x = mem[j]
        if st[x] == want:
            sc[m] = x
            m += 1
    return m


@numba.njit(cache=True, nogil=True)
def belady_buckets(lid: np.ndarray, nxt: np.ndarray, ptr: np.ndarray, M: int, K: int, record: bool,
                   mem: np.ndarray, grp_of: np.ndarray, gptr: np.ndarray, gids: np.ndarray,
                   mate_frac: float, first: np.ndarray):
    """Per-step Belady with a bucket queue over next-use batches.

    C_0 = the K ids with the smallest (first use, id); after batch i the cache
    becomes the K candidates of C_i ∪ ids_i with the smallest keys (finite
    next use only; keys in the module docstring). O(T) plus the partial
    buckets.

    Bucket n holds the cached ids next used in batch n (``mem[ptr[n]:][:cnt[n]]``,
    bit n of ``bits`` set while non-empty); ``st[x]``: 0 out, 1 cached, 2 admitted now,
    3 a miss of this step left out.

    Page-mates (``gptr`` non-empty): after batch i's misses, the ids of the trace that
    share a page with one of them, are not cached, are not in batch i and are used again
    join the candidates too (key flag 1, as misses): their rows come with the pages the
    misses read. At most ``floor(mate_frac * |ids_i|)`` of them a step, those with the
    smallest ``(next use, id)``. A surviving page-mate is recorded after the step's
    admitted misses, in id order, at position ``|ids_i| + j`` (the j-th of them).

    Args:
        lid, nxt, ptr: as for :func:`next_use` (``nxt[p] == S``: never again).
        M: local id range; K: capacity; record: produce the changesets;
        mem: int32 or int64 [T] scratch (holds local ids).
        grp_of: int32 [M] page group of each local id (-1: none, or alone on its page);
        gptr: int64 [P+1], gids: int64 [<=M]: group g's local ids are
            ``gids[gptr[g]:gptr[g+1]]`` (ascending). ``gptr`` empty: no page-mates.
        mate_frac: page-mates a step, as a fraction of the batch's ids.
        first: int32 [M] each id's first batch (:func:`next_use`'s), with page-mates;
            advanced in place to each id's next use after the current step.
    Returns:
        (init [<=K] sorted local ids, in_ids local [n_in] (per step in batch
        order, then page-mates), in_pos int64 [n_in], in_ptr [S+1], out_ids local [n_out] (per
        step sorted), out_ptr [S+1], misses int64 [S], out_later bool [n_out]),
        int64 but ``out_later``: True where the evicted id is accessed again in
        the trace (evicted to make room), False where it leaves after its last
        access. Without ``record`` only ``misses`` is filled.
    """
    S = ptr.shape[0] - 1
    T = lid.shape[0]
    st = np.zeros(M, np.uint8)
    cnt = np.zeros(S + 1, np.int64)
    bits = np.zeros((S >> 6) + 1, np.uint64)
    maxb = 0
    for i in range(S):
        maxb = max(maxb, ptr[i + 1] - ptr[i])
    sc = np.empty(maxb, np.int64)
    hit = np.empty(maxb, np.bool_)
    init, size, top = _first_cache(lid, ptr, K, st, cnt, bits, mem, sc)
    mates = gptr.shape[0] > 1
    cur = first  # with page-mates: each id's next use after the current step
    if mates:
        seen = np.full(gptr.shape[0] - 1, -1, np.int64)
        gmax = 0
        for g in range(gptr.shape[0] - 1):
            gmax = max(gmax, gptr[g + 1] - gptr[g])
        co = np.empty(min(gids.shape[0], maxb * gmax), np.int64)
        cokey = np.empty(co.shape[0], np.int64)
    else:
        seen = np.empty(0, np.int64)
        co = np.empty(0, np.int64)
        cokey = np.empty(0, np.int64)
    n_rec = (T + (int(mate_frac * T) + S if mates else 0)) if record else 0
    ins = np.empty(n_rec, np.int64)
    inpos = np.empty(n_rec, np.int64)
    outs = np.empty(n_rec + (K if record else 0), np.int64)
    out_later = np.empty(outs.shape[0], np.bool_)
    in_ptr = np.zeros(S + 1, np.int64)
    out_ptr = np.zeros(S + 1, np.int64)
    misses = np.empty(S, np.int64)
    nin = 0
    nout = 0
    for i in range(S):
        o0 = nout
        nh, size, top, nout = _serve_hits(lid, nxt, ptr, i, S, st, cnt, bits, mem, hit,
                                          record, outs, nout, size, top)
        misses[i] = (ptr[i + 1] - ptr[i]) - nh
        dropped = nout  # the hits' outs (no next use) come first, then the evictions
        if K > 0:
            size, top = _admit_misses(lid, nxt, ptr, i, S, K, st, cnt, bits, mem, hit,
                                      size, top)
            nco = 0
            if mates:
                cap = int(mate_frac * (ptr[i + 1] - ptr[i]))
                nco = _page_mates(lid, nxt, ptr, i, S, M, st, hit, cur, grp_of, gptr, gids,
                                  seen, cap, co, cokey)
                size, top = _admit_mates(co, nco, cur, K, st, cnt, bits, mem, ptr, size, top)
            size, top, nout = _evict_excess(ptr, M, K, st, cnt, bits, mem, sc, record, outs,
                                            nout, size, top)
            nin = _insert_survivors(lid, ptr, i, st, hit, record, ins, inpos, nin)
            if nco:
                nin = _insert_mates(co, nco, ptr[i + 1] - ptr[i], st, record, ins, inpos, nin)
        if record:
            _sort_outs(outs, out_later, o0, dropped, nout)
        in_ptr[i + 1] = nin
        out_ptr[i + 1] = nout
    return init, ins[:nin], inpos[:nin], in_ptr, outs[:nout], out_ptr, misses, out_later[:nout]


@numba.njit(cache=True)
def _sort_outs(outs, out_later, o0, dropped, nout):
    """Sort one step's evicted ids ``outs[o0:nout]`` and fill ``out_later`` beside them
    (False for ``outs[o0:dropped]``, left by their last access): the flag rides in the low
    bit of ``2 * id + flag`` through the sort."""
    for j in range(o0, nout):
        outs[j] = 2 * outs[j] + (j >= dropped)
    if nout - o0 > 1:
        outs[o0:nout].sort()
    for j in range(o0, nout):
        out_later[j] = (outs[j] & 1) == 1
        outs[j] >>= 1


@numba.njit(cache=True)
def _first_cache(lid, ptr, K, st, cnt, bits, mem, sc):
    """C_0: the first K ids in order of first use, ties by id, queued in the bucket of
    their first batch. Returns ``(init, size, top)``: the ids sorted (int64 [<=K]), how
    many, and the highest bucket used (-1: none)."""
    S = ptr.shape[0] - 1
    size = 0
    top = -1
    init = np.empty(min(K, lid.shape[0]), np.int64)
    i = 0
    while i < S and size < K:
        nnew = 0
        for p in range(ptr[i], ptr[i + 1]):
            x = lid[p]
            if st[x] == 0:
                sc[nnew] = x
                nnew += 1
        if nnew > K - size:
            sc[:nnew].sort()
            nnew = K - size
        for q in range(nnew):
            x = sc[q]
            st[x] = 1
            _push(mem, ptr, cnt, bits, i, x)
            init[size] = x
            size += 1
        if nnew:
            top = i
        i += 1
    return np.sort(init[:size]), size, top


@numba.njit(cache=True)
def _serve_hits(lid, nxt, ptr, i, S, st, cnt, bits, mem, hit, record, outs, nout, size, top):
    """Batch i's hits (bucket i) move to the bucket of their next use, or leave the cache
    when there is none; ``hit[p - ptr[i]]`` marks them. Returns ``(hits, size, top,
    nout)``; bucket i is empty after."""
    nh = 0
    a = ptr[i]
    for p in range(a, ptr[i + 1]):
        x = lid[p]
        h = st[x] != 0
        hit[p - a] = h
        if h:
            nh += 1
            n = nxt[p]
            if n >= S:
                st[x] = 0
                size -= 1
                if record:
                    outs[nout] = x
                    nout += 1
            else:
                _push(mem, ptr, cnt, bits, n, x)
                if n > top:
                    top = n
    cnt[i] = 0
    _bit_clear(bits, i)
    return nh, size, top, nout


@numba.njit(cache=True)
def _admit_misses(lid, nxt, ptr, i, S, K, st, cnt, bits, mem, hit, size, top):
    """Batch i's misses with a next use become candidates (st 2) in its bucket; a miss
    used after every entry of a full cache is bypassed at once (st 3, like a miss with no
    next use, until :func:`_insert_survivors`). Returns ``(size, top)``
    (size may exceed K: :func:`_evict_excess` brings it back)."""
    a = ptr[i]
    for p in range(a, ptr[i + 1]):
        if hit[p - a]:
            continue
        n = nxt[p]
        x = lid[p]
        ok = False
        if n < S:
            ok, size, top = _offer(x, n, K, st, cnt, bits, mem, ptr, size, top)
        if not ok:
            st[x] = 3  # a miss left out (until the step ends): not a page-mate either
    return size, top


@numba.njit(cache=True, inline="always")
def _offer(x, n, K, st, cnt, bits, mem, ptr, size, top):
    """Candidate ``x`` with next use ``n`` (< S) joins bucket ``n`` as a new entry (st 2),
    unless the cache is full and every entry is used sooner (bypassed at once). Returns
    ``(admitted, size, top)``."""
    if size >= K:
        top = _top_bucket(bits, cnt, top)
        if n > top:
            return False, size, top
    st[x] = 2
    _push(mem, ptr, cnt, bits, n, x)
    if n > top:
        top = n
    return True, size + 1, top


@numba.njit(cache=True)
def _evict_excess(ptr, M, K, st, cnt, bits, mem, sc, record, outs, nout, size, top):
    """Evict the largest keys until ``size <= K``: whole buckets from the top, then part of
    one (new entries first, larger ids first). Evicted cached entries (st 1) are recorded
    in ``outs``. Returns ``(size, top, nout)``."""
    while size > K:
        n = _top_bucket(bits, cnt, top)
        top = n
        excess = size - K
        c = cnt[n]
        base = ptr[n]
        if c <= excess:
            for j in range(base, base + c):
                x = mem[j]
                if st[x] == 1 and record:
                    outs[nout] = x
                    nout += 1
                st[x] = 0
            cnt[n] = 0
            _bit_clear(bits, n)
            size -= c
            continue
        n2 = _gather(mem, base, c, st, 2, sc)
        if n2 >= excess:
            thr2 = np.partition(sc[:n2], n2 - excess)[n2 - excess]
            thr1 = M  # the cached entries all stay
        else:
            thr2 = -1  # every new entry goes
            n1 = _gather(mem, base, c, st, 1, sc)
            e1 = excess - n2
            thr1 = np.partition(sc[:n1], n1 - e1)[n1 - e1]
        keep = base
        for j in range(base, base + c):
            x = mem[j]
            s = st[x]
            if (s == 2 and x >= thr2) or (s == 1 and x >= thr1):
                if s == 1 and record:
                    outs[nout] = x
                    nout += 1
                st[x] = 0
            else:
                mem[keep] = x
                keep += 1
        cnt[n] = c - excess
        size = K
    return size, top, nout


@numba.njit(cache=True)
def _insert_survivors(lid, ptr, i, st, hit, record, ins, inpos, nin):
    """Batch i's admitted misses that survived eviction enter the cache (st 2 -> 1),
    recorded with their positions in the batch. Returns ``nin``."""
    a = ptr[i]
    for p in range(a, ptr[i + 1]):
        if hit[p - a]:
            continue
        x = lid[p]
        if st[x] == 2:
            st[x] = 1
            if record:
                ins[nin] = x
                inpos[nin] = p - a
                nin += 1
        elif st[x] == 3:
            st[x] = 0
    return nin


@numba.njit(cache=True)
def _page_mates(lid, nxt, ptr, i, S, M, st, hit, cur, grp_of, gptr, gids, seen, cap, co, cokey):
    """Batch i's page-mates into ``co`` (in no order): the ids of the groups of its
    misses' pages that are not cached, not in the batch (st 0) and used again, at most
    ``cap`` of them, the smallest ``(next use, id)``. Advances ``cur`` past batch i.
    Returns how many."""
    a = ptr[i]
    for p in range(a, ptr[i + 1]):
        cur[lid[p]] = nxt[p]
    if cap <= 0:
        return 0
    nc = 0
    for p in range(a, ptr[i + 1]):
        if hit[p - a]:
            continue
        g = grp_of[lid[p]]
        if g < 0 or seen[g] == i:  # alone on its page, or the page already scanned
            continue
        seen[g] = i
        for q in range(gptr[g], gptr[g + 1]):
            y = gids[q]
            if st[y] != 0 or cur[y] >= S:
                continue
            co[nc] = y
            cokey[nc] = np.int64(cur[y]) * M + y
            nc += 1
    if nc > cap:
        thr = np.partition(cokey[:nc], cap - 1)[cap - 1]
        m = 0
        for j in range(nc):
            if cokey[j] <= thr:
                co[m] = co[j]
                m += 1
        nc = m
    return nc


@numba.njit(cache=True)
def _admit_mates(co, nco, cur, K, st, cnt, bits, mem, ptr, size, top):
    """The page-mates ``co[:nco]`` become candidates (st 2) in the bucket of their next use,
    bypassed as misses are (the kept set is the K smallest keys whatever the order they
    come in). Returns ``(size, top)``."""
    for j in range(nco):
        y = co[j]
        _, size, top = _offer(y, np.int64(cur[y]), K, st, cnt, bits, mem, ptr, size, top)
    return size, top


@numba.njit(cache=True)
def _insert_mates(co, nco, nb, st, record, ins, inpos, nin):
    """The page-mates that survived eviction enter the cache (st 2 -> 1), recorded in id
    order at positions ``nb, nb + 1, ...`` after the batch's rows. Returns ``nin``."""
    k = 0
    for j in range(nco):
        y = co[j]
        if st[y] == 2:
            st[y] = 1
            co[k] = y
            k += 1
    if record:
        co[:k].sort()
        for j in range(k):
            ins[nin] = co[j]
            inpos[nin] = nb + j
            nin += 1
    return nin


@numba.njit(cache=True, nogil=True)
def belady_simulate(lid: np.ndarray, nxt: np.ndarray, ptr: np.ndarray, M: int, K: int,
                    record: bool):
    """:func:`belady_buckets` with its own scratch and no page-mates (same result)."""
    none = np.empty(0, np.int64)
    return belady_buckets(lid, nxt, ptr, M, K, record, np.empty(lid.shape[0], np.int64),
                          np.empty(0, np.int32), none, none, 0.0, np.empty(0, np.int32))
