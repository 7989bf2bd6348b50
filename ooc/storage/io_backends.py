"""Read backends of :class:`~ooc.storage.direct.DirectReader`, and how one is chosen.

A backend reads *runs* (``lens[i]`` bytes at file offset ``offs[i]`` into
``out[bufs[i]:]``) of one open file. The reader above it plans the runs
(pages deduplicated, adjacent pages coalesced), checks the request and keeps
the counters; a backend only moves bytes. Each backend is one module:

============  ==============================================  ==========================
name          how                                             module
============  ==============================================  ==========================
``io_uring``  ``O_DIRECT`` + io_uring, submit/reap loop in     :mod:`.io_uring`
              compiled code (raw system calls, no binding)
``liburing``  ``O_DIRECT`` + io_uring through the python       :mod:`.io_liburing`
              ``liburing`` binding
``preadv``    ``os.preadv`` from a thread pool (``O_DIRECT``   :mod:`.io_preadv`
              where the file system accepts it)
``mmap``      a read-only memory map (page cache)              :mod:`.io_mmap`
============  ==============================================  ==========================

``auto`` tries them in :data:`AUTO_ORDER`. A backend whose code is native
(a binary wheel, or raw ring memory) is first run in a child process by
:mod:`.probe`: a wheel built for another CPU dies with SIGILL, which no
``try`` can catch. The verdict is cached on disk. When ``auto`` passes over a
backend, one ``ooc: note:`` line says which backend reads and why.

A new backend is a subclass of :class:`ReadBackend` in its own module and one
entry in :data:`REGISTRY`.
"""
from __future__ import annotations

import errno
import os
from typing import ClassVar

import numpy as np

from ooc.core.errors import InvalidValue, IOFailure, OocError
from ooc.core.notes import note
from ooc.storage import probe
from ooc.storage.layout import PAGE, SECTOR, aligned_empty
from ooc.storage.probe import load_class

#: name -> "module:Class" (imported on first use, so a broken binding is never
#: imported by a process that does not read with it).
REGISTRY: dict[str, str] = {
    "io_uring": "ooc.storage.io_uring:NativeUringBackend",
    "liburing": "ooc.storage.io_liburing:LiburingBackend",
    "preadv": "ooc.storage.io_preadv:PreadvBackend",
    "mmap": "ooc.storage.io_mmap:MmapBackend",
}
#: What ``backend="auto"`` tries, in order.
AUTO_ORDER: tuple[str, ...] = ("io_uring", "liburing", "preadv", "mmap")
#: Every accepted ``backend=`` / ``--io-backend`` value.
CHOICES: tuple[str, ...] = ("auto",) + tuple(REGISTRY)


class Refused(Exception):
    """A backend cannot be used here (the reason is the message)."""


class ReadBackend:
    """Reads byte runs of one file into a page-aligned buffer.

    Subclasses set :attr:`name`, open their resources in ``__init__(path, size,
    queue_depth, page_cache=False)`` (the file through :meth:`open_fd`; raising
    :class:`Refused` with a reason when they cannot work here) and implement
    :meth:`read_runs` and :meth:`close`.

    Attributes:
        path: the file. ``size``: its size in bytes when opened.
        queue_depth: reads in flight (ring depth, or threads).
        page_cache: read through the kernel's page cache (no ``O_DIRECT``; for a file
            likely still cached, e.g. one this process just wrote), with readahead off.
        o_direct: whether reads bypass the page cache.
    """

    name: ClassVar[str] = ""
    #: Runs native code whose crash would kill the process: probed in a child first.
    probe_in_child: ClassVar[bool] = False
    #: Words for notes and reports, e.g. "preadv threads".
    label: ClassVar[str] = ""
    #: The python module of a binding the backend wraps (its file is part of the probe key).
    binding: ClassVar[str] = ""
    #: Reading into a buffer used once costs nothing extra (False: the backend keeps
    #: state per buffer, so callers should read into a reused buffer).
    fresh_buffers: ClassVar[bool] = True
    #: Reads runs at any multiple of :data:`SECTOR` (False: whole pages only).
    sub_page: ClassVar[bool] = True

    def __init__(self, path: str, size: int, queue_depth: int, page_cache: bool = False):
        self.path = path
        self.size = size
        self.queue_depth = queue_depth
        self.page_cache = page_cache
        self.o_direct = False
        #: what the offsets and lengths of runs are multiples of: :data:`SECTOR` where the
        #: backend takes it and ``O_DIRECT`` reads one (a device of 512 B logical blocks),
        #: else ``PAGE`` (the page cache reads whole pages anyway)
        self.read_align = PAGE

    @classmethod
    def version(cls) -> str:
        """Version of the code behind the backend (part of the probe cache key)."""
        return ""

    def describe(self) -> str:
        return self.label or self.name

    def read_runs(self, offs: np.ndarray, lens: np.ndarray, bufs: np.ndarray,
                  out: np.ndarray, reuse: bool = True) -> None:
        """Read run i: ``lens[i]`` bytes at file offset ``offs[i]`` into ``out[bufs[i]:]``.

        ``offs``, ``lens``, ``bufs`` are int64 ``[n]`` multiples of :attr:`read_align`; ``out`` a
        page-aligned uint8 array large enough for every run. ``reuse``: whether
        ``out`` will be read into again (a backend may then set it up once, e.g.
        register it with the kernel). Raises :class:`OocError` naming the file on
        a short read or an I/O error.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend's resources (idempotent)."""

    # ------------------------------------------------------------ shared helpers
    def short_read(self, off: int, want: int, got: int) -> OocError:
        """The error for a read of ``want`` bytes at ``off`` that returned ``got`` (< 0: -errno)."""
        if got < 0:
            return OocError(f"{self.path}: read of {want} bytes at offset {off} failed: "
                            f"{os.strerror(-got)} (errno {-got})")
        return OocError(f"{self.path}: short read at offset {off}: got {got} of {want} bytes "
                        f"(file truncated or changed while reading?)")

    def open_fd(self) -> int:
        """Open the file read-only: with ``O_DIRECT`` where accepted, unless
        :attr:`page_cache` (then with readahead off: the runs are what is needed).

        Some file systems accept the flag but fail the reads, so one page is read
        to check, and then one :data:`SECTOR` at a sector's offset: where that fails
        (a device of 4 KiB logical blocks), :attr:`read_align` is ``PAGE``. Sets
        :attr:`o_direct`; returns the descriptor.
        """
        if not self.page_cache:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise IOFailure(f"{self.path}: cannot open for reading: {e.strerror}") from None
                fd = -1
            if fd >= 0:
                if self.size < PAGE or _probe_read(fd, PAGE, 0):
                    self.o_direct = True
                    if self.sub_page and self.size >= PAGE and _probe_read(fd, SECTOR, SECTOR):
                        self.read_align = SECTOR
                    return fd
                os.close(fd)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise IOFailure(f"{self.path}: cannot open for reading: {e.strerror}") from None
        self.o_direct = False
        if self.page_cache and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return fd

    def require_o_direct(self) -> None:
        """Raise :class:`Refused` when ``O_DIRECT`` was wanted but refused (for a
        backend that reads only with it; the descriptor is closed first)."""
        if not self.page_cache and not self.o_direct:
            self.close()
            raise Refused("O_DIRECT refused by the file system (EINVAL)")


def _probe_read(fd: int, nbytes: int, offset: int) -> bool:
    """Whether ``nbytes`` at file ``offset`` read into a buffer at that offset from a
    page boundary (so as aligned as the offset) come back whole."""
    if not hasattr(os, "preadv"):
        return nbytes >= PAGE  # cannot probe; read errors surface as OocError later
    buf = aligned_empty(PAGE + offset)
    try:
        # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (a buffer at runtime)
        view = memoryview(buf)[offset:offset + nbytes]  # type: ignore[arg-type]
        return os.preadv(fd, [view], offset) == nbytes
    except OSError:
        return False


def backend_class(name: str) -> type[ReadBackend]:
    """The class registered as ``name`` (its module is imported now)."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise InvalidValue(f"unknown I/O backend {name!r} (choose one of "
                         f"{', '.join(CHOICES)})") from None
    return load_class(target)


def check_choice(name: str) -> str:
    """``name`` if it is a valid ``io_backend`` value, else a ValueError naming the choices."""
    if name != "auto" and name not in REGISTRY:
        raise InvalidValue(f"io_backend must be one of auto, {', '.join(REGISTRY)}, not {name!r}")
    return name


def open_backend(path: str, size: int, queue_depth: int, backend: str = "auto",
                 page_cache: bool = False) -> ReadBackend:
    """Open ``backend`` (or the first that works here, for ``"auto"``) on ``path``.

    An explicit backend that cannot be used raises :class:`OocError` with the
    reason; ``auto`` passes over it with one ``ooc: note:`` line (once per
    process and reason) naming the backend that reads instead.
    """

    check_choice(backend)
    order = AUTO_ORDER if backend == "auto" else (backend,)
    tried: list[str] = []
    for name in order:
        try:
            cls = backend_class(name)
            if cls.probe_in_child:
                verdict = probe.verdict(name, REGISTRY[name], path)
                if not verdict.ok:
                    raise Refused(verdict.reason)
            b = cls(path, size, queue_depth, page_cache)
        except Refused as r:
            if backend != "auto":
                raise InvalidValue(f"{path}: I/O backend {name} unavailable: {r}") from None
            tried.append(str(r))
            continue
        if backend == "auto":
            if tried:
                note(f"{'; '.join(tried)}; reading with {b.describe()}",
                     key=f"fallback:{name}:{tried[0].split(':')[0]}")
            elif not b.o_direct and not page_cache and name == "preadv":
                note(f"O_DIRECT refused for {path}; reading with {b.describe()}",
                     key="fallback:buffered")
        return b
    raise InvalidValue(f"{path}: no I/O backend works: " + "; ".join(tried))
