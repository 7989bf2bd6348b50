"""EntryReader: entries of an array on disk by index, against numpy's indexing."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import in_threads

import ooc.storage.entries as entries
from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.storage.entries import EntryReader
from ooc.storage.layout import PAGE


def _npy(tmp_path, values: np.ndarray):
    """``values`` saved as ``.npy``; its memmap (for the offset) and path."""
    path = tmp_path / "a.npy"
    np.save(path, values)
    mm = np.load(path, mmap_mode="r")
    assert (mm.offset + mm.nbytes) % PAGE, "the file should end in a partial page"
    return path, mm


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_random_ids_repeats_and_the_partial_last_page(tmp_path, dtype):
    rng = np.random.default_rng(0)
    n = 3 * PAGE + 77
    values = rng.integers(0, 120, n).astype(dtype)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, n)
    ids = rng.integers(0, n, 5000)
    ids[:4] = [n - 1, 0, n - 1, n - 2]  # the last entries live on the partial page
    got = r.read(ids)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, values[ids])
    np.testing.assert_array_equal(r.read(np.arange(n)[::-1]), values[::-1])
    np.testing.assert_array_equal(r.read([n - 1]), values[[n - 1]])  # only the tail
    assert r.read(np.zeros(0, np.int64)).shape == (0,)
    r.close()
    np.testing.assert_array_equal(r.read(ids[:10]), values[ids[:10]])  # reopens


def test_requests_larger_than_a_piece_are_read_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(entries, "PIECE_ENTRIES", 7)
    rng = np.random.default_rng(1)
    values = rng.integers(-1, 50, 20_000)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, values.shape[0])
    ids = rng.permutation(values.shape[0])[:3001]
    np.testing.assert_array_equal(r.read(ids), values[ids])
    assert r._reader.stats.requests >= 3001 // 7  # one request per piece


def test_many_ids_are_sorted_a_piece_at_a_time(tmp_path, monkeypatch):
    """More ids than one read sorts at once (int32 ids, repeats, the partial last page in
    several pieces): the same entries as numpy's indexing."""
    monkeypatch.setattr(entries, "IDS_PER_READ", 100)
    rng = np.random.default_rng(2)
    values = rng.integers(-1, 50, 5_003)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, values.shape[0])
    ids = rng.integers(0, values.shape[0], 1_234).astype(np.int32)
    ids[::97] = values.shape[0] - 1
    np.testing.assert_array_equal(r.read(ids), values[ids])
    pairs = ids[ids < values.shape[0] - 1]          # runs of two reach the last entry
    np.testing.assert_array_equal(r.read(pairs, width=2),
                                  np.stack([values[pairs], values[pairs + 1]], axis=1))


def test_out_of_range_and_misaligned(tmp_path):
    values = np.arange(1000, dtype=np.int64)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, 1000)
    for bad in ([1000], [-1], [3, 2000]):
        with pytest.raises(IdOutOfRange, match="a.npy: index"):
            r.read(np.array(bad))
    with pytest.raises(InvalidValue, match="straddle"):
        EntryReader(path, 4, np.int64, 10)


def test_truncated_file_is_named(tmp_path):
    values = np.arange(5000, dtype=np.int64)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, 6000)  # the header promised more
    with pytest.raises(InvalidValue, match="a.npy: truncated"):
        r.read(np.array([1]))
    with pytest.raises(InvalidValue, match="a.npy: truncated"):  # and again, not half-open
        r.read(np.array([1]))


def test_threads_share_one_reader(tmp_path):
    rng = np.random.default_rng(2)
    values = rng.integers(0, 1 << 40, 50_000)
    path, mm = _npy(tmp_path, values)
    r = EntryReader(path, mm.offset, mm.dtype, values.shape[0])

    def work(seed: int) -> None:
        g = np.random.default_rng(seed)
        for _ in range(20):
            ids = g.integers(0, values.shape[0], 3000)
            np.testing.assert_array_equal(r.read(ids), values[ids])

    errors = in_threads(work)
    assert not errors, errors[0]


def test_runs_of_consecutive_entries(tmp_path):
    """``width`` consecutive entries from each id in one request (a node's two offsets),
    also for runs that reach the file's partial last page."""
    rng = np.random.default_rng(3)
    values = rng.integers(0, 1 << 40, 3 * 512 + 100)  # int64: 512 a page
    path, mm = _npy(tmp_path, values)
    n = values.shape[0]
    r = EntryReader(path, mm.offset, mm.dtype, n)
    for width in (2, 5, 512):
        ids = rng.integers(0, n - width + 1, 2000)
        ids[:3] = [0, n - width, n - width - 1]
        got = r.read(ids, width)
        assert got.shape == (2000, width)
        np.testing.assert_array_equal(got, values[ids[:, None] + np.arange(width)])
    with pytest.raises(IdOutOfRange, match="a.npy: index"):
        r.read(np.array([n - 1]), 2)
    with pytest.raises(InvalidValue, match="width"):
        r.read(np.array([0]), 513)
