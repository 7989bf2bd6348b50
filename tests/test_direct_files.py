"""Files written and read once with O_DIRECT (ooc.storage.direct_files) against numpy, on
the O_DIRECT path and on the page-cache path a refusing file system gets."""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from ooc.core.errors import InvalidValue
from ooc.storage import direct_files as D
from ooc.storage.layout import PAGE, FeatureLayout, aligned_empty


def _takes_o_direct(folder) -> bool:
    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    os.unlink(folder / ".probe")
    return True


@pytest.fixture
def direct_dir(tmp_path):
    if not _takes_o_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT: the direct path cannot run")
    return tmp_path


def _refuse_o_direct(monkeypatch):
    real = os.open

    def refusing(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real(path, flags, *a)

    monkeypatch.setattr(D.os, "open", refusing)


@pytest.mark.parametrize("behind", [False, True])
@pytest.mark.parametrize("refused", [False, True])
@pytest.mark.parametrize("dtype,shape", [("float32", (3,)), ("float32", (100,)),
                                         ("float32", (128,)), ("int64", ()),
                                         ("float16", (7,)), ("float64", (700,))])
def test_appends_of_taken_rows_make_the_file_numpy_writes(direct_dir, monkeypatch, refused,
                                                          dtype, shape, behind):
    """Rows of 6 B to 5.6 KB taken in uneven, shuffled pieces (tails that straddle pages,
    pieces larger than the staging buffer) give exactly the bytes of their concatenation,
    the file truncated to them; ``direct`` says which path wrote them. The same through a
    staging written behind by a thread."""
    if refused:
        _refuse_o_direct(monkeypatch)
    rng = np.random.default_rng(len(shape) + sum(shape))
    stage = D.WriteBehind(8 * PAGE) if behind else D.Staging(aligned_empty(4 * PAGE))
    f = D.DirectAppender(direct_dir / "out.bin", stage)
    assert f.direct is (not refused)
    want = []
    for _ in range(9):
        src = rng.standard_normal((int(rng.integers(1, 3000)),) + shape).astype(dtype)
        idx = rng.permutation(src.shape[0])[:int(rng.integers(0, src.shape[0] + 1))]
        f.append_take(src, idx.astype(np.int64))
        want.append(src[idx])
        stage.buf[:] = 0xAB  # a later append must not read what the last left in staging
    f.close()
    stage.close()
    got = np.fromfile(direct_dir / "out.bin", dtype=dtype)
    np.testing.assert_array_equal(got, np.concatenate(want).reshape(-1))
    assert os.path.getsize(direct_dir / "out.bin") == f.size


@pytest.mark.parametrize("refused", [False, True])
def test_append_and_append_take_interleave(direct_dir, monkeypatch, refused):
    """Whole arrays (``append``, some larger than the staging buffer, some empty) and taken
    rows, interleaved, give the bytes of their concatenation."""
    if refused:
        _refuse_o_direct(monkeypatch)
    rng = np.random.default_rng(5)
    f = D.DirectAppender(direct_dir / "out.bin", aligned_empty(3 * PAGE))
    want = []
    for k in range(12):
        a = rng.integers(-9, 9, (int(rng.integers(0, 1500)), 2), dtype=np.int32)
        if k % 3:
            f.append(a)
            want.append(a)
        else:
            idx = rng.permutation(a.shape[0])[:a.shape[0] // 2].astype(np.int64)
            f.append_take(a, idx)
            want.append(a[idx])
    f.close()
    np.testing.assert_array_equal(np.fromfile(direct_dir / "out.bin", np.int32).reshape(-1, 2),
                                  np.concatenate(want))
    assert os.path.getsize(direct_dir / "out.bin") == f.size


def test_appenders_sharing_a_write_behind_staging_each_get_their_bytes(direct_dir):
    """Five files appended in turn through one staging written by a thread (the way
    ingest's bucket files are): each holds exactly its own appends."""
    rng = np.random.default_rng(11)
    stage = D.WriteBehind(6 * PAGE)
    files = [D.DirectAppender(direct_dir / f"b{k}", stage) for k in range(5)]
    want: list[list[np.ndarray]] = [[] for _ in files]
    for _ in range(60):
        k = int(rng.integers(0, 5))
        a = rng.integers(0, 1 << 30, (int(rng.integers(0, 3000)), 3), dtype=np.int64)
        files[k].append(a)
        want[k].append(a)
    for f in files:
        f.close()
    stage.close()
    for k, f in enumerate(files):
        got = np.fromfile(direct_dir / f"b{k}", np.int64).reshape(-1, 3)
        np.testing.assert_array_equal(got, np.concatenate(want[k]) if want[k]
                                      else np.zeros((0, 3), np.int64))
        assert f.size == os.path.getsize(direct_dir / f"b{k}")
    assert not [t for t in threading.enumerate() if t.name.startswith("ooc-write-behind")]


def test_a_write_behind_error_is_raised_by_the_next_call(direct_dir, monkeypatch):
    """A full disk met by the writing thread is raised, with its errno, by the appends or
    the close after it; abandoning then closes the file without raising again."""
    real = D.write_all
    calls = {"n": 0}

    def full_on_the_third(fd, buf, offset=None):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf, offset)

    monkeypatch.setattr(D, "write_all", full_on_the_third)
    stage = D.WriteBehind(4 * PAGE)
    f = D.DirectAppender(direct_dir / "out.bin", stage)
    with pytest.raises(OSError) as e:
        for _ in range(100):
            f.append(np.zeros(3 * PAGE, np.uint8))
        f.close()
    assert e.value.errno == errno.ENOSPC
    f.abandon()
    stage.close()
    assert f.fd < 0


def test_a_write_refused_after_the_open_goes_on_through_the_page_cache(direct_dir, monkeypatch):
    """A file system that takes O_DIRECT when opening and refuses the first write: the
    appender reopens without it, says so, and writes the same bytes."""
    real = D.write_all
    calls = {"n": 0}

    def first_refused(fd, buf, offset=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buf, offset)

    monkeypatch.setattr(D, "write_all", first_refused)
    src = np.arange(5000 * 4, dtype=np.float32).reshape(5000, 4)
    f = D.DirectAppender(direct_dir / "out.bin", aligned_empty(8 * PAGE))
    assert f.direct
    f.append_take(src, np.arange(5000, dtype=np.int64)[::-1].copy())
    f.close()
    assert not f.direct
    np.testing.assert_array_equal(np.fromfile(direct_dir / "out.bin", np.float32).reshape(-1, 4),
                                  src[::-1])


@pytest.mark.parametrize("refused", [False, True])
def test_read_direct_reads_whole_files_of_any_size(direct_dir, monkeypatch, refused):
    if refused:
        _refuse_o_direct(monkeypatch)
    for n in (0, 1, 511, PAGE // 8, 3 * PAGE + 5):
        a = np.arange(n, dtype=np.int64) * 7 - 3
        a.tofile(direct_dir / "a.bin")
        np.testing.assert_array_equal(D.read_direct(direct_dir / "a.bin", np.int64), a)
    (direct_dir / "odd.bin").write_bytes(b"x" * 13)
    with pytest.raises(InvalidValue, match="odd.bin: 13 bytes is not a whole number of int64"):
        D.read_direct(direct_dir / "odd.bin", np.int64)


def test_pwrite_pages_takes_only_whole_aligned_pages(direct_dir):
    fd, _ = D.open_direct(direct_dir / "p.bin", os.O_WRONLY | os.O_CREAT)
    try:
        buf = aligned_empty(2 * PAGE)
        buf[:] = 5
        D.pwrite_pages(fd, buf, PAGE)
        for bad in ((buf[:100], 0), (buf, 100), (aligned_empty(3 * PAGE)[1:PAGE + 1], 0)):
            with pytest.raises(InvalidValue):
                D.pwrite_pages(fd, *bad)
    finally:
        os.close(fd)
    data = (direct_dir / "p.bin").read_bytes()
    assert data[PAGE:] == bytes([5]) * (2 * PAGE) and len(data) == 3 * PAGE


@pytest.mark.parametrize("refused", [False, True])
@pytest.mark.parametrize("dim", [32, 100, 1100])
def test_a_row_placer_through_buckets_says_how_it_wrote(direct_dir, monkeypatch, refused, dim):
    """Through buckets, the placed file is numpy's permutation of the rows (packed rows,
    rows padded within pages, rows over a page) on either path, and ``direct`` says which."""
    from ooc.storage.layout import read_rows
    from ooc.storage.reorder import RowPlacer

    if refused:
        _refuse_o_direct(monkeypatch)
    rng = np.random.default_rng(dim)
    n = 3000
    x = rng.standard_normal((n, dim)).astype(np.float32)
    lay = FeatureLayout(n, dim, "float32")
    row_of = rng.permutation(n).astype(np.int32)
    placer = RowPlacer(direct_dir / "dst.bin", lay, row_of, buffer_bytes=64 << 10)
    assert placer.buckets > 1
    for a in range(0, n, 700):
        placer.add(a, x[a:a + 700])
    placer.finish()
    placer.close()
    assert placer.direct is (not refused)
    assert os.path.getsize(direct_dir / "dst.bin") == lay.file_bytes
    with open(direct_dir / "dst.bin", "rb") as f:
        got = read_rows(f, lay, 0, n)
    want = np.empty_like(x)
    want[row_of] = x
    np.testing.assert_array_equal(got, want)
    assert not list(direct_dir.glob(".bucket-*"))


def test_a_write_that_stops_short_is_reported_as_a_full_disk(direct_dir, monkeypatch):
    """The device fills mid-write: the write returns short, and the unaligned rest is
    refused with EINVAL under O_DIRECT; that is a full disk, not an invalid argument."""
    calls = {"n": 0}

    def filling(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return 1000  # a short write
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(D.os, "write", filling)
    f = D.DirectAppender(direct_dir / "out.bin", aligned_empty(8 * PAGE))
    f._written = True  # past the first write: no fallback to the page cache
    with pytest.raises(OSError) as e:
        f.append_take(np.zeros((100, 128), np.float32), np.arange(100, dtype=np.int64))
    assert e.value.errno == errno.ENOSPC
    f.abandon()


@pytest.mark.parametrize("refused", [False, True])
def test_feature_rows_of_an_npz_member_read_once_equal_numpy(direct_dir, monkeypatch, refused):
    """Feature rows read once (``NpyReader.rows``) go through O_DIRECT and a small staging
    buffer, realigned from a member that starts anywhere in its ``.npz``; a file system
    that refuses O_DIRECT gets the page-cache read, and ``read_range`` says which."""
    from ooc.storage.ingest import edgelist as E
    from ooc.storage.ingest import npz

    if refused:
        _refuse_o_direct(monkeypatch)
    monkeypatch.setattr(E, "DIRECT_READ_MIN", 1)            # every read of rows
    monkeypatch.setattr(D, "READ_STAGING", 3 * PAGE)  # many pieces a read
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5000, 13)).astype(np.float32)
    np.savez(direct_dir / "data.npz", edge_index=np.zeros((2, 7), np.int64), node_feat=x)
    r = npz.npz_member(direct_dir / "data.npz", "node_feat", direct_dir)
    for a, b in [(0, 5000), (17, 1234), (4999, 5000), (3, 4)]:
        np.testing.assert_array_equal(r.rows(a, b), x[a:b])
    direct = D.read_range(r.file, r.offset, 10, np.dtype(np.float32))
    assert (direct is None) is refused
    if direct is not None:
        np.testing.assert_array_equal(direct, x.reshape(-1)[:10])
