"""``preadv`` backend: ``os.preadv`` from a thread pool (the GIL is released in the call).

``O_DIRECT`` where the file system accepts it, buffered reads otherwise;
``min(queue_depth, 64)`` threads, each taking every k-th run.
"""
from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor

from ooc.storage.io_backends import ReadBackend, Refused

#: Most threads one reader starts.
MAX_THREADS = 64


class PreadvBackend(ReadBackend):
    """Runs read by ``os.preadv`` calls spread over a thread pool."""

    name = "preadv"

    def __init__(self, path: str, size: int, queue_depth: int, page_cache: bool = False):
        super().__init__(path, size, queue_depth, page_cache)
        self.fd = -1
        self.pool: ThreadPoolExecutor | None = None
        if not hasattr(os, "preadv"):
            raise Refused("os.preadv not available")
        self.fd = self.open_fd()
        self.threads = min(queue_depth, MAX_THREADS)
        if self.threads > 1:
            self.pool = ThreadPoolExecutor(max_workers=self.threads,
                                           thread_name_prefix="ooc-preadv")

    def describe(self) -> str:
        return f"preadv threads ({'O_DIRECT' if self.o_direct else 'buffered'})"

    def close(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.shutdown(wait=True)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def read_runs(self, offs, lens, bufs, out, reuse: bool = True) -> None:
        fd = self.fd
        offs_l = offs.tolist()
        lens_l = lens.tolist()
        bufs_l = bufs.tolist()
        mv = memoryview(out)
        preadv = os.preadv
        nruns = len(offs_l)

        def work(t: int, step: int):
            for j in range(t, nruns, step):
                b = bufs_l[j]
                try:
                    got = preadv(fd, [mv[b:b + lens_l[j]]], offs_l[j])
                except OSError as e:
                    return self.short_read(offs_l[j], lens_l[j], -(e.errno or errno.EIO))
                if got != lens_l[j]:
                    return self.short_read(offs_l[j], lens_l[j], got)
            return None

        if self.pool is None or nruns == 1:
            errs = [work(0, 1)]
        else:
            step = min(self.threads, nruns)
            errs = list(self.pool.map(work, range(step), [step] * step))
        for e in errs:
            if e is not None:
                raise e
