"""``io_uring`` backend: O_DIRECT + io_uring with the submit/reap loop in compiled code
(or buffered reads through the page cache, when the reader asks for them).

No binding: :mod:`._uring_kernels` makes the ``io_uring_setup`` /
``io_uring_enter`` / ``io_uring_register`` system calls itself and works on
the mmapped rings in numba ``nopython``/``nogil`` code, so a batch of reads
costs one Python call and no Python per read, and the GIL is released for
the whole batch, waits included.

What a batch does: the runs (planned by the reader: pages deduplicated,
adjacent pages merged) go into the ring ``queue_depth`` at a time and each
completion is replaced by the next run at once (the queue stays full). A
short read is resubmitted for its remainder, ``EAGAIN``/``EINTR`` are
retried, and after the first failed read nothing new is submitted and the
reads in flight are reaped before the error is raised (``OocError`` naming
the file), so no read is left writing into a buffer handed back.

Registered resources: the file is registered once (``IOSQE_FIXED_FILE``);
a buffer that will be read into again (``reuse=True``: the reader's page
buffer) is registered
(``IORING_OP_READ_FIXED``: the kernel does not pin its pages per read) the
first time it is seen, and re-registered when a later such buffer lies
outside it. A buffer read into once (``reuse=False``: new row memory, a
caller's ``out``) is read with plain ``IORING_OP_READ`` unless it lies in the
registered buffer: registering costs more than it saves on one batch (about
14 ms per 32 MiB). The backend keeps a
reference to the array owning the registered memory, so the memory cannot be
freed (and its address reused by other pages) while the kernel holds it.
Where the kernel refuses the registration (``RLIMIT_MEMLOCK`` for users
without ``CAP_IPC_LOCK``, file-backed memory), that buffer is read with
plain ``IORING_OP_READ``; :attr:`NativeUringBackend.reads_fixed` and
:attr:`~NativeUringBackend.reads_plain` count both.

Refused (``Refused``, so ``auto`` goes on to the next backend) when the
kernel has no io_uring (``ENOSYS``), forbids it (``EPERM``: seccomp, a
container policy, ``kernel.io_uring_disabled``) or the file system refuses
``O_DIRECT``.
"""
from __future__ import annotations

import errno
import os
import time

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.core.version import __version__
from ooc.storage import _uring_kernels as K
from ooc.storage.io_backends import ReadBackend, Refused

#: Bump when the engine changes (part of the probe's cache key, with ooc's and numba's versions).
ENGINE_VERSION = 3
#: Largest buffer the kernel registers as one (IORING_REGISTER_BUFFERS caps an iovec at 1 GiB).
MAX_FIXED_BYTES = 1 << 30
_SYSCTL = "/proc/sys/kernel/io_uring_disabled"
# Buffers that may still have reads in flight after a failed io_uring_enter (the ring
# was closed under them): kept alive for the life of the process, never reused.
_QUARANTINE: list = []


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _memory_owner(a: np.ndarray) -> np.ndarray:
    """The array at the root of ``a``'s chain of views (it keeps ``a``'s memory alive)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _setup_refusal(e: int) -> str:
    if e == errno.ENOSYS:
        return "io_uring_setup: this kernel has no io_uring (ENOSYS)"
    if e == errno.EPERM:
        try:
            with open(_SYSCTL) as f:
                level = f.read().strip()
        except OSError:
            level = ""
        why = (f"kernel.io_uring_disabled = {level}" if level not in ("", "0")
               else "a seccomp filter or container policy")
        return f"io_uring_setup refused (EPERM): {why}"
    return f"io_uring_setup failed: {os.strerror(e)} (errno {e})"


class NativeUringBackend(ReadBackend):
    """O_DIRECT reads through an io_uring ring driven by :mod:`._uring_kernels`.

    Attributes:
        fixed_files: whether the file is registered with the ring.
        reads_fixed, reads_plain: runs read into registered / unregistered buffers.
        busy_s: seconds spent in the engine (submitting, waiting, reaping).
        registrations: buffer registrations made.
        fixed_refused: why the last refused buffer registration failed ('' if none).
    """

    name = "io_uring"
    label = "io_uring (native)"
    probe_in_child = True

    @classmethod
    def version(cls) -> str:
        """ooc's version, :data:`ENGINE_VERSION` and numba's (which compiles the engine)."""
        import numba


        return f"{__version__}+engine{ENGINE_VERSION}+numba{numba.__version__}"

    def __init__(self, path: str, size: int, queue_depth: int, page_cache: bool = False):
        super().__init__(path, size, queue_depth, page_cache)
        self.fd = -1
        self._st = np.full(K.NSTATE, -1, np.int64)
        self._reg: tuple[np.ndarray, int, int] | None = None  # (owner, start, end)
        self._reg_refused: tuple[np.ndarray, int, int] | None = None
        self._broken = ""
        self.fixed_files = False
        self.reads_fixed = self.reads_plain = self.registrations = 0
        self.busy_s = 0.0
        self.fixed_refused = ""
        self.fd = self.open_fd()
        self.require_o_direct()
        st = np.zeros(K.NSTATE, np.int64)
        entries = _pow2(queue_depth)
        r = K.ring_open(entries, K.IORING_SETUP_CLAMP | K.IORING_SETUP_COOP_TASKRUN, st)
        if r == -errno.EINVAL:  # kernels before 5.19 have no COOP_TASKRUN
            r = K.ring_open(entries, 0, st)
        if r < 0:
            self.close()
            raise Refused(_setup_refusal(-r))
        self._st = st
        self._pid = os.getpid()
        fds = np.array([self.fd], np.int32)
        self.fixed_files = K.ring_register(st, K.IORING_REGISTER_FILES, fds.ctypes.data, 1) == 0

    @property
    def ring_entries(self) -> int:
        """SQ entries of the ring (``queue_depth`` rounded up to a power of two)."""
        return int(self._st[K.S_SQ_ENTRIES])

    def close(self) -> None:
        if self._st[K.S_RING_FD] >= 0:
            K.ring_close(self._st)
        self._reg = self._reg_refused = None
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    # ------------------------------------------------------------------ buffers
    def _buffer_index(self, out: np.ndarray, reuse: bool) -> int:
        """0 when ``out`` lies in the registered buffer (registering it now if needed and
        ``reuse``), -1 when it is read with plain reads (used once, or its registration was
        refused)."""
        a = out.ctypes.data
        e = a + out.nbytes
        reg = self._reg
        if reg is not None and reg[1] <= a and e <= reg[2]:
            return 0
        if not reuse:
            return -1
        ref = self._reg_refused
        if ref is not None and ref[1] <= a and e <= ref[2]:
            return -1
        owner = _memory_owner(out)
        start, end = a, e
        if reg is not None and reg[0] is owner:  # the same memory, a larger part of it
            start, end = min(start, reg[1]), max(end, reg[2])
        if end - start > MAX_FIXED_BYTES:
            self._reg_refused = (owner, a, e)
            self.fixed_refused = f"buffer of {e - a} bytes is over {MAX_FIXED_BYTES}"
            return -1
        st = self._st
        if reg is not None:
            self._reg = None
            K.ring_register(st, K.IORING_UNREGISTER_BUFFERS, 0, 0)
        iov = np.array([start, end - start], np.int64)  # struct iovec
        r = K.ring_register(st, K.IORING_REGISTER_BUFFERS, iov.ctypes.data, 1)
        if r < 0:
            self._reg_refused = (owner, a, e)
            self.fixed_refused = f"IORING_REGISTER_BUFFERS: {os.strerror(-r)}"
            return -1
        self._reg = (owner, start, end)
        self.registrations += 1
        return 0

    # --------------------------------------------------------------------- read
    def read_runs(self, offs, lens, bufs, out, reuse: bool = True) -> None:
        if self._st[K.S_RING_FD] < 0:
            raise InvalidValue(f"{self.path}: io_uring reader is closed" + (
                f" ({self._broken})" if self._broken else ""))
        if os.getpid() != self._pid:  # a forked child shares the parent's ring memory
            raise InvalidValue(f"{self.path}: io_uring reader opened by process {self._pid} used in "
                           f"process {os.getpid()} (after a fork): open a reader in this process")
        offs = np.ascontiguousarray(offs, dtype=np.int64)
        lens = np.ascontiguousarray(lens, dtype=np.int64)
        bufs = np.ascontiguousarray(bufs, dtype=np.int64)
        n = offs.shape[0]
        if n == 0:
            return
        idx = self._buffer_index(out, reuse)
        err = np.zeros(3, np.int64)
        fd = 0 if self.fixed_files else self.fd
        t0 = time.perf_counter()
        r = K.read_runs(self._st, fd, self.fixed_files, offs, lens, bufs, out.ctypes.data,
                        idx, self.queue_depth, err)
        self.busy_s += time.perf_counter() - t0
        if idx >= 0:
            self.reads_fixed += n
        else:
            self.reads_plain += n
        if r == K.OK:
            return
        if r == K.READ_FAILED:
            i, got, res = (int(x) for x in err)
            if res == 0 or (res == -errno.EINVAL and got > 0):
                # end of file (an O_DIRECT remainder past a partial last block is EINVAL)
                raise self.short_read(int(offs[i]), int(lens[i]), got)
            raise self.short_read(int(offs[i]) + got, int(lens[i]) - got, res)
        # io_uring_enter itself failed: reads may still be in flight into ``out``
        _QUARANTINE.append(_memory_owner(out))
        self._broken = f"io_uring_enter failed: {os.strerror(-r)}"
        K.ring_close(self._st)
        raise InvalidValue(f"{self.path}: {self._broken} (errno {-r}); the reader is closed")
