"""Direct reader: every backend against plain numpy reads of the same file."""
from __future__ import annotations

import errno
import gc
import os
import warnings

import numpy as np
import pytest

from ooc.storage import (
    PAGE, DirectFeatures, DirectIOFallbackWarning, DirectReader, FeatureLayout, OocError,
    aligned_empty, read_index_ranges, read_ranges,
)
from ooc.storage import direct as D

BACKENDS = ["io_uring", "preadv", "mmap"]


def _available(backend: str, path) -> bool:
    try:
        DirectReader(path, backend=backend).close()
        return True
    except OocError:
        return False


@pytest.fixture
def raw_file(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=301 * PAGE, dtype=np.uint8)  # not a multiple of the queue
    path = tmp_path / "raw.bin"
    data.tofile(path)
    return path, data


def _backend_or_skip(backend, path):
    if not _available(backend, path):
        pytest.skip(f"{backend} unavailable here")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def _fresh_warnings():
    D._warned.clear()
    yield
    D._warned.clear()


def test_aligned_empty():
    for n in (0, 1, 4096, 12345):
        a = aligned_empty(n)
        assert a.dtype == np.uint8 and a.size == n and (n == 0 or a.ctypes.data % 4096 == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qd", [1, 4, 64])
def test_random_pages(raw_file, backend, qd):
    path, data = raw_file
    _backend_or_skip(backend, path)
    pages_ref = data.reshape(-1, PAGE)
    rng = np.random.default_rng(qd)
    with DirectReader(path, queue_depth=qd, backend=backend, max_read_bytes=3 * PAGE) as r:
        assert r.backend == backend
        for trial in range(6):
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
    _backend_or_skip(backend, path)
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
    _backend_or_skip(backend, path)
    with DirectReader(path, backend=backend) as r:
        out = aligned_empty(4 * PAGE)
        r.read_pages(np.arange(3), out)
        with pytest.raises(OocError, match=r"short\.bin.*partial last page"):
            r.read_pages(np.arange(4), out)


@pytest.mark.parametrize("backend", ["io_uring", "preadv"])
def test_file_shrinks_under_the_reader(tmp_path, backend):
    path = tmp_path / "shrink.bin"
    np.zeros(8 * PAGE, np.uint8).tofile(path)
    _backend_or_skip(backend, path)
    with DirectReader(path, backend=backend, queue_depth=4) as r:
        os.truncate(path, 5 * PAGE + 10)
        with pytest.raises(OocError, match=r"shrink\.bin.*short read"):
            r.read_pages(np.arange(8), aligned_empty(8 * PAGE))
        r.read_pages(np.arange(5), aligned_empty(5 * PAGE))  # still usable


def test_io_error_cqe(raw_file, monkeypatch):
    """A negative cqe res becomes an OocError naming the file and errno."""
    path, _ = raw_file
    _backend_or_skip("io_uring", path)
    with DirectReader(path, backend="io_uring") as r:
        err = r._short(8192, 4096, -errno.EIO)
        assert isinstance(err, OocError) and "raw.bin" in str(err) and "errno 5" in str(err)
        # a bad fd makes every read fail with -EBADF in its cqe
        real_fd = r._h.fd
        r._h.fd = 10**6
        try:
            with pytest.raises(OocError, match=r"raw\.bin.*failed"):
                r.read_pages(np.arange(10), aligned_empty(10 * PAGE))
        finally:
            r._h.fd = real_fd
        out = aligned_empty(10 * PAGE)
        r.read_pages(np.arange(10), out)  # the ring survives


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_fd_leak(raw_file, backend):
    path, data = raw_file
    _backend_or_skip(backend, path)
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


def test_io_uring_unavailable_falls_back(raw_file, monkeypatch):
    path, data = raw_file

    def refuse(*a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(D._L, "io_uring_queue_init", refuse)
    gc.collect()
    before = _fds()
    with pytest.warns(DirectIOFallbackWarning, match=r"preadv.*io_uring_queue_init failed") as rec:
        r = DirectReader(path)
    assert len(rec) == 1
    assert r.backend == "preadv"
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()
    assert _fds() == before
    with pytest.raises(OocError, match="io_uring unavailable"):
        DirectReader(path, backend="io_uring")
    # one warning per process and reason, not one per reader
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DirectReader(path).close()


def test_o_direct_refused_falls_back(raw_file, monkeypatch):
    """tmpfs-like: open(O_DIRECT) fails with EINVAL -> buffered preadv, one warning."""
    path, data = raw_file
    real_open = os.open

    def no_direct(p, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(D.os, "open", no_direct)
    with pytest.warns(DirectIOFallbackWarning, match=r"preadv threads \(buffered\).*O_DIRECT") as rec:
        r = DirectReader(path, queue_depth=8)
    assert len(rec) == 1 and r.backend == "preadv" and not r.o_direct
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()


def test_preadv_missing_falls_back_to_mmap(raw_file, monkeypatch):
    path, data = raw_file
    monkeypatch.setattr(D._L, "io_uring_queue_init",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSYS, "nosys")))
    monkeypatch.delattr(D.os, "preadv")
    with pytest.warns(DirectIOFallbackWarning, match="mmap"):
        r = DirectReader(path)
    assert r.backend == "mmap"
    out = aligned_empty(301 * PAGE)
    r.read_pages(np.arange(301), out)
    np.testing.assert_array_equal(out, data)
    r.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_auto_on_tmpfs():
    """tmpfs: O_DIRECT is refused on older kernels (fallback with a warning), accepted on newer."""
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
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            r = DirectReader(path)
        fallback = [w for w in rec if issubclass(w.category, DirectIOFallbackWarning)]
        if refused:
            assert r.backend != "io_uring" and len(fallback) == 1
        out = aligned_empty(64 * PAGE)
        pages = np.array([0, 1, 5, 63])
        r.read_pages(pages, out)
        np.testing.assert_array_equal(out[: 4 * PAGE].reshape(4, PAGE), data.reshape(-1, PAGE)[pages])
        r.close()
    finally:
        os.unlink(path)


# ------------------------------------------------------------------ features
def _feature_file(tmp_path, num_rows, dim, dtype, seed=0):
    lay = FeatureLayout(num_rows, dim, dtype)
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((num_rows, dim)).astype(dtype)
    buf = np.zeros(lay.file_bytes, np.uint8)
    lay.view(buf)[0:num_rows] = rows
    path = tmp_path / f"features_{dim}_{dtype}.bin"
    buf.tofile(path)
    return path, lay, rows


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,dtype", [(7, "float32"), (128, "float32"), (100, "float16"),
                                       (1024, "float32"), (3000, "float16"), (2048, "float16")])
def test_features_match_numpy(tmp_path, backend, dim, dtype):
    path, lay, rows = _feature_file(tmp_path, 500, dim, dtype)
    _backend_or_skip(backend, path)
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
        before = f.stats.pages
        f.read(np.arange(500)[::-1])
        assert f.stats.pages - before == lay.num_pages
        with pytest.raises(IndexError):
            f.read(np.array([500]))
        with pytest.raises(IndexError):
            f.read(np.array([-1]))


def test_features_truncated(tmp_path):
    path, lay, _ = _feature_file(tmp_path, 100, 128, "float32")
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
    _backend_or_skip(backend, path)
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
    with DirectReader(path, backend="io_uring") as r:
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
r = DirectReader(path, queue_depth=4)
if r.backend != "io_uring":
    print("skip: backend", r.backend)
    sys.exit(0)
ring = r._h.ring
t = threading.Thread(target=r._submit_and_wait, args=(ring,))
t.start()          # nothing in flight: the thread sleeps until a completion is posted
x = sum(range(1000))  # runs only if that sleep released the GIL
sqe = L.io_uring_get_sqe(ring)
L.io_uring_prep_nop(sqe)
L.io_uring_submit(ring)  # the NOP's completion wakes the thread
t.join()
L.io_uring_cq_advance(ring, L.io_uring_cq_ready(ring))
r._cq_head += 1
out = r.scratch(4096)
r.read_pages(np.array([1], dtype=np.int64), out)  # the reader still works afterwards
assert out[0] == 0 and out[1] == 1, out[:4]
print("ok", x)
"""


def test_io_uring_wait_releases_the_gil(tmp_path):
    """Waiting for completions must not hold the GIL: liburing's io_uring_submit_and_wait
    does, which froze the training thread for as long as every gather's reads took. The
    script deadlocks if it is held (hence a subprocess and a hang guard)."""
    import subprocess
    import sys

    pytest.importorskip("liburing")
    f = tmp_path / "f.bin"
    f.write_bytes(np.arange(8192, dtype=np.uint8).tobytes())
    script = tmp_path / "gil.py"
    script.write_text(GIL_SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True,
                       timeout=120)
    if r.stdout.startswith("skip"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]
