"""``mmap`` backend: a read-only memory map of the file (page cache, ``MADV_RANDOM``).

The last resort: it works wherever the file can be mapped, reads through
page faults and leaves the pages in the page cache.
"""
from __future__ import annotations

import errno
import mmap
import os

import numpy as np

from ooc.storage import _direct_kernels as K
from ooc.storage.bus_guard import watch
from ooc.storage.io_backends import ReadBackend, Refused


class MmapBackend(ReadBackend):
    """Runs copied out of a read-only mapping of the whole file."""

    name = "mmap"
    label = "mmap (page cache)"

    def __init__(self, path: str, size: int, queue_depth: int, page_cache: bool = False):
        super().__init__(path, size, queue_depth, page_cache)
        self.mm: mmap.mmap | None = None
        self.view = np.zeros(0, np.uint8)
        if size == 0:
            return
        try:
            with open(path, "rb") as f:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise Refused(f"mmap failed: {e}") from None
        self.mm.madvise(mmap.MADV_RANDOM)
        watch(path)
        self.view = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        self.view = np.zeros(0, np.uint8)
        if self.mm is not None:
            mm, self.mm = self.mm, None
            try:
                mm.close()
            except BufferError:  # an exported view is alive; the GC frees it
                pass

    def read_runs(self, offs, lens, bufs, out, reuse: bool = True) -> None:
        # a page of the mapping past the file's current end faults with SIGBUS:
        # check the size first (one stat per request)
        try:
            size = os.stat(self.path).st_size
        except OSError as e:
            raise self.short_read(int(offs[0]), int(lens[0]), -(e.errno or errno.EIO)) from None
        bad = K.copy_runs(self.view, min(size, self.view.size), offs, lens, bufs, out)
        if bad >= 0:
            raise self.short_read(int(offs[bad]), int(lens[bad]),
                                  max(0, min(size, self.view.size) - int(offs[bad])))
