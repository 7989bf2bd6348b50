"""The common result type of every partitioner and small helpers."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np


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
    """

    owner: np.ndarray
    algo: str
    time_s: float
    params: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


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
