"""The common result type of every partitioner and small helpers."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ooc.partition import _kernels as K
from ooc.partition._baseline_kernels import edge_chunk
from ooc.partition._spring_kernels import cluster_edges, merge_and_assign, new_state

#: The partitioners :func:`ooc.partition.partition` runs.
ALGORITHMS = ("spring", "hash", "greedy", "dbh", "hdrf")


@dataclass
class Assignment:
    """A node partitioning: ``owner[v]`` is the one partition that owns ``v``.

    Every partitioner returns one. The owned nodes of a partition are its
    training/evaluation targets; the replication pass adds the in-neighbours
    of its owned nodes owned elsewhere as replicas.

    Attributes:
        owner: int32 [N], values in ``[0, p)``.
        algo: algorithm name.
        time_s: wall time of the assignment (all its edge passes included).
        params: the parameters used (JSON-able).
        info: algorithm-specific statistics (JSON-able).
        vertex_cut: edge partitioners only: the replica sets of their own
            edge assignment, bit ``q`` of row ``v`` set when an edge of ``v``
            went to partition ``q`` (uint64 [N, ceil(p / 64)]); None otherwise.
    """

    owner: np.ndarray
    algo: str
    time_s: float
    params: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    vertex_cut: np.ndarray | None = None


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool) -> Iterator:
    """A tqdm bar over ``total`` edges, or a no-op when disabled."""
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="edge", unit_scale=True, leave=False,
              mininterval=0.5) as bar:
        yield bar




def warm_up(algo: str, index_dtype) -> float:
    """Load (or compile) the numba kernels ``algo`` uses on tiny inputs.

    Returns the seconds spent. Run before the timed part, so ``time_s``
    measures the algorithm rather than the JIT start-up (about a second per
    process, reported separately as ``jit_warmup_s``).
    """
    import time

    import numpy as np


    t0 = time.perf_counter()
    idt = np.dtype(index_dtype)
    indptr = np.array([0, 1, 2], dtype=np.int64)
    src = np.array([1, 0], dtype=idt)
    deg = np.zeros(2, dtype=np.int64)
    K.add_out_degrees(deg, src)
    owner = np.zeros(2, dtype=np.int32)
    bits = np.zeros((2, 1), dtype=np.uint64)
    cut = np.zeros(1, dtype=np.int64)
    el = np.zeros(1, dtype=np.int64)
    K.replica_chunk(indptr, 0, 0, src, owner, bits, cut, el)
    K.replica_counts(bits, 1)
    one = np.zeros(1, dtype=np.int64)
    K.refine_chunk(indptr, 0, 0, src, owner, np.array([2], dtype=np.int64), 2, one.copy(),
                   np.zeros(1, dtype=np.int32), one.copy(), one.copy())
    if algo == "spring":
        st = new_state(deg)
        vol = np.zeros(3, dtype=np.int64)
        k = np.ones(1, dtype=np.int64)
        d = np.empty(2, dtype=idt)
        K.expand_dst(indptr, 0, 0, d)
        cluster_edges(src, d, st, vol, k, 1.0)
        merge_and_assign(st, int(k[0]), np.zeros(2, dtype=np.int64), 2.0, 1, 1)
    else:
        cand = np.full(2, -1, dtype=np.int32)
        cnt = np.zeros(2, dtype=np.int32)
        edge_chunk(0, indptr, 0, 0, src, 1, 0, deg, np.zeros(1, dtype=np.int64), bits,
                   np.zeros(1, dtype=np.int64), cand, cnt, cand.copy(), cnt.copy(), 1.0, 1.0,
                   np.zeros(0, dtype=np.int32))
        K.finish_owner(cand, cand, 0, 1)
        K.popcount_total(bits)
    return time.perf_counter() - t0
