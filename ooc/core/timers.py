"""Seconds accumulated per named stage, added from any thread.

One :class:`Timers` serves the trainer's step (``with timers("compute", sync=device)``)
and the loader's pipelines, whose gather threads add to one stage at once.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    import torch


class Timers:
    """Accumulated seconds per stage; ``stages`` start at 0.0, others on their first add."""

    def __init__(self, stages: Iterable[str] = ()) -> None:
        self.s: dict[str, float] = {k: 0.0 for k in stages}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, stage: str, sync: torch.device | None = None) -> Iterator[None]:
        """Time the block into ``stage``; on a CUDA ``sync`` device, wait for its kernels
        first so the time is the work's, not its launch's."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if sync is not None and sync.type == "cuda":
                import torch
                torch.cuda.synchronize(sync)
            self.add(stage, time.perf_counter() - t0)

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage`` (several threads may add to one stage)."""
        with self._lock:
            self.s[stage] = self.s.get(stage, 0.0) + seconds

    def snapshot(self) -> dict[str, float]:
        """The seconds so far, copied while no thread adds."""
        with self._lock:
            return dict(self.s)

    def as_dict(self) -> dict[str, float]:
        """The seconds so far, rounded to microseconds."""
        return {k: round(v, 6) for k, v in self.snapshot().items()}
