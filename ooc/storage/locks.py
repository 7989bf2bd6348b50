"""One writer at a time for an output: an exclusive ``flock`` on a lock file that names
its holder, released by the kernel when the holder dies.

:func:`exclusive` guards a folder ooc writes (a checkpoint folder, a dataset or partition
output being made): a second writer gets one line naming the first one's pid instead of
clobbering its files; :func:`exclusive_wait` waits for it instead (several processes that
each make the same output when it is missing: the first makes it, the others then find it
made). The lock file is ``<folder>/.ooc-lock`` for a folder that exists
and is ooc's (``inside=True``), else ``<parent>/.<name>.ooc-lock`` beside the output; it
is removed on release.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from ooc.core.errors import IOFailure, OutputBusy, TimedOut

LOCK_NAME = ".ooc-lock"


def lock_path(target: str | os.PathLike, inside: bool = False) -> Path:
    """Where the lock of ``target`` lives."""
    t = Path(target)
    return t / LOCK_NAME if inside else t.parent / f".{t.name}{LOCK_NAME}"


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def exclusive(target: str | os.PathLike, what: str, inside: bool = False) -> Iterator[Path]:
    """Hold the lock of ``target`` for the block; :class:`OocError` (one line naming the
    holder's pid) when another process holds it. ``what`` names the output in the error
    (e.g. "checkpoint folder")."""
    path = lock_path(target, inside)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise IOFailure(f"{path}: cannot create the lock of this {what} "
                           f"({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputBusy(f"{target}: this {what} is being written by {_holder(path)} "
                           f"(another ooc run); wait for it or choose another") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its last holder removed while we waited to open it
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def exclusive_wait(target: str | os.PathLike, what: str, timeout_s: float,
                   poll_s: float = 0.2) -> Iterator[Path]:
    """:func:`exclusive`, waiting up to ``timeout_s`` seconds while another process holds
    the lock; :class:`~.errors.TimedOut` (one line naming the holder) after that."""
    t_end = time.monotonic() + timeout_s
    with contextlib.ExitStack() as stack:
        while True:
            try:
                path = stack.enter_context(exclusive(target, what))
                break
            except OutputBusy:
                if time.monotonic() >= t_end:
                    raise TimedOut(f"{target}: this {what} was still being written by "
                                   f"{_holder(lock_path(target))} after {timeout_s:g}s of "
                                   f"waiting") from None
                time.sleep(poll_s)
        yield path
