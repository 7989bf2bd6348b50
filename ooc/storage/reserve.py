"""Files created with their disk space reserved, then mapped for writing.

A store into a page of a shared file mapping that the file system cannot back (a sparse
file on a full disk) kills the process with SIGBUS: Python cannot turn it into an
exception. So every file ooc maps for writing is made here: its blocks are reserved first
(``posix_fallocate``), and a disk without room is a one-line :class:`IOFailure` naming the
file, the bytes it needs and the bytes free, before anything is mapped.

A file system without ``fallocate`` (glibc then writes a byte in each block itself) or
one that refuses it (``EOPNOTSUPP``, ``EINVAL``, e.g. some network and FUSE file systems)
gets the file's zeros written instead: a full disk fails that write, and the blocks are
allocated. Copy-on-write file systems that compress zeros or write every change to new
blocks (ZFS, btrfs with compression) may still find no room later; that is the one case
not covered.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

import numpy as np

from ooc.core.errors import IOFailure
from ooc.core.sizes import format_size

#: Errors of ``posix_fallocate`` that mean "this file system cannot reserve": zeros are
#: written instead.
UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
#: Errors that mean the disk (or the user's quota, or the file size limit) has no room.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: numpy's message for a short write (``ndarray.tofile``): a full disk, with no errno.
SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")
#: Bytes of zeros written at a time where ``fallocate`` is refused.
ZEROS = 1 << 20


def is_no_room(e: OSError) -> bool:
    """Whether ``e`` says the disk had no room: ENOSPC (or a quota, or the file size limit),
    or the short write numpy's ``tofile`` (under ``np.save``) reports without an errno."""
    return e.errno in NO_ROOM or (e.errno is None and SHORT_WRITE.fullmatch(str(e)) is not None)


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path``'s
    folder, or None when it cannot be told."""
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def no_room(path: str | os.PathLike, nbytes: int, e: OSError) -> IOFailure:
    """The one-line error of a file ``path`` of ``nbytes`` the disk had no room for."""

    free = free_bytes(path)
    left = "" if free is None else f", {format_size(free)} is free on its disk"
    what = {errno.EDQUOT: "disk quota exceeded",
            errno.EFBIG: "file too large for its file system"}.get(e.errno or 0, "disk full")
    err = IOFailure(f"{path}: {what}: the file needs {format_size(nbytes)}{left}")
    err.errno = e.errno  # callers may tell ENOSPC apart; the message stays the one line
    return err


def _write_zeros(fd: int, nbytes: int) -> None:
    """Write zeros from the current end of ``fd`` up to ``nbytes`` (what the file holds
    already stays; a short write is retried, one that writes nothing is ENOSPC)."""
    at = os.fstat(fd).st_size
    block = bytes(min(ZEROS, max(0, nbytes - at)))
    while at < nbytes:
        n = os.pwrite(fd, block[:min(len(block), nbytes - at)], at)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        at += n


def reserve_fd(fd: int, nbytes: int, path: str | os.PathLike) -> None:
    """Reserve the first ``nbytes`` of the open file ``fd`` (``path``, for the error) on
    its disk; the file grows to ``nbytes`` if shorter (where zeros are written instead,
    from its end: what it holds is written already).

    Raises:
        IOFailure: the disk has no room (see :func:`no_room`).
    """
    if nbytes <= 0:
        return
    try:
        fallocate = getattr(os, "posix_fallocate", None)
        if fallocate is None:
            _write_zeros(fd, nbytes)
            return
        try:
            fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
            _write_zeros(fd, nbytes)
    except OSError as e:
        if e.errno in NO_ROOM:
            raise no_room(path, nbytes, e) from None
        raise


def reserve(path: str | os.PathLike, nbytes: int) -> None:
    """Create ``path`` (emptied if it exists) with ``nbytes`` reserved on its disk; on a
    failure the file is removed.

    Raises:
        IOFailure: the disk has no room for it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        reserve_fd(fd, nbytes, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def map_for_writing(path: str | os.PathLike, dtype, shape: tuple[int, ...],
                    nbytes: int | None = None) -> np.ndarray:
    """A new file ``path`` of ``nbytes`` (default: the array's bytes), reserved
    (:func:`reserve`), mapped as a writable ``dtype`` array of ``shape`` from its start;
    an empty array (nothing mapped) when ``shape`` holds no entries."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    reserve(path, size if nbytes is None else int(nbytes))
    if size == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r+", shape=shape)


def npy_for_writing(path: str | os.PathLike, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new ``.npy`` file ``path`` holding a C-ordered ``dtype`` array of ``shape``: its
    header written, its data reserved (:func:`reserve_fd`), the data mapped for writing
    (``np.lib.format.open_memmap`` with ``mode="w+"``, without the sparse file)."""
    from numpy.lib import format as npy

    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    header = {"descr": npy.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with open(path, "wb") as f:
        try:
            npy.write_array_header_1_0(f, header)
            f.flush()
            offset = f.tell()
            reserve_fd(f.fileno(), offset + size, path)
        except BaseException:
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
    if size == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r+", offset=offset, shape=shape)
