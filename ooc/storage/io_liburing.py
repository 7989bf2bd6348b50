"""``liburing`` backend: O_DIRECT + io_uring through the python ``liburing`` binding.

The binding is a binary wheel (Cython + Zig); some releases use AVX-512 and
kill the interpreter with SIGILL on CPUs without it, so the backend is
probed in a child process before a process first imports it
(``probe_in_child``). Supported: releases with the ``Ring`` API (2025 and
later, checked on 2026.3.30); 2024.x has no ``Ring`` and is refused with
that reason.

Cost model: some Python per read (one SQE and one CQE through the binding);
adjacent pages are coalesced into one read upstream. Completions
are waited for on an eventfd, which releases the GIL (the binding's
``io_uring_submit_and_wait`` holds it, freezing every other thread).
"""
from __future__ import annotations

import errno
import os
from importlib import metadata
from typing import Any

import numpy as np

from ooc.core.errors import OocError
from ooc.storage.io_backends import ReadBackend, Refused
from ooc.storage.layout import PAGE

_L: Any = None  # the binding (an untyped module), imported by the first backend opened


def _binding():
    global _L
    if _L is None:
        try:
            import liburing
        except Exception as e:  # noqa: BLE001 - any import failure refuses the backend
            raise Refused(f"liburing not importable: {e}") from None
        if not hasattr(liburing, "Ring"):
            raise Refused(f"liburing {LiburingBackend.version()} has no Ring API "
                          f"(need a 2025 or later release)")
        _L = liburing
    return _L


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# liburing's ``Iovec`` keeps a reference to, and a buffer export of, every
# memoryview it is given and never gives them back (checked on liburing
# 2026.3.30: a fresh slice per read leaked the slice and pinned its buffer,
# RSS grew every epoch). So each page of a buffer gets one memoryview,
# made once and reused by every read into that page: the leaked references
# then cost nothing. Single-page reads (most reads of random rows) also reuse
# one ``Iovec`` per page, built on first use. Buffers read into stay allocated
# for the life of the process, so callers should reuse them
# (``DirectReader.scratch`` does).
_PAGES: dict[int, tuple[list, list]] = {}
_PINNED: list = []


def _page_slots(out: np.ndarray) -> tuple[list, list]:
    """Per 4 KiB page of ``out`` (keyed by address): one reusable memoryview, and a slot
    for its single-page ``Iovec`` (None until first used)."""
    addr = out.ctypes.data
    npages = out.size // PAGE
    entry = _PAGES.get(addr)
    if entry is None or len(entry[0]) < npages:
        # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (a buffer at runtime)
        mv = memoryview(out)  # type: ignore[arg-type]
        if entry is not None:
            _PINNED.append(entry)  # may hold leaked exports: never free them
        entry = ([mv[k * PAGE:(k + 1) * PAGE] for k in range(npages)], [None] * npages)
        _PAGES[addr] = entry
    return entry


def _run_lists(offs: np.ndarray, lens: np.ndarray, bufs: np.ndarray
               ) -> tuple[list, list, list, list]:
    """Per run (from int64 [R] file offsets, byte lengths and byte offsets in the
    buffer, all page multiples), as lists of int: its file offset, its length, its
    first page in the buffer and its number of pages."""
    return offs.tolist(), lens.tolist(), (bufs // PAGE).tolist(), (lens // PAGE).tolist()


class LiburingBackend(ReadBackend):
    """O_DIRECT reads through a python-``liburing`` ring of ``queue_depth`` entries."""

    name = "liburing"
    label = "io_uring (python liburing)"
    probe_in_child = True
    binding = "liburing"
    fresh_buffers = False  # one memoryview per page of every buffer, kept for ever
    sub_page = False  # the same per-page memoryviews: whole pages only

    @classmethod
    def version(cls) -> str:
        try:
            return metadata.version("liburing")
        except metadata.PackageNotFoundError:
            return "not installed"

    def __init__(self, path: str, size: int, queue_depth: int, page_cache: bool = False):
        super().__init__(path, size, queue_depth, page_cache)
        self.fd = -1
        self.ring = None
        self.efd = -1
        L = _binding()
        self.fd = self.open_fd()
        self.require_o_direct()
        entries = _pow2(queue_depth)
        ring = L.Ring()
        try:
            L.io_uring_queue_init(entries, ring)
        except Exception as e:  # noqa: BLE001 - OSError or the binding's own types
            self.close()
            raise Refused(f"io_uring_queue_init failed: {getattr(e, 'strerror', None) or e}"
                          ) from None
        self.ring = ring
        # Completions are waited for on an eventfd, not in io_uring_submit_and_wait: the
        # binding holds the GIL through that call, which stalls every other Python thread
        # (the training loop) for as long as the reads take; os.eventfd_read releases it.
        try:
            self.efd = os.eventfd(0, os.EFD_CLOEXEC)
            L.io_uring_register_eventfd(ring, self.efd)
        except Exception as e:  # noqa: BLE001
            self.close()
            raise Refused(f"io_uring_register_eventfd failed: {e}") from None
        self._cq_entries = 2 * entries
        self._cq_head = 0
        self._cqe = L.Cqe()

    def close(self) -> None:
        if self.ring is not None:
            ring, self.ring = self.ring, None
            try:
                _L.io_uring_queue_exit(ring)
            except Exception:  # noqa: BLE001
                pass
        if self.efd >= 0:
            efd, self.efd = self.efd, -1
            os.close(efd)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def read_runs(self, offs, lens, bufs, out, reuse: bool = True) -> None:
        """See :meth:`ReadBackend.read_runs`: ``queue_depth`` reads in flight, each run
        one ``readv`` of the page views of ``out`` it fills. Reads still in flight are
        waited for before an error is raised."""
        if self.ring is None:
            raise self.short_read(0, 0, -errno.EBADF)
        L = _L
        ring = self.ring
        fd = self.fd
        get_sqe = L.io_uring_get_sqe
        prep = L.io_uring_prep_readv
        Iovec = L.Iovec
        offs, lens_l, slots, npgs = _run_lists(offs, lens, bufs)
        nruns = len(offs)
        views, one = _page_slots(out)
        iovs = [None] * nruns  # kept alive until completion
        qd = self.queue_depth
        i = 0
        inflight = 0
        err = None
        try:
            while inflight or (i < nruns and err is None):
                if err is None:
                    while inflight < qd and i < nruns:
                        sqe = get_sqe(ring)
                        if sqe is None:  # SQ full (cannot happen while inflight <= entries)
                            break
                        b = slots[i]
                        if npgs[i] == 1:
                            iov = one[b]
                            if iov is None:
                                iov = one[b] = Iovec(views[b:b + 1])
                        else:
                            iov = Iovec(views[b:b + npgs[i]])
                        iovs[i] = iov
                        prep(sqe, fd, iov, offs[i])
                        sqe.user_data = i
                        i += 1
                        inflight += 1
                self._submit_and_wait(ring)
                ready = L.io_uring_cq_ready(ring)
                while ready:
                    m, err = self._check_completions(ready, offs, lens_l, iovs, err)
                    L.io_uring_cq_advance(ring, m)
                    self._cq_head += m
                    inflight -= m
                    ready -= m
        except BaseException:
            # Never leave reads in flight into buffers we hand back: drain, then close.
            self._drain(inflight)
            raise
        if err is not None:
            raise err

    def _check_completions(self, ready: int, offs: list, lens: list, iovs: list,
                           err: OocError | None) -> tuple[int, OocError | None]:
        """Check the completions from the CQ head on, at most ``ready`` and up to the
        end of the CQ array (so ``cqe[j]`` does not wrap); without advancing the CQ.

        ``offs``, ``lens``: per run, its file offset and bytes (lists of int); a
        completion's ``user_data`` is its run. Drops each completed run's ``Iovec``
        from ``iovs``. Returns how many completions were checked, and ``err`` or, when
        that is None, the error of the first read among them that failed or came
        back short.
        """
        cqe = self._cqe
        _L.io_uring_wait_cqe(self.ring, cqe)  # sets cqe to the CQ head, no syscall
        head = self._cq_head & (self._cq_entries - 1)
        m = min(ready, self._cq_entries - head)
        for j in range(m):
            c = cqe[j]
            u = c.user_data
            try:
                res = c.res
            except OSError as e:  # the binding raises on a negative res
                res = -(e.errno or errno.EIO)
            if res != lens[u] and err is None:
                err = self.short_read(offs[u], lens[u], res)
            iovs[u] = None
        return m, err

    def _submit_and_wait(self, ring) -> None:
        """Submit queued SQEs, then sleep (GIL released) until a completion is posted.

        The eventfd counts completions since it was last read: one posted
        between the ``cq_ready`` check and the read makes the read return at
        once, so no wake-up is lost; a stale count only costs one more check.
        """
        _L.io_uring_submit(ring)
        while not _L.io_uring_cq_ready(ring):
            os.eventfd_read(self.efd)

    def _drain(self, inflight: int) -> None:
        try:
            while inflight > 0:
                self._submit_and_wait(self.ring)
                ready = _L.io_uring_cq_ready(self.ring)
                if ready:
                    _L.io_uring_cq_advance(self.ring, ready)
                    self._cq_head += ready
                    inflight -= ready
        except BaseException:  # noqa: BLE001
            pass
        finally:
            if inflight > 0:  # cannot account for them: the ring is unusable
                self.close()
