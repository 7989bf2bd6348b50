"""Worker heartbeats: the launcher notices a worker that stops making progress.

The parent of ``python -m ooc.train --workers Q`` creates one small file
(``Q`` slots of int64 counters, shared through ``mmap``) and passes its path to
the workers (``OOC_HEARTBEAT``). Each worker writes only its own slot:

================  ==================================================================
field             written by
================  ==================================================================
``beats``         a daemon thread, every ``interval`` seconds: the process runs
``progress``      the training loop after every batch (training and evaluation)
                  and around every collective: the work moves on
``phase``         ``SETUP`` (starting, opening a pipeline: not judged on
                  progress), ``WORK`` (from the first finished batch on: judged),
                  ``COLLECTIVE`` (inside an all_reduce: waiting on the others)
``collectives``   how many collectives this worker has entered
``pid``           the worker's process id
================  ==================================================================

The parent (:class:`HeartbeatMonitor`) reads the slots every poll and names
the first worker that is

* **frozen**: ``beats`` unchanged for ``timeout`` seconds (stopped with
  SIGSTOP, or stuck in native code that holds the interpreter lock);
* **hung**: in ``WORK`` with ``progress`` unchanged for ``timeout`` seconds
  (a deadlock, an endless loop), while the others may wait for it in a
  collective: those are in ``COLLECTIVE`` and are not blamed;
* **stuck in a collective**: every live worker in ``COLLECTIVE`` with no
  progress for ``timeout`` seconds: the one that entered the fewest
  collectives (it is behind the others), else the one that entered last;
* **not started**: no beat within ``max(timeout, STARTUP_S)`` of the launch.

A worker killed outright is seen by its exit status, not here. The other way
round, a worker whose launcher dies (its parent process changes) exits with
:data:`LAUNCHER_GONE_RC` within one beat instead of training on unwatched.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ooc.executor.distributed.environment import seconds_from_env
from ooc.storage.reserve import reserve

ENV_PATH = "OOC_HEARTBEAT"
ENV_TIMEOUT = "OOC_HEARTBEAT_TIMEOUT"
#: Seconds without a heartbeat or without progress after which a worker is declared failed.
DEFAULT_TIMEOUT_S = 120.0
#: Seconds a worker may take from its launch to its first heartbeat (imports, at least).
STARTUP_S = 120.0

#: Exit status of a worker whose launcher died (its heartbeat thread ends the process).
LAUNCHER_GONE_RC = 76

BEATS, PROGRESS, PHASE, COLLECTIVES, PID = range(5)
SLOT = 8  # int64 fields per worker (5 used)
SETUP, WORK, COLLECTIVE = 0, 1, 2


def timeout_s() -> float:
    """The heartbeat timeout: ``OOC_HEARTBEAT_TIMEOUT`` seconds, default 120."""
    return seconds_from_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)


def interval_s(timeout: float) -> float:
    """How often a worker beats: a quarter of the timeout, at most once a second."""
    return max(0.05, min(1.0, timeout / 4))


def create_file(path: str | os.PathLike, workers: int) -> Path:
    """A zeroed heartbeat file for ``workers`` workers."""
    path = Path(path)
    reserve(path, workers * SLOT * 8)  # reserved: a full disk is an error here, not SIGBUS
    return path


def _map(path: str | os.PathLike) -> tuple[mmap.mmap, np.ndarray]:
    """The heartbeat file as int64 [workers, SLOT], shared with the other processes."""
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    arr = np.frombuffer(mm, dtype=np.int64).reshape(-1, SLOT)
    return mm, arr


class Heartbeat:
    """One worker's slot: a beating thread and the progress marks of the main thread.

    ``beat()`` after each unit of work; ``with collective():`` around a
    collective; ``setup()`` before a long preparation that makes no batches.
    """

    def __init__(self, path: str | os.PathLike, rank: int, interval: float):
        self._mm, arr = _map(path)
        self.slot = arr[rank]
        self.slot[:] = 0
        self.slot[PID] = os.getpid()
        self.interval = float(interval)
        self._ppid = os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ooc-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, rank: int) -> "Heartbeat | None":
        """The heartbeat the launcher asked for (``OOC_HEARTBEAT``), else None."""
        path = os.environ.get(ENV_PATH)
        if not path:
            return None
        return cls(path, rank, interval_s(timeout_s()))

    def _run(self) -> None:
        self.slot[BEATS] += 1
        while not self._stop.wait(self.interval):
            self.slot[BEATS] += 1
            if os.getppid() != self._ppid:  # the launcher died (kill -9): nobody watches
                sys.stderr.write(f"ooc: worker pid {os.getpid()}: its launcher (pid "
                                 f"{self._ppid}) is gone; exiting\n")
                sys.stderr.flush()
                os._exit(LAUNCHER_GONE_RC)

    def beat(self) -> None:
        """One unit of work done (a batch): progress, and the phase is ``WORK``."""
        self.slot[PROGRESS] += 1
        self.slot[PHASE] = WORK

    def setup(self) -> None:
        """Preparing (no batches for a while): judged on liveness only until ``beat()``."""
        self.slot[PROGRESS] += 1
        self.slot[PHASE] = SETUP

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        """Mark the time spent waiting on the other workers."""
        before = int(self.slot[PHASE])
        self.slot[COLLECTIVES] += 1
        self.slot[PROGRESS] += 1
        self.slot[PHASE] = COLLECTIVE
        try:
            yield
        finally:
            self.slot[PROGRESS] += 1
            self.slot[PHASE] = before

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval + 1)


class HeartbeatMonitor:
    """The launcher's view of the workers' slots (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, workers: int, timeout: float,
                 startup: float | None = None, clock: Callable[[], float] = time.monotonic):
        self._mm, self.arr = _map(path)
        self.workers, self.timeout = int(workers), float(timeout)
        self.startup = max(self.timeout, STARTUP_S) if startup is None else float(startup)
        self.clock = clock
        now = clock()
        self.t0 = now
        self.last = self.arr.copy()
        self.beat_t = [now] * self.workers
        self.prog_t = [now] * self.workers

    def laggard(self, alive: list[int]) -> tuple[int, str] | None:
        """``(rank, reason)`` of the live worker the others were waiting for when their
        collective timed out: one not in a collective (still starting, or working), else
        the one that entered the fewest collectives; None when ``alive`` is empty."""
        if not alive:
            return None
        cur = self.arr.copy()
        outside = [r for r in alive if cur[r, PHASE] != COLLECTIVE or not cur[r, BEATS]]
        r = min(outside or alive, key=lambda q: (cur[q, COLLECTIVES], -self.prog_t[q]))
        where = ("not started (no heartbeat)" if not cur[r, BEATS] else
                 {SETUP: "still starting up", WORK: "still working"}.get(int(cur[r, PHASE]),
                                                                         "in a collective"))
        n = int(cur[r, COLLECTIVES])
        return r, (f"{where} ({n} collective{'s' if n != 1 else ''} entered, the rendezvous "
                   f"included) while the other workers timed out waiting for it")

    def check(self, alive: list[int], limit: float | None = None) -> tuple[int, str] | None:
        """``(rank, reason)`` of a worker that stopped making progress, else None.

        ``alive``: the ranks still running (exited ones are judged by their
        status). ``limit``: seconds of silence that count (default the
        timeout; the launcher passes less once a worker reported a lost peer).
        """
        now = self.clock()
        cur = self.arr.copy()
        for r in range(self.workers):
            if cur[r, BEATS] != self.last[r, BEATS]:
                self.beat_t[r] = now
            if cur[r, PROGRESS] != self.last[r, PROGRESS] or cur[r, PHASE] != self.last[r, PHASE]:
                self.prog_t[r] = now
        self.last = cur
        lim = self.timeout if limit is None else float(limit)
        why = (f"limit {ENV_TIMEOUT}={self.timeout:g}s" if limit is None
               else "seen after another worker lost its peer")
        for r in alive:
            if cur[r, BEATS] == 0:
                if now - self.t0 > self.startup:
                    return r, f"no heartbeat within {self.startup:.0f}s of its start"
                continue
            quiet = now - self.beat_t[r]
            if quiet > lim:
                return r, (f"no heartbeat for {quiet:.1f}s (the process is stopped, or frozen "
                           f"in native code); {why}")
            idle = now - self.prog_t[r]
            if cur[r, PHASE] == WORK and idle > lim:
                return r, f"no progress for {idle:.1f}s while working (hung); {why}"
        waiting = [r for r in alive if cur[r, BEATS] and cur[r, PHASE] == COLLECTIVE
                   and now - self.prog_t[r] > lim]
        if alive and len(waiting) == len(alive):
            r = min(waiting, key=lambda q: (cur[q, COLLECTIVES], -self.prog_t[q]))
            return r, (f"stuck in collective #{int(cur[r, COLLECTIVES])} for "
                       f"{now - self.prog_t[r]:.1f}s with every other worker waiting; {why}")
        return None
