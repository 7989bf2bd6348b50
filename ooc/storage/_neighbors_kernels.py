"""numba kernels of the neighbour readers (:mod:`ooc.storage.neighbors`): expanding list
ranges into positions, picking the wanted pieces of pages read with O_DIRECT, and gathering
ids from memory or a memory map (``gather_ids`` is nogil: run from many threads, so the page
faults of one overlap with those of the others)."""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import prange

from ooc.core.threading_layer import parallel_kernel


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def expand_ranges(starts, offs, out):
    """out[offs[i]:offs[i+1]] = starts[i] + arange(offs[i+1]-offs[i])."""
    for i in prange(starts.shape[0]):
        s = starts[i]
        for j in range(offs[i + 1] - offs[i]):
            out[offs[i] + j] = s + j


@nb.njit(cache=True)
def mark_sectors(edge_pos, shift, piece_shift, mark):
    """Bit ``s`` of ``mark[p]`` (uint8, one per page of ``1 << shift`` values) set for
    every page ``p`` holding a wanted position in its piece ``s`` of ``1 << piece_shift``
    values (a piece of ``align`` bytes, a divisor of 4096 of at least 512: at most 8
    pieces a page; whole pages: bit 0). Serial: threads OR-ing bits into one byte would
    lose some."""
    within = (np.int64(1) << shift) - 1
    for e in range(edge_pos.shape[0]):
        pos = edge_pos[e]
        mark[pos >> shift] |= np.uint8(1 << ((pos & within) >> piece_shift))


@nb.njit(cache=True)
def sector_spans(mark, pages, align, lo, hi):
    """``[lo[k], hi[k])``: the bytes of page ``pages[k]`` from its first to its last marked
    piece (:func:`mark_sectors`), multiples of ``align``; ``lo``, ``hi`` int64
    [len(pages)], filled here."""
    for k in range(pages.shape[0]):
        bits = np.int64(mark[pages[k]])
        first = 0
        while not (bits >> first) & 1:
            first += 1
        last = 7
        while not (bits >> last) & 1:
            last -= 1
        lo[k] = first * align
        hi[k] = (last + 1) * align


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def extract_from_pages(edge_pos, pages, shift, vals, out, threads):
    """out[e] = value at edge_pos[e] for every e whose page is in ``pages`` (sorted);
    ``vals`` is the page buffer viewed as the index dtype, ``1 << shift`` values a page.

    The positions are cut into ``threads`` contiguous ranges; within one, a position on
    the page of the position before it (a node's draws lie in one list, ascending) or on
    the page after that one takes that page's slot without a search."""
    n = pages.shape[0]
    m = edge_pos.shape[0]
    if n == 0 or m == 0:
        return
    lo_page = pages[0]
    hi_page = pages[n - 1]
    within = (np.int64(1) << shift) - 1
    step = (m + threads - 1) // threads
    for t in prange(threads):
        last = -1  # the slot of the previous position's page (-1: none yet)
        for e in range(t * step, min(m, (t + 1) * step)):
            p = edge_pos[e] >> shift
            if p < lo_page or p > hi_page:
                continue
            if last >= 0 and pages[last] == p:
                slot = last
            elif last >= 0 and last + 1 < n and pages[last + 1] == p:
                slot = last + 1
            else:
                lo = 0
                hi = n
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if pages[mid] < p:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo >= n or pages[lo] != p:
                    continue
                slot = lo
            last = slot
            out[e] = vals[(slot << shift) + (edge_pos[e] & within)]


@parallel_kernel
@nb.njit(parallel=True, cache=True)
def gather_in_memory(edge_pos, indices, out):
    """out[e] = indices[edge_pos[e]] (positions within ``indices``: the sampler
    checks ``len(indices) >= indptr[-1]`` once)."""
    for e in prange(edge_pos.shape[0]):
        out[e] = indices[edge_pos[e]]


@nb.njit(nogil=True, cache=True)
def gather_ids(indices, edge_pos, out, start, end):
    """out[k] = indices[edge_pos[k]] for k in [start, end) (int32/int64 memmap)."""
    for k in range(start, end):
        out[k] = indices[edge_pos[k]]

