"""Routing stored entries to one file per scatter window, against a numpy reference."""
import bisect

import numpy as np
import pytest

from ooc.storage.ingest.edge_buckets import EdgeBuckets


def _reference(src, dst, ends, undirected, drop_self):
    """Per window: its (target, source) entries in input order."""
    out: list[list] = [[] for _ in ends]
    for s, d in zip(src.tolist(), dst.tolist()):
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


def test_close_removes_the_files_left(tmp_path):
    b = EdgeBuckets(tmp_path, np.array([10, 20, 30], np.int64), np.dtype(np.int64), 8192)
    b.route(np.arange(30, dtype=np.int64), np.arange(30, dtype=np.int64)[::-1].copy(), True,
            False)
    b.finish()
    next(iter(b.entries(0, 4096)))  # a window half consumed
    b.close()
    assert not list(tmp_path.iterdir())
