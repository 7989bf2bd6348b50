"""The child process that probes one read backend: ``python -m ooc.storage.probe_child
MODULE:CLASS FILE`` imports the class, opens the file with it and reads its first page with
O_DIRECT, comparing it with a buffered read; :mod:`ooc.storage.probe` runs it and caches the
verdict."""
from __future__ import annotations

import os
import sys

import numpy as np

from ooc.storage.io_backends import Refused
from ooc.storage.layout import PAGE, aligned_empty
from ooc.storage.probe import load_class


def run(target: str, path: str) -> int:
    """Exercise backend class ``target`` on ``path``: 0 and ``ok``; 3 refused; 4 failed."""
    try:
        size = os.stat(path).st_size
        b = load_class(target)(path, size, 4)
    except Refused as e:
        print(str(e))
        return 3
    except Exception as e:  # noqa: BLE001 - any failure is the verdict
        print(f"{type(e).__name__}: {e}")
        return 4
    try:
        if size >= PAGE:
            out = aligned_empty(PAGE)
            z = np.zeros(1, np.int64)
            b.read_runs(z, np.full(1, PAGE, np.int64), z, out)
            with open(path, "rb") as f:
                want = np.frombuffer(f.read(PAGE), np.uint8)
            if not np.array_equal(out, want):
                print("the page read differs from a buffered read of the same page")
                return 4
    except Exception as e:  # noqa: BLE001
        print(f"{type(e).__name__}: {e}")
        return 4
    finally:
        b.close()
    print("ok")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m ooc.storage.probe_child MODULE:CLASS FILE", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(sys.argv[1], sys.argv[2]))
