"""Reads of part of a page: rows smaller than a page and neighbour lists are read as the
512 B sectors they occupy where the backend and the device take such reads.

Every read lands in a page buffer first filled with a poison byte, so a sector the plan
left out shows up as wrong bytes; the bytes and reads counted are compared with a
plain-Python statement of the plan.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import backend_or_skip, feature_file

from ooc.storage import PAGE, DirectFeatures, DirectReader, read_ranges
from ooc.storage import io_backends as B
from ooc.storage.layout import SECTOR

BACKENDS = list(B.REGISTRY)
POISON = 0xA5


def _poison(reader: DirectReader, npages: int) -> None:
    reader.scratch(npages * PAGE)
    reader._scratch.fill(POISON)


def _plan(ranges: list[tuple[int, int]], align: int, max_run_pages: int, max_gap: int = 0,
          limit: int = 1 << 40) -> tuple[int, int]:
    """(bytes, reads) of reading byte ranges ``[s, e)``: each page's wanted bytes rounded
    out to ``align``, gaps of at most ``max_gap`` pages between wanted pages read whole
    (in file order while the pages stay within ``limit``), consecutive pages one read
    (with the bytes between their spans)."""
    spans: dict[int, tuple[int, int]] = {}
    for s, e in ranges:
        for p in range(s // PAGE, (e - 1) // PAGE + 1):
            a = max(s, p * PAGE) - p * PAGE
            b = min(e, (p + 1) * PAGE) - p * PAGE
            a, b = a // align * align, -(-b // align) * align
            lo, hi = spans.get(p, (PAGE, 0))
            spans[p] = (min(lo, a), max(hi, b))
    wanted = sorted(spans)
    total_pages = len(wanted)
    for p, q in zip(wanted, wanted[1:], strict=False):
        if 0 < q - p - 1 <= max_gap and total_pages + q - p - 1 <= limit:
            total_pages += q - p - 1
            spans.update({g: (0, PAGE) for g in range(p + 1, q)})
    pages = sorted(spans)
    total = reads = i = 0
    while i < len(pages):
        j = i
        while (j + 1 < len(pages) and pages[j + 1] == pages[j] + 1
               and pages[j + 1] - pages[i] < max_run_pages):
            j += 1
        total += pages[j] * PAGE + spans[pages[j]][1] - (pages[i] * PAGE + spans[pages[i]][0])
        reads += 1
        i = j + 1
    return total, reads


def _row_plan(starts: list[int], row_bytes: int, align: int, max_run_pages: int,
              max_gap_bytes: int, limit: int = 1 << 40) -> tuple[int, int, int]:
    """(bytes, reads, buffer pages) of reading rows that start at byte ``starts`` (rows
    within pages): each distinct row rounded out to ``align``, in file order; a row joins
    the read before it when at most ``max_gap_bytes`` lie between them, the read then
    spans at most ``max_run_pages`` pages and, where it holds pages no row is on, the
    pages read stay within ``limit``."""
    spans = sorted({(a // align * align, -(-(a + row_bytes) // align) * align) for a in starts})
    runs: list[list[int]] = []   # [start, end, first page]
    pages: set[int] = set()
    for a, b in spans:
        page = a // PAGE
        if runs:
            start, end, first = runs[-1]
            grown = pages | set(range((end - 1) // PAGE, page + 1))
            extra = len(grown) - len(pages | {page})   # pages no row is on
            if a - end <= max_gap_bytes and page - first < max_run_pages \
                    and (extra == 0 or len(grown) <= limit):
                runs[-1][1] = max(end, b)
                pages = grown
                continue
        runs.append([a, b, page])
        pages.add(page)
    return sum(e - a for a, e, _ in runs), len(runs), len(pages)


def test_rows_merge_across_gaps_of_at_most_the_gap_bytes():
    """The planner's runs against the plain-Python plan, every gap size from none to past
    a page, with the run length and the buffer's pages bounding the merges; each id's
    slot holds its page."""
    from ooc.storage import _direct_kernels as K

    rng = np.random.default_rng(4)
    for row_bytes, rpp in ((512, 8), (400, 10), (12, 341), (2800, 1)):
        for _ in range(40):
            ids = rng.integers(0, 300, int(rng.integers(1, 60)))
            starts = [int(i) // rpp * PAGE + int(i) % rpp * row_bytes for i in ids]
            for gap in (0, 511, 512, 1536, PAGE, 3 * PAGE):
                for runs, limit in ((64, 1 << 30), (2, 1 << 30), (64, 8)):
                    offs, lens, bufs, slot, npages, nbytes, bad = K.plan_sector_reads(
                        ids, rpp, row_bytes, 300, runs, SECTOR, gap, limit)
                    want = _row_plan(starts, row_bytes, SECTOR, runs, gap, limit)
                    assert (int(nbytes), len(offs)) == want[:2]
                    assert npages == max(want[2], 0) and bad == -1
                    assert int(lens.sum()) == nbytes and (np.diff(offs) > 0).all()
                    # a run lands at its first page's slot, every id's page has one slot
                    page_slot = {}
                    for o, ln, b in zip(offs.tolist(), lens.tolist(), bufs.tolist(), strict=True):
                        assert o % PAGE == b % PAGE
                        for k in range(o // PAGE, (o + ln - 1) // PAGE + 1):
                            sl = b // PAGE + k - o // PAGE
                            assert page_slot.setdefault(k, sl) == sl
                    for i, sl in zip(ids.tolist(), slot.tolist(), strict=True):
                        assert page_slot[i // rpp] == sl
    bad = K.plan_sector_reads(np.array([3, 300]), 8, 512, 300, 64, SECTOR, 0, 100)[-1]
    assert bad == 1


def _logical_block(path) -> int | None:
    """The logical block size of the device holding ``path``, from sysfs (None: unknown,
    e.g. tmpfs)."""
    st = os.stat(path)
    base = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (f"{base}/queue/logical_block_size", f"{base}/../queue/logical_block_size"):
        try:
            with open(q) as f:
                return int(f.read())
        except OSError:
            continue
    return None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(3, "float32"), (100, "float32"), (128, "float32"),
                                       (100, "float16"), (700, "float32")])
def test_small_rows_read_as_sectors_match_numpy(tmp_path, backend, dim, dtype):
    """Rows of 12, 400 (straddling sectors), 512, 200 and 2800 bytes, any order, repeats."""
    path, lay, rows = feature_file(tmp_path, 3000, dim, dtype)
    backend_or_skip(backend, path)
    rng = np.random.default_rng(dim)
    with DirectFeatures(path, lay, queue_depth=8, backend=backend) as f:
        if backend == "liburing":
            assert f.reader.read_align == PAGE  # per-page buffers: whole pages only
        for n in (1, 5, 60, 700):
            ids = rng.integers(0, 3000, n)
            _poison(f.reader, lay.num_pages)
            np.testing.assert_array_equal(f.read(ids), rows[ids])
        # misses and a second destination in one request
        ids = rng.choice(3000, 80, replace=False)
        out = np.zeros((100, dim), dtype)
        out2 = np.zeros((30, dim), dtype)
        _poison(f.reader, lay.num_pages)
        f.read_into(ids[:50], out, np.arange(50, 100), also=(ids[50:], out2, np.arange(30)))
        np.testing.assert_array_equal(out[50:], rows[ids[:50]])
        np.testing.assert_array_equal(out2, rows[ids[50:]])


@pytest.mark.parametrize("dim,dtype", [(3, "float32"), (100, "float32"), (128, "float32"),
                                       (700, "float32")])
@pytest.mark.parametrize("gap", [0, 2 * PAGE])
def test_sector_reads_count_what_the_plan_reads(tmp_path, dim, dtype, gap):
    """Bytes and reads equal the plain-Python plan; whole-page reads of the same rows
    take more bytes and no more reads."""
    path, lay, rows = feature_file(tmp_path, 4000, dim, dtype)
    rng = np.random.default_rng(1)
    with DirectFeatures(path, lay, queue_depth=8, backend="preadv", max_gap_bytes=gap) as f, \
            DirectFeatures(path, lay, queue_depth=8, backend="preadv", page_reads=True,
                           max_gap_bytes=gap) as g:
        assert g.reader.read_align == PAGE
        align = f.reader.read_align
        if align != SECTOR:
            pytest.skip(f"{path.parent} takes no 512 B O_DIRECT reads (logical block "
                        f"{_logical_block(path)})")
        for n in (1, 7, 90, 400):
            ids = rng.integers(0, 4000, n)
            starts = [int(o) for o in lay.row_offsets(ids)]
            want_bytes, want_reads, _ = _row_plan(starts, lay.row_bytes, SECTOR,
                                                  f.reader.max_run_pages, gap, f.max_pages)
            page_bytes, page_reads, _ = _row_plan(starts, lay.row_bytes, PAGE,
                                                  g.reader.max_run_pages, gap, g.max_pages)
            for r, (b, k) in ((f, (want_bytes, want_reads)), (g, (page_bytes, page_reads))):
                before = r.reader.stats.as_dict()
                np.testing.assert_array_equal(r.read(ids), rows[ids])
                assert r.reader.stats.bytes_read - before["bytes_read"] == b
                assert r.reader.stats.read_ops - before["read_ops"] == k
            assert want_reads >= page_reads
            assert want_bytes <= page_bytes
        # one row alone on its page costs the sectors it spans, not the page
        one = np.array([lay.rows_per_page * 3 + 1])
        o = int(lay.row_offsets(one)[0])
        before = f.reader.stats.bytes_read
        f.read(one)
        spanned = (-(-(o + lay.row_bytes) // SECTOR) - o // SECTOR) * SECTOR
        assert f.reader.stats.bytes_read - before == spanned < PAGE


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_read", [1 << 20, PAGE])
@pytest.mark.parametrize("gap", [0, 3 * PAGE])
def test_byte_ranges_read_as_sectors(tmp_path, backend, max_read, gap):
    """Neighbour-list-like ranges: within a sector, across sectors, across pages, empty,
    sharing pages; their bytes from a poisoned buffer and the bytes counted (reads of one
    page each, or adjacent pages merged)."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 40 * PAGE, dtype=np.uint8)
    path = tmp_path / "indices.bin"
    data.tofile(path)
    backend_or_skip(backend, path)
    cases = [
        [(10, 20)],
        [(500, 530)],  # across a sector boundary
        [(4000, 4200)],  # across a page boundary
        [(100, 9000)],  # three pages
        [(7, 7), (8192 + 600, 8192 + 700), (8192 + 3000, 8192 + 3100), (3 * PAGE, 5 * PAGE)],
        [(int(s), int(s) + int(n)) for s, n in zip(rng.integers(0, 39 * PAGE, 200),
                                                   rng.integers(0, 300, 200), strict=True)],
    ]
    with DirectReader(path, backend=backend, queue_depth=8, max_read_bytes=max_read,
                      max_gap_bytes=gap) as r:
        for ranges in cases:
            s = np.array([a for a, _ in ranges], np.int64)
            e = np.array([b for _, b in ranges], np.int64)
            _poison(r, 40)
            before = r.stats.as_dict()
            buf, off = read_ranges(r, s, e)
            for i, (a, b) in enumerate(ranges):
                np.testing.assert_array_equal(buf[off[i]:off[i] + b - a], data[a:b])
            nonempty = [(a, b) for a, b in ranges if b > a]
            want_bytes, want_reads = _plan(nonempty, r.read_align, r.max_run_pages,
                                           r.max_gap_pages, r.max_buffer_pages)
            assert r.stats.bytes_read - before["bytes_read"] == want_bytes
            assert r.stats.read_ops - before["read_ops"] == want_reads


def test_read_align_follows_the_device(tmp_path):
    """512 B reads where the device's logical block is 512 B, whole pages where it is
    4 KiB: the reader must not quietly read pages on a device that takes sectors."""
    path, lay, _ = feature_file(tmp_path, 100, 128, "float32")
    lbs = _logical_block(path)
    with DirectReader(path, backend="preadv") as r:
        if not r.o_direct:
            pytest.skip(f"{tmp_path} refuses O_DIRECT")
        if lbs is None:
            pytest.skip(f"no logical block size in sysfs for {tmp_path} (tmpfs?); "
                        f"read_align {r.read_align}")
        assert r.read_align == (SECTOR if lbs <= SECTOR else PAGE)


def test_a_device_that_refuses_sector_reads_gets_pages(tmp_path, monkeypatch):
    """Where a 512 B O_DIRECT read fails (a device of 4 KiB blocks), whole pages are read."""
    path, lay, rows = feature_file(tmp_path, 2000, 100, "float32")
    real = B._probe_read
    monkeypatch.setattr(B, "_probe_read",
                        lambda fd, nbytes, offset: nbytes >= PAGE and real(fd, nbytes, offset))
    with DirectFeatures(path, lay, queue_depth=8, backend="preadv") as f:
        if not f.reader.o_direct:
            pytest.skip(f"{tmp_path} refuses O_DIRECT")
        assert f.reader.read_align == PAGE
        ids = np.array([5, 900, 1999, 6])
        _poison(f.reader, lay.num_pages)
        np.testing.assert_array_equal(f.read(ids), rows[ids])
        assert f.reader.stats.bytes_read == f.reader.stats.pages * PAGE


def test_the_loader_readers_read_sectors_unless_told_pages(small_dataset):
    """The O_DIRECT presets' feature and neighbour readers take the device's sectors by
    default (the stack reports it) and whole pages with ``page_reads=True``: the same
    rows and lists, fewer bytes."""
    from ooc.executor.loader.presets import resolve_preset
    from ooc.executor.loader.stack import ModeOptions, open_sources
    from ooc.storage import open_dataset

    path, arrays = small_dataset
    ds = open_dataset(path)
    lbs = _logical_block(ds.file("features.bin"))
    ids = np.arange(3, 500, 37)
    got = {}
    for pages in (False, True):
        src = open_sources(ds, resolve_preset("static"), ModeOptions(page_reads=pages))
        try:
            if not pages and (lbs is None or lbs > SECTOR):
                pytest.skip(f"{path} is on a device of {lbs} B blocks (or unknown)")
            want = PAGE if pages else SECTOR
            assert (src.info["read_align"], src.info["neighbor_read_align"]) == (want, want)
            feats = src.features  # node order: the reader itself
            assert isinstance(feats, DirectFeatures)
            before = feats.reader.stats.bytes_read
            np.testing.assert_array_equal(feats.read(ids), arrays["features"][ids])
            got[pages] = feats.reader.stats.bytes_read - before
        finally:
            src.close()
    assert got[False] < got[True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_byte_ranges_read_through_gaps_within_out(tmp_path, backend):
    """Ranges on pages 0 and 4 with gaps of 3 pages read through: into an ``out`` of 5 pages
    one read from the first range's sector to the last's; into one of 2 pages (all the
    ranges need) two reads, the gap left out."""
    from ooc.storage import aligned_empty

    data = np.random.default_rng(5).integers(0, 256, 6 * PAGE, dtype=np.uint8)
    path = tmp_path / "indices.bin"
    data.tofile(path)
    backend_or_skip(backend, path)
    s = np.array([100, 4 * PAGE + 700], np.int64)
    e = s + 40
    with DirectReader(path, backend=backend, queue_depth=8, max_gap_bytes=3 * PAGE) as r:
        for pages, reads in ((5, 1), (2, 2)):
            out = aligned_empty(pages * PAGE)
            before = r.stats.as_dict()
            buf, off = read_ranges(r, s, e, out)
            assert buf is out
            for i in range(2):
                np.testing.assert_array_equal(buf[off[i]:off[i] + 40], data[s[i]:e[i]])
            assert r.stats.read_ops - before["read_ops"] == reads
            want = _plan([(int(a), int(b)) for a, b in zip(s, e, strict=True)], r.read_align,
                         r.max_run_pages, 3, pages)[0]
            assert r.stats.bytes_read - before["bytes_read"] == want
