"""Numba kernels of the direct reader: read planning and row extraction.

All kernels work on int64 page ids and byte offsets; ``PAGE`` is 4096.
They are pure functions of their inputs (no I/O) and are tested through
``ooc.storage.direct``. A read plan is *runs*: run j reads ``lens[j]`` bytes
at file offset ``offs[j]`` into the target buffer at byte ``bufs[j]`` (int64
``[nruns]`` each, multiples of the read alignment: ``PAGE``, or the device's logical
block where the reader found ``O_DIRECT`` accepts it).

The planning kernels are short (mostly a sort of the ids: about 1 ms for a
batch of 6,500 ids on this 2-core machine under load) and keep the GIL:
after releasing it, taking it back from a busy Python thread can take up to
the interpreter's switch interval (5 ms), longer than the kernel itself.
``extract_rows`` moves megabytes and releases it.
"""
from __future__ import annotations

import numba as nb
import numpy as np

PAGE = 4096


@nb.njit(cache=True)
def plan_runs(pages, lo, hi, max_run_pages):
    """Runs reading sorted unique ``pages`` into consecutive slots of a page buffer.

    Slot k of the request is ``buffer[k*PAGE:(k+1)*PAGE]``; of page ``pages[k]`` only
    bytes ``[lo[k], hi[k])`` are wanted (int64 [n], multiples of the read alignment
    within ``[0, PAGE]``; empty arrays: whole pages). Adjacent pages are merged into one
    run of at most ``max_run_pages`` pages, which then also reads the bytes between
    their spans (one read instead of two). Returns ``(offs, lens, bufs, nbytes,
    status)`` (see the module docstring); ``nbytes`` is the bytes the runs read,
    ``status`` 0, or 1 when ``pages`` is not strictly increasing, or 2 when a page id is
    negative.
    """
    n = pages.shape[0]
    whole = lo.shape[0] == 0
    offs = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    bufs = np.empty(n, np.int64)
    nr = 0
    status = 0
    first = 0  # the first page of the open run
    nbytes = 0
    for k in range(n):
        p = pages[k]
        a = 0 if whole else lo[k]
        b = PAGE if whole else hi[k]
        if p < 0:
            status = 2
            break
        if k > 0:
            q = pages[k - 1]
            if p <= q:
                status = 1
                break
            if p == q + 1 and p - first < max_run_pages:
                end = p * PAGE + b
                nbytes += end - (offs[nr - 1] + lens[nr - 1])
                lens[nr - 1] = end - offs[nr - 1]
                continue
        first = p
        offs[nr] = p * PAGE + a
        lens[nr] = b - a
        bufs[nr] = k * PAGE + a
        nbytes += b - a
        nr += 1
    return offs[:nr], lens[:nr], bufs[:nr], nbytes, status


@nb.njit(cache=True)
def fill_gaps(pages, lo, hi, max_gap, limit):
    """``pages`` (sorted unique int64 [n]) with every gap of at most ``max_gap`` pages
    between two of them filled in, in file order while the total stays within ``limit``
    pages, so that :func:`plan_runs` reads both sides and the gap in one run: where a
    read's fixed cost exceeds the transfer of a few pages, fewer and larger reads take
    less of the device's time than the bytes they add.

    ``lo``/``hi``: the wanted bytes of each page (empty arrays: whole pages); a page
    added gets ``[0, PAGE)``. Returns ``(pages2, lo2, hi2, pos)``: ``pos[k]`` is the
    index of ``pages[k]`` in ``pages2``. Pages not sorted leave their gaps unfilled
    (:func:`plan_runs` then refuses them).
    """
    n = pages.shape[0]
    whole = lo.shape[0] == 0
    pos = np.empty(n, np.int64)
    extra = 0
    for k in range(1, n):
        g = pages[k] - pages[k - 1] - 1
        if 0 < g <= max_gap and n + extra + g <= limit:
            extra += g
    if extra == 0:
        for k in range(n):
            pos[k] = k
        return pages, lo, hi, pos
    m = n + extra
    pages2 = np.empty(m, np.int64)
    lo2 = np.empty(0 if whole else m, np.int64)
    hi2 = np.empty(0 if whole else m, np.int64)
    j = 0
    added = 0
    for k in range(n):
        if k > 0:
            g = pages[k] - pages[k - 1] - 1
            if 0 < g <= max_gap and n + added + g <= limit:
                added += g
                for t in range(1, g + 1):
                    pages2[j] = pages[k - 1] + t
                    if not whole:
                        lo2[j] = 0
                        hi2[j] = PAGE
                    j += 1
        pages2[j] = pages[k]
        if not whole:
            lo2[j] = lo[k]
            hi2[j] = hi[k]
        pos[k] = j
        j += 1
    return pages2, lo2, hi2, pos


@nb.njit(cache=True)
def plan_row_reads(ids, dst, pages_per_row, num_rows, max_run_pages):
    """Runs reading whole-page rows ``ids`` straight into their places in a row array.

    Rows are ``pages_per_row * PAGE`` bytes, in the file and in the target;
    ``target[dst[i]]`` gets row ``ids[i]`` (``dst`` int64 [n], distinct). Each
    distinct row is read once, into the target row of its first occurrence; a
    run covers rows ``r, r+1, ..`` whose target rows are consecutive too, up
    to ``max_run_pages`` pages. Returns ``(offs, lens, bufs, dup_dst, dup_src,
    bad)``: after the reads, ``target[dup_dst[k]] = target[dup_src[k]]`` fills
    the repeated ids; ``bad`` is the position of the first id out of
    ``[0, num_rows)``, or -1.
    """
    n = ids.shape[0]
    for i in range(n):
        if ids[i] < 0 or ids[i] >= num_rows:
            e = np.empty(0, np.int64)
            return e, e, e, e, e, i
    row_bytes = pages_per_row * PAGE
    max_len = max(1, max_run_pages // pages_per_row) * row_bytes
    order = np.argsort(ids, kind="mergesort")  # stable: a row's first position comes first
    offs = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    bufs = np.empty(n, np.int64)
    dup_dst = np.empty(n, np.int64)
    dup_src = np.empty(n, np.int64)
    nr = 0
    nd = 0
    prev_row = -1
    prev_pos = -1
    for j in range(n):
        i = order[j]
        r = ids[i]
        t = dst[i]
        if r == prev_row:
            dup_dst[nd] = t
            dup_src[nd] = prev_pos
            nd += 1
            continue
        if nr > 0 and r == prev_row + 1 and t == prev_pos + 1 and lens[nr - 1] < max_len:
            lens[nr - 1] += row_bytes
        else:
            offs[nr] = r * row_bytes
            lens[nr] = row_bytes
            bufs[nr] = t * row_bytes
            nr += 1
        prev_row = r
        prev_pos = t
    return offs[:nr], lens[:nr], bufs[:nr], dup_dst[:nd], dup_src[:nd], -1


@nb.njit(cache=True)
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


@nb.njit(cache=True, inline="always")
def _round_out(a, b, align):
    """Bytes ``[a, b)`` rounded out to multiples of ``align``."""
    return a - a % align, b + (align - b % align) % align


@nb.njit(cache=True, inline="always")
def _first_bad(ids, num_rows):
    """The position of the first id out of ``[0, num_rows)``, or -1."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= num_rows:
            return i
    return -1


@nb.njit(cache=True, inline="always")
def _widen(lo, hi, k, a, b, align):
    """Page k's wanted span ``[lo[k], hi[k])`` grown to hold bytes ``[a, b)`` of the page,
    rounded out to multiples of ``align``."""
    a, b = _round_out(a, b, align)
    if a < lo[k]:
        lo[k] = a
    if b > hi[k]:
        hi[k] = b


@nb.njit(cache=True)
def feature_pages(ids, pages_per_row, num_rows):
    """Pages holding rows ``ids`` of ``pages_per_row`` whole pages each, and per id the
    slot of its first page.

    Returns ``(pages, slot, bad)``: ``pages`` sorted unique, ``slot[i]`` the index in
    ``pages`` of the first page of ``ids[i]``, ``bad`` the position of the first id out of
    ``[0, num_rows)`` or -1. (Rows smaller than a page: :func:`plan_sector_reads`.)
    """
    n = ids.shape[0]
    none = np.empty(0, np.int64)
    bad = _first_bad(ids, num_rows)
    if bad >= 0:
        return none, none, bad
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


@nb.njit(cache=True)
def plan_page_reads(ids, pages_per_row, num_rows, max_run_pages, max_gap, limit):
    """Runs reading the rows ``ids`` of ``pages_per_row`` whole pages each into a page
    buffer (:func:`feature_pages`, :func:`fill_gaps` and :func:`plan_runs` in one call);
    gaps of at most ``max_gap`` pages between them are read through while the buffer
    stays within ``limit`` pages.

    Returns ``(offs, lens, bufs, slot, npages, nbytes, bad)``: ``slot[i]`` is the buffer
    page holding the first page of ``ids[i]``, ``npages`` the pages read from (gaps
    included), ``nbytes`` the bytes read, ``bad`` the position of the first id out of
    ``[0, num_rows)`` or -1.
    """
    pages, slot, bad = feature_pages(ids, pages_per_row, num_rows)
    none = np.empty(0, np.int64)
    pages, lo, hi, pos = fill_gaps(pages, none, none, max_gap, limit)
    for i in range(slot.shape[0]):
        slot[i] = pos[slot[i]]
    offs, lens, bufs, nbytes, _ = plan_runs(pages, lo, hi, max_run_pages)
    return offs, lens, bufs, slot, pages.shape[0], nbytes, bad


@nb.njit(cache=True)
def plan_sector_reads(ids, rows_per_page, row_bytes, num_rows, max_run_pages, align,
                      max_gap_bytes, limit):
    """Runs reading rows ``ids`` smaller than a page (``rows_per_page > 0`` of them a
    page) into a page buffer, by bytes: each distinct row is the ``align``-multiples of
    its page it occupies, and two of them in file order go in one read when at most
    ``max_gap_bytes`` lie between them (whatever pages they are on: 0 reads only the
    rows' own sectors), the read spans at most ``max_run_pages`` pages and the buffer
    stays within ``limit`` pages where it would hold pages no row is on. A read costs a
    fixed amount plus its bytes, so reading through a gap pays where the gap costs less
    than a read.

    Every page a run touches has one slot of the buffer (``buffer[k*PAGE:(k+1)*PAGE]``
    for slot k, in file order; two runs on one page share its slot). Returns ``(offs,
    lens, bufs, slot, npages, nbytes, bad)`` as :func:`plan_page_reads` does: ``slot[i]``
    the slot of the page of ``ids[i]``, ``npages`` the slots, ``nbytes`` the bytes read,
    ``bad`` the position of the first id out of ``[0, num_rows)`` or -1.
    """
    n = ids.shape[0]
    none = np.empty(0, np.int64)
    bad = _first_bad(ids, num_rows)
    if bad >= 0:
        return none, none, none, none, 0, 0, bad
    rows, inv = _sorted_unique(ids.astype(np.int64))
    m = rows.shape[0]
    offs = np.empty(m, np.int64)
    lens = np.empty(m, np.int64)
    bufs = np.empty(m, np.int64)
    slot_of = np.empty(m, np.int64)   # each distinct row's page slot
    nr = 0
    ns = 0              # slots given so far; the last one is page ``last_page``'s
    last_page = -1
    run_page = 0        # the first page of the open run
    end = 0             # where the open run ends (bytes)
    nbytes = 0
    for j in range(m):
        r = rows[j]
        page = r // rows_per_page
        a = page * PAGE + (r % rows_per_page) * row_bytes
        a, b = _round_out(a, a + row_bytes, align)
        merge = False
        if nr > 0:  # a row that overlaps or touches the open run merges unless it is full
            grow = page - last_page if page > last_page else 0   # slots the merge takes
            merge = (a - end <= max_gap_bytes and page - run_page < max_run_pages
                     and (grow <= 1 or ns + grow <= limit))       # gap pages within limit
        if merge:
            if page > last_page:                         # the pages in between get slots
                ns += page - last_page
                last_page = page
            if b > end:
                nbytes += b - end
                lens[nr - 1] = b - offs[nr - 1]
                end = b
        else:
            if page != last_page:
                ns += 1
                last_page = page
            offs[nr] = a
            lens[nr] = b - a
            bufs[nr] = (ns - 1) * PAGE + a % PAGE
            nbytes += b - a
            run_page = page
            end = b
            nr += 1
        slot_of[j] = ns - 1
    slot = np.empty(n, np.int64)
    for i in range(n):
        slot[i] = slot_of[inv[i]]
    return offs[:nr], lens[:nr], bufs[:nr], slot, ns, nbytes, -1


@nb.njit(cache=True, nogil=True)
def extract_rows(buf, ids, slot, rows_per_page, row_bytes, dst, out, out2):
    """Copy row bytes from the page buffer: ``out[dst[i]] = row ids[i]``, or
    ``out2[-1 - dst[i]]`` where ``dst[i] < 0`` (a second destination).

    ``buf`` uint8 page buffer, ``out`` and ``out2`` uint8 [m, row_bytes], ``dst`` int64 [n].
    """
    n = ids.shape[0]
    for i in range(n):
        start = slot[i] * PAGE
        if rows_per_page > 0:
            start += (ids[i] % rows_per_page) * row_bytes
        d = dst[i]
        if d >= 0:
            out[d, :] = buf[start:start + row_bytes]
        else:
            out2[-1 - d, :] = buf[start:start + row_bytes]


@nb.njit(cache=True)
def check_targets(dst, num_out):
    """``(position, why)`` of the first bad target row in ``dst`` (int64 [n]): why 1 when
    it is out of ``[0, num_out)``, 2 when it repeats an earlier one; ``(-1, 0)`` if none."""
    seen = np.zeros(num_out, np.bool_)
    for i in range(dst.shape[0]):
        t = dst[i]
        if t < 0 or t >= num_out:
            return i, 1
        if seen[t]:
            return i, 2
        seen[t] = True
    return -1, 0


@nb.njit(cache=True)
def range_pages(starts, ends, align):
    """Pages covering byte ranges ``[starts[i], ends[i])``, and the bytes of each wanted.

    Returns ``(pages, lo, hi, offsets, bad)``: ``pages`` sorted unique; ``[lo[k],
    hi[k])`` the bytes of page k the ranges cover, rounded out to multiples of
    ``align`` (a divisor of ``PAGE``); range i's bytes sit at ``offsets[i] ..
    offsets[i] + ends[i] - starts[i]`` of the page buffer (its pages are consecutive
    in ``pages``, hence contiguous in the buffer). Empty ranges get offset 0. ``bad``
    is the first range with ``start < 0`` or ``end < start``, else -1.
    """
    n = starts.shape[0]
    total = 0
    for i in range(n):
        s = starts[i]
        e = ends[i]
        if s < 0 or e < s:
            none = np.empty(0, np.int64)
            return none, none, none, none, i
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
    lo = np.full(nu, PAGE, np.int64)
    hi = np.zeros(nu, np.int64)
    offsets = np.zeros(n, np.int64)
    for i in range(n):
        s = starts[i]
        e = ends[i]
        if e > s:
            k = np.searchsorted(pages, s // PAGE)
            offsets[i] = k * PAGE + s % PAGE
            # the range's pages are pages[k], pages[k + 1], ...: first and last partly
            last = k + (e - 1) // PAGE - s // PAGE
            for j in range(k, last + 1):
                _widen(lo, hi, j, s % PAGE if j == k else 0,
                       e - ((e - 1) // PAGE) * PAGE if j == last else PAGE, align)
    return pages, lo, hi, offsets, -1


@nb.njit(cache=True)
def move_offsets(offsets, starts, ends, pos):
    """:func:`range_pages`' ``offsets`` after :func:`fill_gaps` added pages: a range's
    first page moves from slot k to ``pos[k]`` (its other pages follow it, no gap being
    added between adjacent pages). Empty ranges keep offset 0. In place."""
    for i in range(offsets.shape[0]):
        if ends[i] > starts[i]:
            k = offsets[i] // PAGE
            offsets[i] += (pos[k] - k) * PAGE


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
