"""Numba kernels of the direct reader: page planning and row extraction.

All kernels work on int64 page ids and byte offsets; ``PAGE`` is 4096.
They are pure functions of their inputs (no I/O) and are tested through
``ooc.storage.direct``.
"""
from __future__ import annotations

import numba as nb
import numpy as np

PAGE = 4096


@nb.njit(cache=True, nogil=True)
def plan_runs(pages, max_run_pages):
    """Group sorted unique ``pages`` into runs of consecutive pages.

    Returns ``(run_first_page, run_npages, run_slot, status)``: run ``j``
    reads pages ``run_first_page[j] .. + run_npages[j]`` into request slots
    ``run_slot[j] ..`` (slot k of the request is ``out[k*PAGE:(k+1)*PAGE]``).
    A run never exceeds ``max_run_pages``. ``status`` is 0, or 1 when
    ``pages`` is not strictly increasing, or 2 when a page id is negative.
    """
    n = pages.shape[0]
    first = np.empty(n, np.int64)
    npg = np.empty(n, np.int64)
    slot = np.empty(n, np.int64)
    nr = 0
    status = 0
    for k in range(n):
        p = pages[k]
        if p < 0:
            status = 2
            break
        if k > 0:
            q = pages[k - 1]
            if p <= q:
                status = 1
                break
            if p == q + 1 and npg[nr - 1] < max_run_pages:
                npg[nr - 1] += 1
                continue
        first[nr] = p
        npg[nr] = 1
        slot[nr] = k
        nr += 1
    return first[:nr], npg[:nr], slot[:nr], status


@nb.njit(cache=True, nogil=True)
def _sorted_unique(keys):
    """(unique sorted keys, index of each key in that list)."""
    n = keys.shape[0]
    order = np.argsort(keys, kind="mergesort")
    inv = np.empty(n, np.int64)
    uniq = np.empty(n, np.int64)
    nu = 0
    for j in range(n):
        i = order[j]
        k = keys[i]
        if nu == 0 or uniq[nu - 1] != k:
            uniq[nu] = k
            nu += 1
        inv[i] = nu - 1
    return uniq[:nu], inv


@nb.njit(cache=True, nogil=True)
def feature_pages(ids, rows_per_page, pages_per_row, num_rows):
    """Pages holding rows ``ids`` and, per id, the slot of its first page.

    ``rows_per_page > 0``: rows share pages; otherwise every row occupies
    ``pages_per_row`` whole pages. Returns ``(pages, slot, bad)`` where
    ``pages`` is sorted unique, ``slot[i]`` the index in ``pages`` of the
    first page of ``ids[i]``, and ``bad`` the position of the first id out
    of ``[0, num_rows)`` or -1.
    """
    n = ids.shape[0]
    for i in range(n):
        if ids[i] < 0 or ids[i] >= num_rows:
            return np.empty(0, np.int64), np.empty(0, np.int64), i
    if rows_per_page > 0:
        keys = np.empty(n, np.int64)
        for i in range(n):
            keys[i] = ids[i] // rows_per_page
        uniq, inv = _sorted_unique(keys)
        return uniq, inv, -1
    # whole-page rows: unique rows, each expands to pages_per_row pages
    urows, inv = _sorted_unique(ids.astype(np.int64))
    m = urows.shape[0]
    pages = np.empty(m * pages_per_row, np.int64)
    for j in range(m):
        base = urows[j] * pages_per_row
        for t in range(pages_per_row):
            pages[j * pages_per_row + t] = base + t
    slot = np.empty(n, np.int64)
    for i in range(n):
        slot[i] = inv[i] * pages_per_row
    return pages, slot, -1


@nb.njit(cache=True, nogil=True)
def extract_rows(buf, ids, slot, rows_per_page, row_bytes, out):
    """Copy row bytes from the page buffer: ``out[i] = row ids[i]``.

    ``buf`` uint8 page buffer, ``out`` uint8 [n, row_bytes].
    """
    n = ids.shape[0]
    for i in range(n):
        start = slot[i] * PAGE
        if rows_per_page > 0:
            start += (ids[i] % rows_per_page) * row_bytes
        out[i, :] = buf[start:start + row_bytes]


@nb.njit(cache=True, nogil=True)
def range_pages(starts, ends):
    """Pages covering byte ranges ``[starts[i], ends[i])``.

    Returns ``(pages, offsets, bad)``: ``pages`` sorted unique; range i's
    bytes sit at ``offsets[i] .. offsets[i] + ends[i] - starts[i]`` of the
    page buffer (its pages are consecutive in ``pages``, hence contiguous
    in the buffer). Empty ranges get offset 0. ``bad`` is the first range
    with ``start < 0`` or ``end < start``, else -1.
    """
    n = starts.shape[0]
    total = 0
    for i in range(n):
        s = starts[i]
        e = ends[i]
        if s < 0 or e < s:
            return np.empty(0, np.int64), np.empty(0, np.int64), i
        if e > s:
            total += (e - 1) // PAGE - s // PAGE + 1
    allp = np.empty(total, np.int64)
    t = 0
    for i in range(n):
        s = starts[i]
        e = ends[i]
        if e > s:
            for p in range(s // PAGE, (e - 1) // PAGE + 1):
                allp[t] = p
                t += 1
    allp.sort()
    nu = 0
    for j in range(total):
        if nu == 0 or allp[nu - 1] != allp[j]:
            allp[nu] = allp[j]
            nu += 1
    pages = allp[:nu].copy()
    offsets = np.zeros(n, np.int64)
    for i in range(n):
        s = starts[i]
        if ends[i] > s:
            k = np.searchsorted(pages, s // PAGE)
            offsets[i] = k * PAGE + s % PAGE
    return pages, offsets, -1


@nb.njit(cache=True, nogil=True)
def copy_runs(src, limit, offs, lens, bufs, out):
    """``out[bufs[i]:bufs[i]+lens[i]] = src[offs[i]:offs[i]+lens[i]]`` for every run.

    ``src`` uint8 (a file mapping), ``out`` uint8; ``offs``/``lens``/``bufs``
    int64 [n]. Returns the first run that ends past ``limit`` (not copied, nor
    any after it), else -1.
    """
    for i in range(offs.shape[0]):
        o = offs[i]
        n = lens[i]
        if o + n > limit:
            return i
        b = bufs[i]
        out[b:b + n] = src[o:o + n]
    return -1
