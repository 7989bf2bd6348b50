"""Routing stored entries to one file per scatter window, against a numpy reference."""
import bisect
import os
import time

import numpy as np
import pytest

from ooc.storage.ingest import edge_buckets as EB
from ooc.storage.ingest.edge_buckets import EdgeBuckets, range_ends
from ooc.storage.read_ahead import read_ahead


def _reference(src, dst, ends, undirected, drop_self):
    """Per window: its (target, source) entries in input order."""
    out: list[list] = [[] for _ in ends]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if s == d and drop_self:
            continue
        for t, u in ([(d, s), (s, d)] if undirected and s != d else [(d, s)]):
            out[bisect.bisect_right(ends.tolist(), t)].append((t, u))
    return [np.array(o, np.int64).reshape(-1, 2) for o in out]


@pytest.mark.parametrize("undirected,drop_self", [(True, False), (False, False), (True, True),
                                                   (False, True)])
def test_routed_entries_are_each_windows_in_input_order(tmp_path, undirected, drop_self):
    """200k nodes (the window table has a step of 4 nodes, windows of 1 to 90k nodes: a
    lookup steps past windows it straddles), edges in three chunks, the files read back in
    pieces smaller than a file and not a whole number of pages."""
    rng = np.random.default_rng(7)
    n = 200_000
    ends = np.array([1, 2, 3, 5, 7, 40_000, 40_001, 130_000, 199_999, n], np.int64)
    src, dst = rng.integers(0, n, 30_000), rng.integers(0, n, 30_000)
    src[:40], dst[40:80] = 0, 4      # windows of one and two nodes get entries
    dst[80:200] = src[80:200]         # self loops
    b = EdgeBuckets(tmp_path, ends, np.dtype(np.int32), 3 * 4096)
    try:
        for a in (0, 7_000, 19_000):
            z = {0: 7_000, 7_000: 19_000, 19_000: 30_000}[a]
            b.route(src[a:z], dst[a:z], undirected, drop_self)
        b.finish()
        want = _reference(src, dst, ends, undirected, drop_self)
        for k in range(len(ends)):
            assert b.counts[k] == len(want[k])
            got = [p.copy() for p in b.entries(k, 4096 * 3 + 100)]
            got_all = np.concatenate(got) if got else np.zeros((0, 2), np.int32)
            np.testing.assert_array_equal(got_all, want[k])
            assert not b.names[k].exists()  # removed once read
    finally:
        b.close()
    assert not list(tmp_path.iterdir())


def test_a_windows_ranges_read_ahead_in_pieces(tmp_path):
    """Several ranges' entries through ``read_ahead``: in range order, each piece intact
    while the caller holds it (the buffers are taken in turn, one per piece alive)."""
    rng = np.random.default_rng(8)
    n = 50_000
    ends = np.array([10_000, 10_001, 30_000, n], np.int64)
    src, dst = rng.integers(0, n, 20_000), rng.integers(0, n, 20_000)
    b = EdgeBuckets(tmp_path, ends, np.dtype(np.int32), 2 * 4096)
    try:
        b.route(src, dst, True, False)
        b.finish()
        want = np.concatenate(_reference(src, dst, ends, True, False)[1:4])
        pieces = []
        for p in read_ahead(b.window_entries(1, 4, 4096)):
            time.sleep(0.001)  # the next pieces are read meanwhile
            pieces.append((p, p.copy()))
            if len(pieces) > 1:  # the one before, released now, was intact until now
                np.testing.assert_array_equal(*pieces[-2])
                pieces[-2] = (None, pieces[-2][1])
        np.testing.assert_array_equal(np.concatenate([c for _, c in pieces]), want)
        assert [x.exists() for x in b.names] == [True, False, False, False]
    finally:
        b.close()


def test_close_removes_the_files_left(tmp_path):
    b = EdgeBuckets(tmp_path, np.array([10, 20, 30], np.int64), np.dtype(np.int64), 8192)
    b.route(np.arange(30, dtype=np.int64), np.arange(30, dtype=np.int64)[::-1].copy(), True,
            False)
    b.finish()
    next(iter(b.entries(0, 4096)))  # a window half consumed
    b.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("range_bytes,max_files", [(64, 256), (64, 7), (1 << 30, 256)])
def test_range_ends_cut_each_window_apart(monkeypatch, range_bytes, max_files):
    """Ranges cover the nodes in order, never straddle a window, keep their lists to the
    range size (a node over it alone) and to :data:`RANGE_NODES` nodes, and their number
    to about :data:`MAX_FILES` (ranges grow instead)."""
    monkeypatch.setattr(EB, "RANGE_BYTES", range_bytes)
    monkeypatch.setattr(EB, "MAX_FILES", max_files)
    monkeypatch.setattr(EB, "RANGE_NODES", 50)
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 12, 1000).astype(np.int64)
    counts[500] = 400  # one node over any range
    windows = [(0, 300), (300, 301), (301, 777), (777, 1000)]
    ends, files = range_ends(counts, windows, 4)
    assert ends[-1] == 1000 and np.all(np.diff(ends) > 0)
    starts = np.concatenate([[0], ends[:-1]])
    cap = max(range_bytes, -(-int(counts.sum()) * 4 // max_files)) // 4
    for (lo, hi), (r0, r1) in zip(windows, files, strict=True):
        assert starts[r0] == lo and ends[r1 - 1] == hi
    for a, z in zip(starts, ends, strict=True):
        assert z - a <= 50 and (counts[a:z].sum() <= cap or z - a == 1)
    if range_bytes == 1 << 30:
        assert len(ends) == 1000 // 50 + 2  # only RANGE_NODES cuts (and the windows)
    if max_files == 7:
        assert len(ends) <= 7 + 1000 // 50 + len(windows)


def test_a_file_cut_short_is_named(tmp_path):
    """A routed file shorter than the entries routed to it (truncated under ingest) is an
    IOFailure naming it, never entries read past its end."""
    from ooc.storage import IOFailure

    b = EdgeBuckets(tmp_path, np.array([1000], np.int64), np.dtype(np.int32), 8192)
    b.route(np.arange(900, dtype=np.int64), np.arange(900, dtype=np.int64)[::-1].copy(), False,
            False)
    b.finish()
    os.truncate(b.names[0], 900 * 8 - 12)
    with pytest.raises(IOFailure, match=r"\.edges-0: ended after"):
        for _ in b.entries(0, 4096):
            pass
    b.close()


def test_an_id_outside_the_graph_is_reported_not_routed(tmp_path):
    """An edge whose id left the graph after the count pass (the file changed) is found
    by the routing itself: its index comes back and nothing of the chunk is appended."""
    b = EdgeBuckets(tmp_path, np.array([50, 100], np.int64), np.dtype(np.int32), 8192)
    src = np.arange(40, dtype=np.int64)
    dst = src[::-1].copy()
    for bad, value in ((7, 100), (31, -1)):
        d = dst.copy()
        d[bad] = value
        assert b.route(src, d, True, False) == bad
    assert b.route(src, dst, True, False) == -1
    b.finish()
    assert int(b.counts.sum()) == 80
    b.close()
