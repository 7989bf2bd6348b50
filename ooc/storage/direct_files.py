"""Whole files written and read once with ``O_DIRECT``, through page-aligned buffers.

Bytes that pass through a file once (ingest's bucket files, the feature file the buckets
are placed into) gain nothing from the page cache, and going through it costs: each page
is allocated, copied into, written back and reclaimed, and writers are throttled to the
writeback rate once the dirty pages pile up: bucket files written with ``O_DIRECT``
write faster for a fraction of the system time (``docs/benchmarks.md``).

``O_DIRECT`` wants offsets, sizes and buffer addresses aligned to the device's logical
block; everything here aligns to :data:`~ooc.storage.layout.PAGE`, which every device
accepts. Where the file system refuses ``O_DIRECT`` (``EINVAL`` when opening or on the
first write), the same calls go through the page cache instead, and ``direct`` says so.

An ``O_DIRECT`` write returns once the device has the bytes, so an appender that gathers
and writes in turn leaves the disk idle while it gathers: :class:`WriteBehind` gathers into
one half of its buffer while a thread writes the other.
"""
from __future__ import annotations

import errno
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
from numpy.typing import DTypeLike

from ooc.core.errors import InvalidValue
from ooc.storage.layout import PAGE, aligned_empty

#: Bytes of the page-aligned buffer :func:`read_range` reads through.
READ_STAGING = 16 << 20


def open_direct(path: str | os.PathLike, flags: int, mode: int = 0o644) -> tuple[int, bool]:
    """``os.open(path, flags | O_DIRECT)`` where the file system takes it, else without;
    returns ``(fd, direct)``."""
    try:
        return os.open(path, flags | os.O_DIRECT | os.O_CLOEXEC, mode), True
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    return os.open(path, flags | os.O_CLOEXEC, mode), False


def write_all(fd: int, buf: memoryview, offset: int | None = None) -> None:
    """Write all of ``buf`` (at ``offset``, else at the file position).

    A write that stops short means the device filled up; with ``O_DIRECT`` the rest, no
    longer aligned, is then refused with ``EINVAL``, which is reported as the full disk
    (``ENOSPC``) it is."""
    short = False
    while buf.nbytes:
        try:
            n = os.write(fd, buf) if offset is None else os.pwrite(fd, buf, offset)
        except OSError as e:
            if short and e.errno == errno.EINVAL:
                raise OSError(errno.ENOSPC, "No space left on device (a write stopped "
                                            "short)") from None
            raise
        if n <= 0:
            raise OSError(errno.ENOSPC, "No space left on device (a write wrote nothing)")
        short = n < buf.nbytes
        buf = buf[n:]
        if offset is not None:
            offset += n


class Staging:
    """The page-aligned buffer :class:`DirectAppender` s gather bytes into, written in
    place: each write done before :meth:`submit` returns."""

    def __init__(self, buf: np.ndarray):
        if buf.size < 2 * PAGE or buf.ctypes.data % PAGE:
            raise InvalidValue("staging must be page-aligned and hold two pages")
        self._buf = buf

    @property
    def buf(self) -> np.ndarray:
        """The buffer to fill now (page-aligned uint8)."""
        return self._buf

    def submit(self, write: Callable[[np.ndarray], None], pages: np.ndarray) -> None:
        """Write ``pages`` (the front of :attr:`buf`) with ``write``."""
        write(pages)

    def wait(self) -> None:
        """Every write submitted is done (an error of one is raised here)."""

    def close(self) -> None:
        """Wait for the writes; the staging takes no more."""
        self.wait()


class WriteBehind(Staging):
    """Two page-aligned halves of ``nbytes``: one is filled while a thread writes the
    other's pages (writes release the GIL), so gathering and writing overlap. At most one
    write is in flight; a half is filled again only once its write is done. An error of
    a write is raised by the next :meth:`submit` or :meth:`wait`."""

    def __init__(self, nbytes: int):
        half = max(2 * PAGE, int(nbytes) // 2 // PAGE * PAGE)
        self._halves = [aligned_empty(half), aligned_empty(half)]
        self._k = 0
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            1, thread_name_prefix="ooc-write-behind")
        self._pending: Future | None = None

    @property
    def buf(self) -> np.ndarray:
        return self._halves[self._k]

    def submit(self, write: Callable[[np.ndarray], None], pages: np.ndarray) -> None:
        self.wait()  # the other half's write: that half is filled next
        if self._pool is None:
            raise InvalidValue("write-behind staging used after close")
        self._pending = self._pool.submit(write, pages)
        self._k ^= 1

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


class DirectAppender:
    """A new file written front to back in whole pages with ``O_DIRECT``.

    Appended bytes are gathered into ``staging`` (a :class:`Staging`, e.g. a
    :class:`WriteBehind`, or a page-aligned uint8 array written in place; shared by
    appenders used one at a time) behind the tail the last append left (under a page,
    kept in :attr:`tail`), and the whole pages are written; :meth:`close` writes the last
    page zero-padded and truncates the file to the bytes appended.

    Args:
        path: the file (created or truncated).
        staging: a :class:`Staging`, or a page-aligned uint8 buffer of at least two pages.
    """

    def __init__(self, path: str | os.PathLike, staging: Staging | np.ndarray):
        self.stage = staging if isinstance(staging, Staging) else Staging(staging)
        self.path = Path(path)
        self.fd, self.direct = open_direct(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.tail = np.zeros(0, np.uint8)
        self.size = 0
        self._written = False

    def append_take(self, src: np.ndarray, idx: np.ndarray) -> None:
        """Append ``src[idx]`` (``src`` C-contiguous [n, ...] of any fixed-size dtype,
        ``idx`` int64 [k] of valid row numbers) without another copy of the rows."""
        src = np.ascontiguousarray(src)
        row = src.dtype.itemsize * int(np.prod(src.shape[1:], dtype=np.int64))
        if row == 0 or idx.shape[0] == 0:
            return
        size = self.stage.buf.size
        per = max(1, (size - PAGE) // row)
        if per * row + PAGE > size:
            raise InvalidValue(f"{self.path}: a row of {row} bytes does not fit the staging "
                               f"buffer of {size} bytes")
        for a in range(0, idx.shape[0], per):
            part = idx[a:a + per]
            buf = self.stage.buf
            t = self.tail.shape[0]
            buf[:t] = self.tail
            end = t + part.shape[0] * row
            # t is a multiple of the dtype's size: appends are whole rows, a page is a
            # multiple of any item size
            out = buf[t:end].view(src.dtype).reshape((part.shape[0],) + src.shape[1:])
            np.take(src, part, axis=0, out=out, mode="clip")
            self._emit(end, end - t)

    def append(self, data: np.ndarray) -> None:
        """Append the bytes of ``data`` (any array, copied once into the staging buffer)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        a = 0
        while a < raw.shape[0]:
            buf = self.stage.buf
            t = self.tail.shape[0]
            take = min(raw.shape[0] - a, buf.size - PAGE)
            buf[:t] = self.tail
            buf[t:t + take] = raw[a:a + take]
            self._emit(t + take, take)
            a += take

    def _emit(self, end: int, nbytes: int) -> None:
        """Write the whole pages of the staging buffer's first ``end`` bytes (the tail,
        then ``nbytes`` gathered behind it) and keep what is left as the tail."""
        buf = self.stage.buf
        whole = end // PAGE * PAGE
        self.tail = buf[whole:end].copy()
        if whole:
            self.stage.submit(self._write, buf[:whole])
        self.size += nbytes

    def _write(self, buf: np.ndarray) -> None:
        if not buf.size:
            return
        try:
            write_all(self.fd, buf.data)
        except OSError as e:
            if not (e.errno == errno.EINVAL and self.direct and not self._written):
                raise
            # O_DIRECT taken when opening but not when writing: the page cache from here
            os.close(self.fd)
            self.fd, self.direct = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC), False
            write_all(self.fd, buf.data)
        self._written = True

    def close(self) -> None:
        """Write the last partial page (zero-padded) and truncate to :attr:`size`, once
        every write of the staging is done."""
        if self.fd < 0:
            return
        try:
            t = self.tail.shape[0]
            if t:
                buf = self.stage.buf
                buf[:t] = self.tail
                buf[t:PAGE] = 0
                self.stage.submit(self._write, buf[:PAGE])
            self.stage.wait()
            if t:
                os.ftruncate(self.fd, self.size)
        finally:
            os.close(self.fd)
            self.fd = -1
            self.tail = np.zeros(0, np.uint8)

    def abandon(self) -> None:
        """Close without writing the tail (the file is being removed), once no write of
        the staging is in flight (an error of one is dropped: the file goes anyway)."""
        if self.fd >= 0:
            try:
                self.stage.wait()
            except OSError:
                pass
            finally:
                os.close(self.fd)
                self.fd = -1


def direct_buffer(path: str | os.PathLike) -> np.ndarray:
    """A page-aligned uint8 buffer that :func:`read_direct` can read the file ``path`` into
    (its size in whole pages)."""
    return aligned_empty(-(-os.path.getsize(path) // PAGE) * PAGE)


def read_direct(path: str | os.PathLike, dtype: DTypeLike,
                buf: np.ndarray | None = None) -> np.ndarray:
    """The whole file ``path`` as a flat array of ``dtype`` (its size a multiple of the
    item size), read with ``O_DIRECT`` into a page-aligned buffer: ``buf`` (from
    :func:`direct_buffer`, so that the caller decides when the memory is taken), else a
    new one."""
    dt = np.dtype(dtype)
    fd, _ = open_direct(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size % dt.itemsize:
            raise InvalidValue(f"{path}: {size} bytes is not a whole number of "
                               f"{dt.name} values")
        if buf is None:
            buf = aligned_empty(-(-size // PAGE) * PAGE)
        elif buf.size < size:
            raise InvalidValue(f"{path}: {size} bytes do not fit a buffer of {buf.size}")
        got = 0
        while got < size:
            n = os.readv(fd, [buf[got:].data])
            if n <= 0:
                raise InvalidValue(f"{path}: ended after {got} of {size} bytes")
            got += n
    finally:
        os.close(fd)
    return buf[:size].view(dt)


def pwrite_pages(fd: int, buf: np.ndarray, offset: int) -> None:
    """Write ``buf`` (page-aligned uint8, whole pages) at ``offset`` (a page boundary)."""
    if buf.size % PAGE or offset % PAGE or buf.ctypes.data % PAGE:
        raise InvalidValue("pwrite_pages takes whole, aligned pages at a page boundary")
    write_all(fd, buf.data, offset)


def read_range(path: str | os.PathLike, pos: int, count: int, dtype: DTypeLike
               ) -> np.ndarray | None:
    """``count`` values of ``dtype`` at byte ``pos`` of ``path``, read with ``O_DIRECT``
    through a page-aligned buffer of :data:`READ_STAGING` bytes and copied into an array
    of their own (a member of an ``.npz`` starts anywhere in its file, so the values are
    realigned); fewer values where the file ends first. None where the file system
    refuses ``O_DIRECT`` (the caller reads through the page cache).

    An input read once gains nothing from the page cache, and going through it while
    ingest writes its outputs reads several times slower than reading alone, with a core
    busy in the kernel.
    """
    dt = np.dtype(dtype)
    fd, direct = open_direct(path, os.O_RDONLY)
    if not direct:
        os.close(fd)
        return None
    try:
        out = np.empty(count, dtype=dt)
        ob = out.view(np.uint8)
        total = ob.shape[0]
        staging = aligned_empty(READ_STAGING + PAGE)
        done = 0
        while done < total:
            p = pos + done
            lo = p - p % PAGE
            want = min(total - done, READ_STAGING)
            hi = -(-(p + want) // PAGE) * PAGE
            got = os.preadv(fd, [staging[:hi - lo].data], lo)
            take = min(got - (p - lo), want)
            if take <= 0:
                break
            ob[done:done + take] = staging[p - lo:p - lo + take]
            done += take
    finally:
        os.close(fd)
    return out[:done // dt.itemsize]
