"""The native io_uring engine (ooc.storage.io_uring) against numpy reads of the same files.

This machine's kernel has io_uring, so the engine must work here: where the
probe refuses it these tests fail instead of skipping.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, backend_or_skip, community_graph

from ooc.storage import PAGE, DirectFeatures, DirectReader, FeatureLayout, OocError, aligned_empty, probe
from ooc.storage import _uring_kernels as K
from ooc.storage import io_backends as B
from ooc.storage import io_uring as U

SHM = Path("/dev/shm")


def _write(path: Path, npages: int, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 256, npages * PAGE, dtype=np.uint8)
    data.tofile(path)
    return data


@pytest.fixture(params=["disk", "tmpfs"])
def data_file(request, tmp_path):
    """A random 1,027-page file on the test folder's file system, or on tmpfs."""
    if request.param == "tmpfs":
        if not SHM.is_dir():
            pytest.skip("no /dev/shm tmpfs on this machine")
        path = SHM / f"ooc-test-uring-{os.getpid()}.bin"
    else:
        path = tmp_path / "data.bin"
    data = _write(path, 1027)
    yield path, data
    path.unlink(missing_ok=True)


def _open(path, qd=64, **kw) -> DirectReader:
    r = DirectReader(path, queue_depth=qd, backend="io_uring", **kw)
    assert r.backend == "io_uring" and r.o_direct
    return r


def _ring_idle(st: np.ndarray) -> bool:
    """Nothing queued that the kernel has not taken, and no completion left unreaped."""
    return K.ring_backlog(st) == (0, 0)


def test_probe_passes_and_auto_picks_the_engine(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    _write(path, 4)
    monkeypatch.setenv("OOC_CACHE", str(tmp_path / "cache"))  # a real probe, not a cached one
    probe.forget()
    v = probe.verdict("io_uring", B.REGISTRY["io_uring"], str(path))
    assert v.ok, f"the io_uring engine's probe failed on a kernel with io_uring: {v.reason}"
    assert B.AUTO_ORDER[0] == "io_uring"
    assert len(list((tmp_path / "cache" / "probe").glob("io_uring-*.json"))) == 1
    with DirectReader(path) as r:
        assert r.backend == "io_uring" and r.backend_label == "io_uring (native)"
    probe.forget()


@pytest.mark.parametrize("backend", ["io_uring", "liburing", "preadv"])
def test_page_cache_reads_match_numpy(data_file, backend):
    """``page_cache=True``: the same backend reads without O_DIRECT (a file this process
    just wrote is copied from the page cache), the same bytes as numpy, any partial last
    page left out as with O_DIRECT."""
    path, data = data_file
    if backend == "liburing":  # a wheel that may need AVX-512: the probe decides
        backend_or_skip(backend, path)
    pages = np.unique(np.random.default_rng(5).integers(0, 1027, 300))
    with DirectReader(path, queue_depth=16, backend=backend, page_cache=True) as r:
        assert r.backend == backend and not r.o_direct
        out = aligned_empty(pages.shape[0] * PAGE)
        r.read_pages(pages, out)
    want = data.reshape(-1, PAGE)[pages].reshape(-1)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("qd", [1, 3, 64, 512])
def test_random_pages_match_numpy(data_file, qd):
    path, data = data_file
    ref = data.reshape(-1, PAGE)
    rng = np.random.default_rng(qd)
    with _open(path, qd, max_read_bytes=4 * PAGE) as r:
        for _ in range(8):
            k = int(rng.integers(1, 1027))
            pages = np.sort(rng.choice(1027, size=k, replace=False)).astype(np.int64)
            out = r.scratch(k * PAGE)
            r.read_pages(pages, out)
            np.testing.assert_array_equal(out.reshape(k, PAGE), ref[pages])
        assert r._io.reads_plain == 0 and r._io.reads_fixed > 0  # registered buffer used
        assert r._io.fixed_files
        assert _ring_idle(r._io._st)


def test_queue_much_smaller_than_request_wraps_the_ring(data_file):
    """2 slots, 1,027 single-page reads: the SQ and CQ wrap hundreds of times."""
    path, data = data_file
    with _open(path, 2, max_read_bytes=PAGE) as r:
        assert r._io.ring_entries == 2
        for _ in range(3):
            out = aligned_empty(1027 * PAGE)
            r.read_pages(np.arange(1027), out)
            np.testing.assert_array_equal(out, data)
        assert r.stats.read_ops == 3 * 1027
        assert _ring_idle(r._io._st)


@pytest.mark.parametrize("max_pages", [2, 7, 64])
def test_runs_of_several_pages(data_file, max_pages):
    path, data = data_file
    ref = data.reshape(-1, PAGE)
    # three long stretches of adjacent pages and a few strays: coalesced into runs
    pages = np.unique(np.concatenate([np.arange(3, 200), np.arange(400, 411),
                                      np.arange(600, 1027), [250, 252, 254]]))
    with _open(path, 16, max_read_bytes=max_pages * PAGE) as r:
        out = r.scratch(pages.size * PAGE)
        r.read_pages(pages, out)
        np.testing.assert_array_equal(out.reshape(-1, PAGE), ref[pages])
        assert r.stats.read_ops < pages.size  # merged
        assert r.stats.read_ops >= pages.size / max_pages


def test_feature_rows_match_numpy(tmp_path):
    lay = FeatureLayout(3000, 100, "float32")  # 10 rows per page
    x = np.random.default_rng(1).standard_normal((3000, 100)).astype(np.float32)
    path = tmp_path / "features.bin"
    buf = np.zeros(lay.file_bytes, np.uint8)
    for p in range(lay.num_pages):
        rows = x[p * 10:(p + 1) * 10].view(np.uint8).reshape(-1)
        buf[p * PAGE:p * PAGE + rows.size] = rows
    buf.tofile(path)
    ids = np.random.default_rng(2).integers(0, 3000, 5000)
    with DirectFeatures(path, lay, queue_depth=32, backend="io_uring") as f:
        assert f.backend == "io_uring"
        np.testing.assert_array_equal(f.read(ids), x[ids])


def test_rows_read_once_are_not_registered(tmp_path):
    """Whole-page rows read straight into a new array each call are plain reads (no
    registration per call); the page buffer of smaller rows stays registered once."""
    x = np.random.default_rng(3).standard_normal((700, 1024)).astype(np.float32)
    path = tmp_path / "features.bin"
    x.tofile(path)  # 4 KiB rows: the file is the rows
    rng = np.random.default_rng(4)
    with DirectFeatures(path, FeatureLayout(700, 1024, "float32"), queue_depth=16,
                        backend="io_uring") as f:
        io = f.reader._io
        kept = []
        for _ in range(5):
            ids = rng.integers(0, 700, 500)
            kept.append(f.read(ids))  # held
            np.testing.assert_array_equal(kept[-1], x[ids])
        assert io.registrations == 0 and io.reads_fixed == 0
        assert io.reads_plain == f.reader.stats.read_ops and f.reader.stats.rows_direct == 2500
        del kept
        # dropped each time: still new memory, read with plain reads
        plain, ops = io.reads_plain, f.reader.stats.read_ops
        for k in range(5):
            ids = rng.integers(0, 700, 500 - 10 * k)
            np.testing.assert_array_equal(f.read(ids), x[ids])
        assert io.registrations == 0 and io.reads_fixed == 0
        assert io.reads_plain - plain == f.reader.stats.read_ops - ops
    small = FeatureLayout(7000, 100, "float32")  # the same file as 10 rows per page
    y = x[:, :1000].reshape(7000, 100)
    with DirectFeatures(path, small, queue_depth=16, backend="io_uring") as f:
        io = f.reader._io
        f.reader.scratch(small.file_bytes)  # the page buffer at its largest: registered once
        for _ in range(5):
            ids = rng.integers(0, small.num_rows, 500)
            np.testing.assert_array_equal(f.read(ids), y[ids])
        assert io.registrations == 1 and io.reads_plain == 0 and f.reader.stats.rows_copied == 2500


def test_scratch_buffer_is_registered_once_per_growth(data_file):
    """Ranges read into the reader's page buffer register the whole buffer: larger
    requests that still fit in it do not register again."""
    from ooc.storage import read_ranges

    path, data = data_file
    with _open(path, 8) as r:
        r.scratch(200 * PAGE)
        for npages in (10, 50, 120, 200):
            starts = np.arange(npages, dtype=np.int64) * 5 * PAGE + 100
            buf, off = read_ranges(r, starts, starts + 10)
            np.testing.assert_array_equal(buf[off[-1]:off[-1] + 10],
                                          data[starts[-1]:starts[-1] + 10])
        assert r._io.registrations == 1 and r._io.reads_plain == 0


def test_unregistered_buffers_read_the_same(data_file, monkeypatch):
    """Buffers the kernel will not register are read with plain reads, and counted."""
    path, data = data_file
    ref = data.reshape(-1, PAGE)
    pages = np.arange(0, 1027, 3)
    with _open(path, 8) as r:
        monkeypatch.setattr(U, "MAX_FIXED_BYTES", PAGE)  # every buffer is too large
        out = aligned_empty(pages.size * PAGE)
        r.read_pages(pages, out)
        np.testing.assert_array_equal(out.reshape(-1, PAGE), ref[pages])
        assert r._io.reads_fixed == 0 and r._io.reads_plain == pages.size
        assert "over" in r._io.fixed_refused


def test_file_backed_buffer_refused_by_the_kernel_reads_plain(data_file, tmp_path):
    """The kernel does not register file-backed memory: such a buffer is read with plain
    reads (a real refusal, not a simulated one)."""
    path, data = data_file
    target = np.memmap(tmp_path / "target.bin", dtype=np.uint8, mode="w+", shape=(64 * PAGE,))
    assert target.ctypes.data % PAGE == 0
    with _open(path, 8) as r:
        r.read_pages(np.arange(64), target)
        np.testing.assert_array_equal(np.asarray(target), data[:64 * PAGE])
        assert r._io.reads_plain > 0 and r._io.registrations == 0
        assert r._io.fixed_refused.startswith("IORING_REGISTER_BUFFERS")
        # an anonymous buffer afterwards is registered
        out = r.scratch(8 * PAGE)
        r.read_pages(np.arange(8), out)
        assert r._io.registrations == 1
    del target


def test_buffer_registration_follows_the_buffer(data_file):
    """A registered buffer is reused; a larger part of the same memory widens the
    registration; other memory replaces it. Data stays right throughout."""
    path, data = data_file
    ref = data.reshape(-1, PAGE)
    with _open(path, 8) as r:
        big = aligned_empty(100 * PAGE)
        r.read_pages(np.arange(10), big[:10 * PAGE])
        r.read_pages(np.arange(5, 10), big[:5 * PAGE])
        assert r._io.registrations == 1
        r.read_pages(np.arange(50), big[:50 * PAGE])
        assert r._io.registrations == 2 and r._io._reg[0] is U._memory_owner(big)
        other = aligned_empty(20 * PAGE)
        r.read_pages(np.arange(100, 120), other)
        assert r._io.registrations == 3 and r._io._reg[0] is U._memory_owner(other)
        np.testing.assert_array_equal(big[:50 * PAGE].reshape(-1, PAGE), ref[:50])
        np.testing.assert_array_equal(other.reshape(-1, PAGE), ref[100:120])
        assert r._io.reads_plain == 0


def test_truncated_under_the_reader(tmp_path):
    path = tmp_path / "shrinks.bin"
    data = _write(path, 64)
    with _open(path, 16) as r:
        os.truncate(path, 40 * PAGE)
        out = r.scratch(64 * PAGE)
        # pages 30-63 are one run: 10 pages are read, then the end of the file
        with pytest.raises(OocError, match=r"shrinks\.bin: short read at offset 122880: "
                                           r"got 40960 of 139264 bytes"):
            r.read_pages(np.arange(30, 64), out)
        assert _ring_idle(r._io._st)
        np.testing.assert_array_equal(out[:10 * PAGE], data[30 * PAGE:40 * PAGE])
        with pytest.raises(OocError, match=r"shrinks\.bin: short read at offset \d+: got 0 of"):
            r.read_pages(np.arange(0, 64, 2), out)
        assert _ring_idle(r._io._st)  # everything in flight was reaped before the raise
        # a partial last block: the remainder is resubmitted, which fails past the end
        os.truncate(path, 40 * PAGE + 100)
        with pytest.raises(OocError, match=r"short read at offset 163840: got 100 of 4096"):
            r._io.read_runs(np.array([40 * PAGE]), np.array([PAGE]), np.array([0]), out)
        # the reader still works for what is left
        r.read_pages(np.arange(0, 40, 3), out)
        np.testing.assert_array_equal(out[:14 * PAGE].reshape(-1, PAGE),
                                      data.reshape(-1, PAGE)[0:40:3])


def test_failed_read_drains_the_ring(tmp_path):
    """One run fails (unaligned O_DIRECT offset: EINVAL) among many in flight: the call
    returns only when every read has completed, and reports the failing run."""
    path = tmp_path / "f.bin"
    _write(path, 256)
    with _open(path, 64) as r:
        io = r._io
        offs = np.arange(256, dtype=np.int64) * PAGE
        offs[100] += 512 + 1  # not block aligned
        lens = np.full(256, PAGE, np.int64)
        bufs = np.arange(256, dtype=np.int64) * PAGE
        out = r.scratch(256 * PAGE)
        err = np.zeros(3, np.int64)
        st = io._st
        rc = K.read_runs(st, 0, io.fixed_files, offs, lens, bufs, out.ctypes.data, -1, 64, err)
        assert rc == K.READ_FAILED and err[0] == 100 and err[2] == -errno.EINVAL
        assert _ring_idle(st)
        with pytest.raises(OocError, match=r"f\.bin: read of 4096 bytes at offset \d+ failed: "
                                           r"Invalid argument"):
            io.read_runs(offs, lens, bufs, out)


def test_short_reads_are_resubmitted_and_the_wait_releases_the_gil(tmp_path):
    """A pipe delivers an 8 KiB run in two 4 KiB writes: the first completion is short and
    the remainder must be resubmitted. The writes come from this interpreter's main
    thread while the engine waits in another thread: if the wait held the GIL they could
    never run (the child would hang; hence a subprocess with a timeout)."""
    f = tmp_path / "f.bin"
    _write(f, 2)
    script = tmp_path / "gil.py"
    script.write_text(r"""
import os, sys, threading, time
import numpy as np
from ooc.storage import DirectReader, aligned_empty
from ooc.storage import _uring_kernels as K

r = DirectReader(sys.argv[1], queue_depth=4, backend="io_uring")
rfd, wfd = os.pipe()
out = aligned_empty(8192)
err = np.zeros(3, np.int64)
z = np.zeros(1, np.int64)
rc = []
t = threading.Thread(target=lambda: rc.append(K.read_runs(
    r._io._st, rfd, False, z, np.full(1, 8192, np.int64), z, out.ctypes.data, -1, 4, err)))
t.start()
a = np.arange(4096, dtype=np.uint8)
b = (np.arange(4096) * 7 % 251).astype(np.uint8)
time.sleep(0.2)
os.write(wfd, a.tobytes())      # runs only while the engine waits without the GIL
time.sleep(0.2)
os.write(wfd, b.tobytes())
t.join()
assert rc == [K.OK], (rc, err)
assert (out[:4096] == a).all() and (out[4096:] == b).all()
print("ok")
""")
    res = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_closed_reader_and_no_leaks(tmp_path):
    path = tmp_path / "f.bin"
    _write(path, 8)

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def ring_maps() -> int:
        with open("/proc/self/maps") as m:
            return sum("io_uring" in line for line in m)

    before_fds, before_maps = fds(), ring_maps()
    for _ in range(20):
        r = _open(path, 32)
        r.read_pages(np.arange(8), r.scratch(8 * PAGE))
        assert fds() >= before_fds + 2 and ring_maps() > before_maps  # file + ring
        r.close()
        r.close()
    assert fds() == before_fds and ring_maps() == before_maps
    with pytest.raises(OocError, match="f.bin: reader is closed"):
        r.read_pages(np.arange(2), aligned_empty(2 * PAGE))
    b = U.NativeUringBackend(str(path), 8 * PAGE, 4)
    b.close()
    with pytest.raises(OocError, match=r"f\.bin: io_uring reader is closed"):
        b.read_runs(np.zeros(1, np.int64), np.full(1, PAGE, np.int64), np.zeros(1, np.int64),
                    aligned_empty(PAGE))
    assert fds() == before_fds


def test_refused_without_o_direct(tmp_path, monkeypatch):
    """A file system that refuses O_DIRECT refuses the engine (auto goes on to preadv)."""
    path = tmp_path / "f.bin"
    _write(path, 2)
    real_open = os.open

    def no_direct(p, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    with pytest.raises(B.Refused, match="O_DIRECT refused"):
        U.NativeUringBackend(str(path), 2 * PAGE, 4)


def test_setup_refusals_are_words():
    assert "ENOSYS" in U._setup_refusal(errno.ENOSYS)
    assert U._setup_refusal(errno.EPERM).startswith("io_uring_setup refused (EPERM): ")


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    return community_graph(tmp_path_factory.mktemp("uring") / "tiny")


@pytest.mark.parametrize("mode", ["ooc", "static"])
def test_train_modes_read_with_the_engine(tiny_dataset, tmp_path, mode):
    rep = tmp_path / "r.json"
    res = subprocess.run(
        [sys.executable, "-m", "ooc.train", "--data", str(tiny_dataset), "--mode", mode,
         "--epochs", "1", "--batch-size", "50", "--fanouts", "5,5", "--hidden", "8",
         "--no-progress", "--no-eval", "--report", str(rep)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    info = json.loads(rep.read_text())["mode_info"]
    assert info["reader_backend"] == "io_uring"
    assert info["neighbor_reader_backend"] == "io_uring"
    assert "ooc: note:" not in res.stderr  # no fallback


def test_forked_child_refuses_the_parents_ring(tmp_path):
    """The ring's memory is shared with a forked child: reading through it from both would
    mix their requests, so the child gets an error naming the file instead."""
    path = tmp_path / "f.bin"
    data = _write(path, 4)
    with _open(path, 4) as r:
        out = r.scratch(4 * PAGE)
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                r.read_pages(np.arange(4), out)
            except OocError as e:
                code = 0 if "f.bin: io_uring reader opened by process" in str(e) else 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        r.read_pages(np.arange(4), out)  # the parent's reader is untouched
        np.testing.assert_array_equal(out, data)


def test_runs_longer_than_one_sqe_are_split(tmp_path, monkeypatch):
    """A run longer than one SQE may read is read in several: each SQE's length is capped and
    the remainder goes through the short-read path."""
    path = tmp_path / "f.bin"
    data = _write(path, 64)
    monkeypatch.setattr(K, "MAX_SQE_BYTES", 3 * PAGE)
    # the kernels read the module global at compile time: compile fresh copies of the one
    # that queues the reads and of read_runs, which then calls it
    import numba as nb

    monkeypatch.setattr(K, "_fill_queue", nb.njit(nogil=True)(K._fill_queue.py_func))
    capped = nb.njit(nogil=True)(K.read_runs.py_func)
    with _open(path, 4) as r:
        out = r.scratch(64 * PAGE)
        err = np.zeros(3, np.int64)
        tail0 = int(r._io._st[K.S_SQ_TAIL_LOCAL])
        rc = capped(r._io._st, 0, r._io.fixed_files, np.array([0, 10 * PAGE]),
                    np.array([10 * PAGE, 54 * PAGE]), np.array([0, 10 * PAGE]),
                    out.ctypes.data, -1, 4, err)
        assert rc == K.OK
        np.testing.assert_array_equal(out, data)
        assert _ring_idle(r._io._st)
        assert int(r._io._st[K.S_SQ_TAIL_LOCAL]) - tail0 == 4 + 18  # ceil(10/3) + ceil(54/3)


SECCOMP_SCRIPT = r"""
import ctypes, struct, sys
import numpy as np

errno_value = int(sys.argv[2])
# seccomp filter: io_uring_setup (425) fails with errno_value, everything else is allowed
prog = [(0x20, 0, 0, 0),                      # A = seccomp_data.nr
        (0x15, 0, 1, 425),                    # if A == 425
        (0x06, 0, 0, 0x00050000 | errno_value),  # return ERRNO(errno_value)
        (0x06, 0, 0, 0x7FFF0000)]             # return ALLOW
raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
buf = ctypes.create_string_buffer(raw)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0                                   # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER

from ooc.storage import DirectReader, OocError
from ooc.storage.io_backends import Refused
from ooc.storage.io_uring import NativeUringBackend

path = sys.argv[1]
try:
    NativeUringBackend(path, 8192, 4)
    print("not refused")
    sys.exit(1)
except Refused as e:
    print("refused:", e)
try:
    DirectReader(path, backend="io_uring")
    print("explicit backend opened")
    sys.exit(1)
except OocError as e:
    print("explicit:", e)
with DirectReader(path) as r:  # auto: the probe child inherits the filter, so it refuses too
    print("auto:", r.backend)
"""


@pytest.mark.parametrize("err,words", [(errno.EPERM, "io_uring_setup refused (EPERM): "),
                                       (errno.ENOSYS, "this kernel has no io_uring (ENOSYS)")])
def test_refused_where_io_uring_is_forbidden(tmp_path, err, words):
    """Under a seccomp filter that fails io_uring_setup (as container runtimes do), the
    engine is refused with the reason (no crash) and ``auto`` reads with another backend."""
    f = tmp_path / "f.bin"
    _write(f, 2)
    script = tmp_path / "seccomp.py"
    script.write_text(SECCOMP_SCRIPT)
    env = dict(os.environ, OOC_CACHE=str(tmp_path / "cache"))  # keep this verdict to itself
    res = subprocess.run([sys.executable, str(script), str(f), str(err)], capture_output=True,
                         text=True, timeout=300, cwd=REPO, env=env)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("refused: ") and words in lines[0]
    assert lines[1].startswith("explicit: ") and words in lines[1]
    assert "f.bin: I/O backend io_uring unavailable" in lines[1]
    assert lines[2] in ("auto: preadv", "auto: liburing")
    note = [ln for ln in res.stderr.splitlines() if ln.startswith("ooc: note: ")]
    assert len(note) == 1 and f"io_uring {U.NativeUringBackend.version()} refused: " in note[0]
    reader = {"auto: preadv": "preadv threads (O_DIRECT)",
              "auto: liburing": "io_uring (python liburing)"}[lines[2]]
    assert words in note[0] and note[0].endswith(f"reading with {reader}")
