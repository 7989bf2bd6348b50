"""Direct reader: every backend against plain numpy reads of the same file."""
from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import backend_or_skip, feature_file, in_threads, write_stand_in_binding

from ooc.core import notes
from ooc.storage import (
    PAGE,
    DirectFeatures,
    DirectReader,
    OocError,
    aligned_empty,
    probe,
    read_index_ranges,
    read_ranges,
)
from ooc.storage import io_backends as B

BACKENDS = list(B.REGISTRY)


@pytest.fixture
def raw_file(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=301 * PAGE, dtype=np.uint8)  # not a multiple of the queue
    path = tmp_path / "raw.bin"
    data.tofile(path)
    return path, data


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def note_lines(monkeypatch):
    """The ``ooc: note:`` lines printed while the test runs."""
    lines: list[str] = []
    notes.reset()
    monkeypatch.setattr(notes, "sink", lines.append)
    yield lines
    notes.reset()


def test_aligned_empty():
    for n in (0, 1, 4096, 12345):
        a = aligned_empty(n)
        assert a.dtype == np.uint8 and a.size == n and (n == 0 or a.ctypes.data % 4096 == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qd", [1, 4, 64])
def test_random_pages(raw_file, backend, qd):
    path, data = raw_file
    backend_or_skip(backend, path)
    pages_ref = data.reshape(-1, PAGE)
    rng = np.random.default_rng(qd)
    with DirectReader(path, queue_depth=qd, backend=backend, max_read_bytes=3 * PAGE) as r:
        assert r.backend == backend
        for _ in range(6):
            k = int(rng.integers(1, 301))
            pages = np.sort(rng.choice(301, size=k, replace=False)).astype(np.int64)
            out = aligned_empty(k * PAGE + PAGE)
            r.read_pages(pages, out)
            np.testing.assert_array_equal(out[: k * PAGE].reshape(k, PAGE), pages_ref[pages])
        # whole file in one request: many more reads than the queue depth
        allp = np.arange(301, dtype=np.int64)
        out = aligned_empty(301 * PAGE)
        r.read_pages(allp, out)
        np.testing.assert_array_equal(out, data)
        assert r.stats.pages > 301 and r.stats.read_ops >= 301 // 3
        # empty request
        before = r.stats.read_ops
        r.read_pages(np.zeros(0, np.int64), aligned_empty(0))
        assert r.stats.read_ops == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_small_requests_wrap_the_ring(raw_file, backend):
    path, data = raw_file
    backend_or_skip(backend, path)
    rng = np.random.default_rng(5)
    with DirectReader(path, queue_depth=2, backend=backend, max_read_bytes=PAGE) as r:
        out = aligned_empty(8 * PAGE)
        for _ in range(50):
            pages = np.sort(rng.choice(301, size=int(rng.integers(1, 8)), replace=False))
            r.read_pages(pages, out)
            np.testing.assert_array_equal(out[: len(pages) * PAGE].reshape(-1, PAGE),
                                          data.reshape(-1, PAGE)[pages])


def test_bad_requests(raw_file):
    path, _ = raw_file
    with DirectReader(path) as r:
        out = aligned_empty(4 * PAGE)
        with pytest.raises(ValueError):
            r.read_pages(np.array([3, 2]), out)
        with pytest.raises(ValueError):
            r.read_pages(np.array([2, 2]), out)
        with pytest.raises(ValueError):
            r.read_pages(np.arange(5), out)
        with pytest.raises(OocError, match="raw.bin"):
            r.read_pages(np.array([301]), out)
    with pytest.raises(OocError, match="missing.bin"):
        DirectReader(path.parent / "missing.bin")
    with pytest.raises(ValueError):
        DirectReader(path, backend="nope")


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_read_truncated_file(tmp_path, backend):
    path = tmp_path / "short.bin"
    np.arange(3 * PAGE + 100, dtype=np.uint8).tofile(path)  # partial last page
    backend_or_skip(backend, path)
    with DirectReader(path, backend=backend) as r:
        out = aligned_empty(4 * PAGE)
        r.read_pages(np.arange(3), out)
        with pytest.raises(OocError, match=r"short\.bin.*partial last page"):
            r.read_pages(np.arange(4), out)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "mmap"])
def test_file_shrinks_under_the_reader(tmp_path, backend):
    path = tmp_path / "shrink.bin"
    np.zeros(8 * PAGE, np.uint8).tofile(path)
    backend_or_skip(backend, path)
    with DirectReader(path, backend=backend, queue_depth=4) as r:
        os.truncate(path, 5 * PAGE + 10)
        with pytest.raises(OocError, match=r"shrink\.bin.*short read"):
            r.read_pages(np.arange(8), aligned_empty(8 * PAGE))
        r.read_pages(np.arange(5), aligned_empty(5 * PAGE))  # still usable


def test_io_error_cqe(raw_file, monkeypatch):
    """A negative cqe res becomes an OocError naming the file and errno."""
    path, _ = raw_file
    backend_or_skip("liburing", path)
    with DirectReader(path, backend="liburing") as r:
        err = r._io.short_read(8192, 4096, -errno.EIO)
        assert isinstance(err, OocError) and "raw.bin" in str(err) and "errno 5" in str(err)
        # a bad fd makes every read fail with -EBADF in its cqe
        real_fd = r._io.fd
        r._io.fd = 10**6
        try:
            with pytest.raises(OocError, match=r"raw\.bin.*failed"):
                r.read_pages(np.arange(10), aligned_empty(10 * PAGE))
        finally:
            r._io.fd = real_fd
        out = aligned_empty(10 * PAGE)
        r.read_pages(np.arange(10), out)  # the ring survives


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_fd_leak(raw_file, backend):
    path, data = raw_file
    backend_or_skip(backend, path)
    gc.collect()
    before = _fds()
    for _ in range(5):
        r = DirectReader(path, backend=backend, queue_depth=8)
        r.read_pages(np.arange(10), aligned_empty(10 * PAGE))
        r.close()
        r.close()  # idempotent
    for _ in range(5):  # dropped without close(): the GC finalizer releases everything
        r = DirectReader(path, backend=backend, queue_depth=8)
        r.read_pages(np.arange(10), aligned_empty(10 * PAGE))
        del r
    gc.collect()
    assert _fds() == before
    r = DirectReader(path, backend=backend)
    r.close()
    with pytest.raises(OocError, match="closed"):
        r.read_pages(np.arange(1), aligned_empty(PAGE))


_CLOSE_RACE = """
import sys, threading, time
import numpy as np
from ooc.storage import DirectReader, aligned_empty
path, backend = sys.argv[1], sys.argv[2]
for trial in range(60):
    r = DirectReader(path, queue_depth=32, backend=backend)
    out = aligned_empty(256 * 4096)
    errors = []
    def loop():
        rng = np.random.default_rng(trial)
        try:
            while True:
                r.read_pages(np.unique(rng.integers(0, r.num_pages, 256)), out)
        except Exception as e:
            errors.append(str(e))
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.001 * (trial % 4))
    r.close()
    t.join()
    assert len(errors) == 1 and "reader is closed" in errors[0], errors
print("ok")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_while_another_thread_reads(tmp_path, backend):
    """close() waits for a read in progress and later reads raise: the ring is never
    unmapped under a running read (that was a segfault). In a child, so a crash fails
    the test instead of ending the run."""
    path = tmp_path / "f.bin"
    np.random.default_rng(0).integers(0, 256, 16 << 20, dtype=np.uint8).tofile(path)
    backend_or_skip(backend, path)
    r = subprocess.run([sys.executable, "-c", _CLOSE_RACE, str(path), backend],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


@pytest.fixture
def crashy(tmp_path, monkeypatch, request):
    """A stand-in native binding that kills its process with ``request.param`` (a signal
    name), registered first in the auto order, with its own empty verdict cache."""
    sig = getattr(request, "param", "SIGILL")
    mod = tmp_path / "mods"
    write_stand_in_binding(mod, f"crashy_{sig.lower()}", sig, version=f"0.{sig}")
    monkeypatch.syspath_prepend(str(mod))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(mod)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("OOC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(B.REGISTRY, "crashy", f"crashy_{sig.lower()}:Crash")
    monkeypatch.setitem(B.REGISTRY, "refusing", f"crashy_{sig.lower()}:Refuse")
    monkeypatch.setattr(B, "AUTO_ORDER", ("crashy", "preadv", "mmap"))
    probe.forget()
    yield sig
    probe.forget()


@pytest.mark.parametrize("crashy", ["SIGILL", "SIGSEGV"], indirect=True)
def test_binding_that_crashes_in_the_probe_falls_back(raw_file, crashy, note_lines, tmp_path,
                                                      monkeypatch):
    """A binding that dies of a signal is caught in the child; auto reads with the next
    backend and says so in one note; the verdict is cached for later processes."""
    path, data = raw_file
    gc.collect()
    before = _fds()
    r = DirectReader(path)
    assert r.backend != "crashy"
    assert note_lines == [f"ooc: note: crashy 0.{crashy} crashed in a probe ({crashy}); "
                          f"reading with {r.backend_label}"]
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()
    assert _fds() == before
    # an explicit request names the verdict
    with pytest.raises(OocError, match=rf"crashy unavailable: crashy 0.{crashy} crashed in a "
                                       rf"probe \({crashy}\)"):
        DirectReader(path, backend="crashy")
    # one note per process and reason, not one per reader
    DirectReader(path).close()
    assert len(note_lines) == 1
    # the verdict is on disk: a new process (memo forgotten) reads it without probing
    cached = list((tmp_path / "cache" / "probe").glob("crashy-*.json"))
    assert len(cached) == 1
    probe.forget()

    def no_child(*a, **k):
        raise AssertionError("probed again despite a cached verdict")

    monkeypatch.setattr(probe.subprocess, "run", no_child)
    with pytest.raises(OocError, match="crashed in a probe"):
        DirectReader(path, backend="crashy")


def test_refused_backend_falls_back(raw_file, crashy, note_lines, monkeypatch):
    """A backend that refuses (io_uring disabled, seccomp) is passed over by auto."""
    path, data = raw_file
    monkeypatch.setattr(B, "AUTO_ORDER", ("refusing", "preadv", "mmap"))
    r = DirectReader(path)
    assert r.backend == "preadv"
    assert note_lines == ["ooc: note: io_uring_setup failed: Operation not permitted; "
                          f"reading with {r.backend_label}"]
    r.close()
    with pytest.raises(OocError, match="refusing unavailable: io_uring_setup failed"):
        DirectReader(path, backend="refusing")


def test_o_direct_refused_falls_back(raw_file, monkeypatch, note_lines):
    """tmpfs-like: open(O_DIRECT) fails with EINVAL -> buffered preadv, one note."""
    path, data = raw_file
    real_open = os.open

    def no_direct(p, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(B.os, "open", no_direct)
    monkeypatch.setattr(B, "AUTO_ORDER", ("preadv", "mmap"))
    r = DirectReader(path, queue_depth=8)
    assert r.backend == "preadv" and not r.o_direct
    assert len(note_lines) == 1 and "O_DIRECT refused" in note_lines[0] \
        and note_lines[0].endswith("preadv threads (buffered)")
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()


def test_preadv_missing_falls_back_to_mmap(raw_file, monkeypatch, note_lines):
    path, data = raw_file
    monkeypatch.setattr(B, "AUTO_ORDER", ("preadv", "mmap"))
    monkeypatch.delattr(os, "preadv")
    r = DirectReader(path)
    assert r.backend == "mmap"
    assert note_lines == ["ooc: note: os.preadv not available; reading with mmap (page cache)"]
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()


def test_unknown_backend_is_refused(raw_file):
    with pytest.raises(ValueError, match="auto, "):
        DirectReader(raw_file[0], backend="nope")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_auto_on_tmpfs(note_lines):
    """tmpfs: O_DIRECT is refused on older kernels (fallback with a note), accepted on newer."""
    data = np.random.default_rng(3).integers(0, 256, 64 * PAGE, dtype=np.uint8)
    path = f"/dev/shm/ooc_test_direct_{os.getpid()}.bin"
    data.tofile(path)
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            os.close(fd)
            refused = False
        except OSError:
            refused = True
        r = DirectReader(path)
        if refused:
            assert not r.o_direct and any("O_DIRECT" in n for n in note_lines)
        out = aligned_empty(64 * PAGE)
        pages = np.array([0, 1, 5, 63])
        r.read_pages(pages, out)
        np.testing.assert_array_equal(out[: 4 * PAGE].reshape(4, PAGE), data.reshape(-1, PAGE)[pages])
        r.close()
    finally:
        os.unlink(path)


# ------------------------------------------------------------------ features
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(7, "float32"), (128, "float32"), (100, "float16"),
                                       (1024, "float32"), (3000, "float16"), (2048, "float16"),
                                       (3072, "float32"), (1500, "float32")])
def test_features_match_numpy(tmp_path, backend, dim, dtype):
    """Rows smaller than a page (7, 128, 100), exactly a page (1024 f32, 2048 f16), three
    pages (3072 f32) and not a multiple of a page (3000 f16, 1500 f32)."""
    path, lay, rows = feature_file(tmp_path, 500, dim, dtype)
    backend_or_skip(backend, path)
    rng = np.random.default_rng(dim)
    with DirectFeatures(path, lay, queue_depth=8, backend=backend) as f:
        assert f.shape == (500, dim) and f.dtype == np.dtype(dtype)
        for n in (0, 1, 37, 400, 2000):
            ids = rng.integers(0, 500, n)  # any order, with repeats
            got = f.read(ids)
            assert got.shape == (n, dim) and got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, rows[ids])
        ids = np.array([5, 5, 5, 4, 499, 0, 5])
        out = np.empty((7, dim), dtype)
        assert f.read(ids, out=out) is out
        np.testing.assert_array_equal(out, rows[ids])
        # pages are read once per request even when rows share them
        before = f.reader.stats.pages
        f.read(np.arange(500)[::-1])
        assert f.reader.stats.pages - before == lay.num_pages
        with pytest.raises(IndexError):
            f.read(np.array([500]))
        with pytest.raises(IndexError):
            f.read(np.array([-1]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(128, "float32"), (7, "float32"), (1500, "float32"),
                                       (3000, "float16")])
def test_large_requests_read_in_pieces_of_a_bounded_buffer(tmp_path, backend, dim, dtype):
    """A request needing more than ``max_pages`` pages is read in pieces: the same rows
    (any order, repeats, into chosen rows), each page still read once, and the page
    buffer never larger than ``max_pages`` pages; a bad id fails before any read."""
    path, lay, rows = feature_file(tmp_path, 700, dim, dtype)
    backend_or_skip(backend, path)
    rng = np.random.default_rng(dim)
    max_pages = 3 * lay.pages_per_row
    with DirectFeatures(path, lay, queue_depth=4, backend=backend, max_pages=max_pages) as f:
        for n in (1, 9, 300, 2000):
            ids = rng.integers(0, 700, n)
            ids[: n // 3] = ids[n // 3]  # repeats
            before = f.reader.stats.pages
            np.testing.assert_array_equal(f.read(ids), rows[ids])
            pages = np.unique(lay.row_offsets(np.unique(ids)) // PAGE)
            if lay.pages_per_row > 1:  # a padded row spans its pages
                pages = (pages[:, None] + np.arange(lay.pages_per_row)).ravel()
            assert f.reader.stats.pages - before == pages.shape[0]
            out = np.full((n + 5, dim), 3, dtype)
            dst = rng.permutation(n + 5)[:n]
            f.read_into(ids, out, dst)
            want = np.full((n + 5, dim), 3, dtype)
            want[dst] = rows[ids]
            np.testing.assert_array_equal(out, want)
        assert f.reader._scratch.size <= max_pages * PAGE
        before = f.reader.stats.pages
        with pytest.raises(IndexError, match="row id 700 out of range"):
            f.read(np.concatenate([np.arange(600), [700]]))
        assert f.reader.stats.pages == before


def _whole_rows_direct(backend) -> bool:
    """Whether this backend reads whole-page rows straight into the caller's rows."""
    return B.backend_class(backend).fresh_buffers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(1024, "float32"), (2048, "float32"), (3000, "float16"),
                                       (100, "float32")])
def test_feature_rows_take_the_direct_path_where_they_can(tmp_path, backend, dim, dtype):
    """Whole-page rows land in the returned array with no page buffer (counted in
    ``rows_direct``) on every backend that allows it; an O_DIRECT read into a caller's
    array that is not page-aligned, and rows that are not whole pages, go through the page
    buffer (``rows_copied``). Either way the bytes are numpy's."""
    path, lay, rows = feature_file(tmp_path, 400, dim, dtype)
    backend_or_skip(backend, path)
    whole = lay.row_bytes % PAGE == 0
    rng = np.random.default_rng(5)
    with DirectFeatures(path, lay, queue_depth=16, backend=backend) as f:
        direct = whole and _whole_rows_direct(backend)
        ids = rng.integers(0, 400, 300)
        got = f.read(ids)
        np.testing.assert_array_equal(got, rows[ids])
        assert (f.reader.stats.rows_direct, f.reader.stats.rows_copied) == ((300, 0) if direct else (0, 300))
        if direct:
            assert got.ctypes.data % PAGE == 0
        # a caller's page-aligned array
        out = aligned_empty(300 * lay.row_bytes).view(dtype).reshape(300, dim)
        f.reader.stats.reset()
        assert f.read(ids, out=out) is out
        np.testing.assert_array_equal(out, rows[ids])
        assert f.reader.stats.rows_direct == (300 if direct else 0)
        # a caller's array off a page boundary
        raw = aligned_empty(300 * lay.row_bytes + PAGE)
        off = raw[64:64 + 300 * lay.row_bytes].view(dtype).reshape(300, dim)
        f.reader.stats.reset()
        assert f.read(ids, out=off) is off
        np.testing.assert_array_equal(off, rows[ids])
        aligned_only = f.reader.o_direct or not direct
        assert f.reader.stats.rows_copied == (300 if aligned_only else 0)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if _whole_rows_direct(b)])
def test_whole_rows_merge_into_runs_only_where_the_target_is_contiguous(tmp_path, backend):
    """Rows next to each other in the file and in ``ids`` are one read (up to
    ``max_read_bytes``); rows next to each other in the file only are not; a repeated id
    is read once."""
    path, lay, rows = feature_file(tmp_path, 200, 2048, "float32")  # 2 pages a row
    backend_or_skip(backend, path)
    with DirectFeatures(path, lay, queue_depth=8, backend=backend,
                        max_read_bytes=6 * PAGE) as f:
        cases = [
            (np.arange(10, 19), 3, 18),             # 9 rows, 3 per run
            (np.arange(18, 9, -1), 9, 18),          # file order reversed in the target
            (np.array([7, 3, 7, 4, 7, 5]), 4, 8),   # 7 read once; 3, 4, 5 not adjacent in ids
            (np.array([3, 4, 5, 5, 6]), 2, 8),      # the repeat splits the target run
        ]
        for ids, ops, pages in cases:
            f.reader.stats.reset()
            np.testing.assert_array_equal(f.read(ids), rows[ids])
            assert (f.reader.stats.read_ops, f.reader.stats.pages) == (ops, pages), ids


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(1024, "float32"), (3072, "float32"), (100, "float16"),
                                       (1500, "float32")])
def test_read_into_chosen_rows(tmp_path, backend, dim, dtype):
    """``read_into`` fills exactly ``out[rows]`` (other rows untouched), repeated ids
    included, into a page-aligned array and into one off a page boundary."""
    path, lay, rows = feature_file(tmp_path, 300, dim, dtype)
    backend_or_skip(backend, path)
    rng = np.random.default_rng(9)
    with DirectFeatures(path, lay, queue_depth=8, backend=backend) as f:
        for shift in (0, 64):
            raw = aligned_empty(250 * lay.row_bytes + shift)
            out = raw[shift:].view(dtype).reshape(250, dim)
            out[:] = 7
            dst = rng.choice(250, 120, replace=False)
            ids = rng.integers(0, 300, 120)
            ids[:10] = ids[10]  # repeats
            assert f.read_into(ids, out, dst) is out
            want = np.full((250, dim), 7, dtype)
            want[dst] = rows[ids]
            np.testing.assert_array_equal(out, want)
            dst = np.arange(40, 60)  # consecutive rows into consecutive targets
            f.read_into(np.arange(100, 120), out, dst)
            np.testing.assert_array_equal(out[40:60], rows[100:120])
        assert f.read_into(np.array([], np.int64), out, np.array([], np.int64)) is out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(128, "float32"), (100, "float16"), (1024, "float32")])
def test_read_into_a_second_array_in_the_same_request(tmp_path, backend, dim, dtype):
    """``also=(ids2, out2, rows2)``: the second rows land in ``out2[rows2]``, and a page that
    holds rows of both requests is read once (rows smaller than a page)."""
    path, lay, rows = feature_file(tmp_path, 400, dim, dtype)
    backend_or_skip(backend, path)
    rng = np.random.default_rng(4)
    # no gap read through: the pages read are exactly the pages of the rows
    with DirectFeatures(path, lay, queue_depth=8, backend=backend, max_gap_bytes=0) as f:
        ids = rng.choice(400, 60, replace=False)
        ids2 = np.setdiff1d(rng.choice(400, 50, replace=False), ids)
        out = np.zeros((80, dim), dtype)
        out2 = np.zeros((len(ids2) + 5, dim), dtype)
        dst, dst2 = rng.choice(80, 60, replace=False), rng.permutation(len(ids2)) + 5
        f.reader.stats.reset()
        assert f.read_into(ids, out, dst, (ids2, out2, dst2)) is out
        np.testing.assert_array_equal(out[dst], rows[ids])
        np.testing.assert_array_equal(out2[dst2], rows[ids2])
        assert not out2[:5].any() and np.count_nonzero(out.any(axis=1)) <= 60
        rpp = max(lay.rows_per_page, 1)
        if lay.rows_per_page:
            assert f.reader.stats.pages == len(np.unique(np.concatenate((ids, ids2)) // rpp))
        with pytest.raises(ValueError, match="target row 99 out of range"):
            f.read_into(ids[:1], out, dst[:1], (ids2[:1], out2, np.array([99])))


def test_read_into_refuses_bad_targets(tmp_path):
    path, lay, _ = feature_file(tmp_path, 50, 1024, "float32")
    out = np.zeros((10, 1024), np.float32)
    with DirectFeatures(path, lay) as f:
        for ids, dst, words in [([1, 2], [0, 10], "target row 10 out of range [0, 10)"),
                                ([1, 2], [-1, 3], "target row -1 out of range"),
                                ([1, 2], [4, 4], "target row 4 given twice"),
                                ([1, 2, 3], [4, 5], "3 ids but 2 target rows")]:
            with pytest.raises(ValueError) as e:
                f.read_into(np.array(ids), out, np.array(dst))
            assert words in str(e.value) and "features_1024_float32.bin" in str(e.value)
            assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=r"float32 array of shape \(10, 1024\), got float64"):
            f.read_into(np.array([1]), np.zeros((10, 1024)), np.array([0]))
        with pytest.raises(IndexError, match="row id 50 out of range"):
            f.read_into(np.array([50]), out, np.array([0]))
        assert not out.any()


def test_feature_read_refuses_a_wrong_out(tmp_path):
    path, lay, rows = feature_file(tmp_path, 50, 1024, "float32")
    ids = np.array([1, 2, 3])
    with DirectFeatures(path, lay) as f:
        for bad in (np.empty((3, 1023), np.float32), np.empty((4, 1024), np.float32),
                    np.empty((3, 1024), np.float64), np.empty((1024, 3), np.float32).T,
                    np.empty((0, 1024), np.float32)):
            with pytest.raises(ValueError) as e:
                f.read(ids, out=bad)
            msg = str(e.value)
            assert "\n" not in msg and "features_1024_float32.bin" in msg
            assert "float32" in msg and "(3, 1024)" in msg
        empty = np.empty((0, 1024), np.float32)
        assert f.read(np.array([], np.int64), out=empty) is empty
        assert f.read(np.array([], np.int64)).shape == (0, 1024)
        assert f.reader.stats.requests == 0


def test_features_truncated(tmp_path):
    path, lay, _ = feature_file(tmp_path, 100, 128, "float32")
    os.truncate(path, lay.file_bytes - PAGE)
    with pytest.raises(OocError, match="features_128_float32.bin.*truncated"):
        DirectFeatures(path, lay)


# ---------------------------------------------------------------- ranges
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_index_ranges(tmp_path, backend):
    rng = np.random.default_rng(7)
    deg = rng.integers(0, 3000, 200)
    deg[::7] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)])
    indices = rng.integers(0, 2**31 - 1, int(indptr[-1]), dtype=np.int32)
    padded = np.zeros(-(-indices.nbytes // PAGE) * PAGE // 4, np.int32)
    padded[: indices.size] = indices
    path = tmp_path / "indices.bin"
    padded.tofile(path)
    backend_or_skip(backend, path)
    with DirectReader(path, backend=backend, queue_depth=16) as r:
        for n in (0, 1, 10, 200):
            nodes = rng.choice(200, size=n, replace=False) if n < 200 else np.arange(200)
            s, e = indptr[nodes], indptr[nodes + 1]
            vals, off = read_index_ranges(r, s, e, np.int32)
            for i, v in enumerate(nodes):
                np.testing.assert_array_equal(vals[off[i]: off[i] + e[i] - s[i]],
                                              indices[indptr[v]: indptr[v + 1]])
        # shared pages are read once
        before = r.stats.pages
        nodes = np.arange(200)
        read_index_ranges(r, indptr[nodes], indptr[nodes + 1])
        assert r.stats.pages - before == -(-indices.nbytes // PAGE)
        # byte-level helper, with a caller buffer
        buf = aligned_empty(8 * PAGE)
        b, off = read_ranges(r, np.array([10, 5000, 4090]), np.array([20, 5000, 4100]), out=buf)
        assert b is buf
        raw = padded.view(np.uint8)
        np.testing.assert_array_equal(b[off[0]:off[0] + 10], raw[10:20])
        np.testing.assert_array_equal(b[off[2]:off[2] + 10], raw[4090:4100])
        with pytest.raises(ValueError):
            read_ranges(r, np.array([10]), np.array([5]))


def test_repeated_reads_do_not_grow_memory(raw_file):
    """liburing's Iovec leaks a reference per memoryview it is given; the reader
    must not turn that into memory growing with every read."""
    import tracemalloc

    path, data = raw_file
    rng = np.random.default_rng(3)
    backend_or_skip("liburing", path)
    with DirectReader(path, backend="liburing") as r:
        buf = r.scratch(64 * PAGE)
        reqs = [np.unique(rng.integers(0, 300, 40)) for _ in range(300)]
        for p in reqs[:20]:
            r.read_pages(p, buf)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for p in reqs:
            r.read_pages(p, r.scratch(len(p) * PAGE))
            np.testing.assert_array_equal(
                r.scratch(len(p) * PAGE).reshape(-1, PAGE),
                data.reshape(-1, PAGE)[p])
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    # ~12,000 reads: a leaked 184-byte slice per read would be over 2 MB
    assert grown < 256 * 1024, grown


GIL_SCRIPT = r"""
import sys, threading
import numpy as np
import liburing as L
from ooc.storage.direct import DirectReader

path = sys.argv[1]
r = DirectReader(path, queue_depth=4, backend="liburing")
ring = r._io.ring
t = threading.Thread(target=r._io._submit_and_wait, args=(ring,))
t.start()          # nothing in flight: the thread sleeps until a completion is posted
x = sum(range(1000))  # runs only if that sleep released the GIL
sqe = L.io_uring_get_sqe(ring)
L.io_uring_prep_nop(sqe)
L.io_uring_submit(ring)  # the NOP's completion wakes the thread
t.join()
L.io_uring_cq_advance(ring, L.io_uring_cq_ready(ring))
r._io._cq_head += 1
out = r.scratch(4096)
r.read_pages(np.array([1], dtype=np.int64), out)  # the reader still works afterwards
assert out[0] == 0 and out[1] == 1, out[:4]
print("ok", x)
"""


def test_liburing_wait_releases_the_gil(tmp_path):
    """Waiting for completions must not hold the GIL: liburing's io_uring_submit_and_wait
    does, which froze the training thread for as long as every gather's reads took. The
    script deadlocks if it is held (hence a subprocess and a hang guard)."""
    import subprocess
    import sys

    f = tmp_path / "f.bin"
    f.write_bytes(np.arange(8192, dtype=np.uint8).tobytes())
    backend_or_skip("liburing", f)  # never import a binding the probe has not passed
    script = tmp_path / "gil.py"
    script.write_text(GIL_SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_rows_read_from_several_threads_at_once(tmp_path, backend):
    """Rows smaller than a page go through one page buffer: threads reading at once (the
    loaders of one memory budget, gather workers) each get their own rows."""
    path, lay, rows = feature_file(tmp_path, 5000, 24, "float32")  # 96 B rows
    backend_or_skip(backend, path)
    with DirectFeatures(path, lay, queue_depth=8, backend=backend) as f:
        def reader(k: int) -> None:
            rng = np.random.default_rng(k)
            for _ in range(60):
                ids = rng.integers(0, 5000, int(rng.integers(200, 3000)))
                np.testing.assert_array_equal(f.read(ids), rows[ids])

        errors = in_threads(reader)
    assert not errors, errors[0]
