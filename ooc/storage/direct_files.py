"""Whole files written and read once with ``O_DIRECT``, through page-aligned buffers.

Bytes that pass through a file once (ingest's bucket files, the feature file the buckets
are placed into) gain nothing from the page cache, and going through it costs: each page
is allocated, copied into, written back and reclaimed, and writers are throttled to the
writeback rate once the dirty pages pile up. Eleven 2.8 GB bucket files appended 23 MiB
at a time measured 1.4 GB/s and 1.3 s of system time buffered (fsync included) against
2.8 GB/s and 0.07 s with ``O_DIRECT`` on this project's machines.

``O_DIRECT`` wants offsets, sizes and buffer addresses aligned to the device's logical
block; everything here aligns to :data:`~ooc.storage.layout.PAGE`, which every device
accepts. Where the file system refuses ``O_DIRECT`` (``EINVAL`` when opening or on the
first write), the same calls go through the page cache instead, and ``direct`` says so.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from .errors import InvalidValue
from .layout import PAGE, aligned_empty

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


class DirectAppender:
    """A new file written front to back in whole pages with ``O_DIRECT``.

    Appended bytes are gathered into ``staging`` (page-aligned uint8, shared by appenders
    used one at a time) behind the tail the last append left (under a page, kept in
    :attr:`tail`), and the whole pages are written; :meth:`close` writes the last page
    zero-padded and truncates the file to the bytes appended.

    Args:
        path: the file (created or truncated).
        staging: page-aligned uint8 buffer of at least two pages.
    """

    def __init__(self, path: str | os.PathLike, staging: np.ndarray):
        if staging.size < 2 * PAGE or staging.ctypes.data % PAGE:
            raise InvalidValue("staging must be page-aligned and hold two pages")
        self.path = Path(path)
        self.staging = staging
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
        per = max(1, (self.staging.size - PAGE) // row)
        if per * row + PAGE > self.staging.size:
            raise InvalidValue(f"{self.path}: a row of {row} bytes does not fit the staging "
                               f"buffer of {self.staging.size} bytes")
        for a in range(0, idx.shape[0], per):
            part = idx[a:a + per]
            t = self.tail.shape[0]
            self.staging[:t] = self.tail
            end = t + part.shape[0] * row
            # t is a multiple of the dtype's size: appends are whole rows, a page is a
            # multiple of any item size
            out = self.staging[t:end].view(src.dtype).reshape((part.shape[0],) + src.shape[1:])
            np.take(src, part, axis=0, out=out, mode="clip")
            self._emit(end, end - t)

    def append(self, data: np.ndarray) -> None:
        """Append the bytes of ``data`` (any array, copied once into the staging buffer)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        room = self.staging.size - PAGE
        a = 0
        while a < raw.shape[0]:
            t = self.tail.shape[0]
            take = min(raw.shape[0] - a, room)
            self.staging[:t] = self.tail
            self.staging[t:t + take] = raw[a:a + take]
            self._emit(t + take, take)
            a += take

    def _emit(self, end: int, nbytes: int) -> None:
        """Write the whole pages of ``staging[:end]`` (the tail, then ``nbytes`` gathered
        behind it) and keep what is left as the tail."""
        whole = end // PAGE * PAGE
        self._write(self.staging[:whole])
        self.tail = self.staging[whole:end].copy()
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
        """Write the last partial page (zero-padded) and truncate to :attr:`size`."""
        if self.fd < 0:
            return
        try:
            t = self.tail.shape[0]
            if t:
                self.staging[:t] = self.tail
                self.staging[t:PAGE] = 0
                self._write(self.staging[:PAGE])
                os.ftruncate(self.fd, self.size)
        finally:
            os.close(self.fd)
            self.fd = -1
            self.tail = np.zeros(0, np.uint8)

    def abandon(self) -> None:
        """Close without writing the tail (the file is being removed)."""
        if self.fd >= 0:
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
    ingest writes its outputs measured 300-450 MB/s with a core in the kernel (3.1 GB/s
    when reading alone).
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
