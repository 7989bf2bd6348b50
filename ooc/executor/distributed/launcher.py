"""The parent of ``python -m ooc.train --workers Q``: start the workers, watch them, name a failure.

:func:`launch` starts ``Q`` copies of ``python -m ooc.train`` on 127.0.0.1
(the environment of :func:`~ooc.executor.distributed.environment.worker_env`)
and forwards their output. The first worker to exit non-zero, or to stop
making progress (:mod:`ooc.executor.distributed.heartbeat`: no heartbeat, or no
progress outside a collective, for ``OOC_HEARTBEAT_TIMEOUT`` seconds), ends the
run: a stalled worker gets SIGKILL, the others SIGTERM (SIGKILL after
:data:`TERMINATE_GRACE_S`), and the parent prints
``ooc: worker rank R failed: <reason>`` and returns 1.

A worker that exits with :data:`~ooc.executor.distributed.comm.PEER_LOST_RC`
only lost a peer: the launcher waits up to :data:`CAUSE_WAIT_S` for the worker
that caused it (another non-zero exit, or a silent one) and names that one.
"""
from __future__ import annotations

import contextlib
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from ooc.executor.distributed import heartbeat as HB
from ooc.executor.distributed.comm import PEER_LOST_RC
from ooc.executor.distributed.environment import LOOPBACK, free_port, worker_env

#: Seconds the parent waits for the other workers to stop after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0
#: Seconds the parent waits for the failing worker after a peer-lost exit.
CAUSE_WAIT_S = 10.0
#: Seconds the parent waits for a worker's output to be forwarded after it ended.
OUTPUT_JOIN_S = 2.0


@dataclass
class Failure:
    """The worker that ended the run: by its exit status ``rc``, or stalled (``reason``
    from the heartbeat monitor, ``rc`` None)."""

    rank: int
    rc: int | None = None
    reason: str = ""


def describe_exit(rc: int) -> str:
    """``exit code N`` or ``killed by SIGNAME`` for a ``Popen.returncode``."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"killed by {name}"
    return f"exit code {rc}"


class WorkerGroup:
    """The launcher's children: their processes, their forwarded output, their exits.

    Output is forwarded line by line (stdout of rank 0 as is, every other
    stream prefixed ``[rank R]``); the last non-empty stderr line of each
    rank is kept for the failure message.
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.last_err: dict[int, str] = {}
        self._exits: "queue.Queue[tuple[int, int]]" = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, rank: int, cmd: Sequence[str], env: dict[str, str]) -> None:
        """Start worker ``rank`` (ranks in order 0, 1, ...)."""
        p = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, bufsize=1)
        self.procs.append(p)
        for stream, out, keep in ((p.stdout, sys.stdout, False), (p.stderr, sys.stderr, True)):
            prefix = "" if (rank == 0 and not keep) else f"[rank {rank}] "
            th = threading.Thread(target=self._forward, args=(stream, rank, out, prefix, keep),
                                  daemon=True)
            th.start()
            self._threads.append(th)
        threading.Thread(target=lambda: self._exits.put((rank, p.wait())), daemon=True).start()

    def _forward(self, stream: IO[str], rank: int, out: IO[str], prefix: str,
                 keep: bool) -> None:
        for line in iter(stream.readline, ""):
            if keep and line.strip():
                self.last_err[rank] = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
            with self._lock:
                out.write(prefix + line)
                out.flush()
        stream.close()

    def next_exit(self, timeout: float) -> tuple[int, int] | None:
        """``(rank, returncode)`` of the next worker to exit within ``timeout`` s, else None."""
        try:
            return self._exits.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self, rank: int) -> None:
        """SIGKILL (a stopped or hung worker may never act on SIGTERM)."""
        with contextlib.suppress(OSError):
            self.procs[rank].kill()

    def terminate(self) -> None:
        """SIGTERM to every live worker, SIGKILL to those alive after the grace period."""
        alive = [p for p in self.procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(OSError):
                p.terminate()
        t_end = time.monotonic() + TERMINATE_GRACE_S
        for p in alive:
            try:
                p.wait(timeout=max(0.0, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def join_output(self) -> None:
        """Wait for the forwarded output of the workers that ended."""
        for th in self._threads:
            th.join(timeout=OUTPUT_JOIN_S)

    def failure_message(self, f: Failure) -> str:
        """``ooc: worker rank R failed: <reason>`` (call after :meth:`join_output`)."""
        reason = f.reason if f.rc is None else describe_exit(f.rc)
        if f.rc is not None and self.last_err.get(f.rank):
            reason += f": {self.last_err[f.rank]}"
        return f"ooc: worker rank {f.rank} failed: {reason}"


def launch(argv: Sequence[str], workers: int, python: str | None = None) -> int:
    """Start ``workers`` copies of ``python -m ooc.train argv`` on 127.0.0.1 and watch them.

    ``python``: the interpreter (default this one). Returns 0 when every
    worker exited 0, else 1 after printing ``ooc: worker rank R failed: <reason>``.
    """
    port = free_port()
    hb_timeout = HB.timeout_s()
    hb_dir = Path(tempfile.mkdtemp(prefix="ooc-heartbeat-"))
    group = WorkerGroup()
    try:
        hb_path = HB.create_file(hb_dir / "heartbeat", workers)
        monitor = HB.HeartbeatMonitor(hb_path, workers, hb_timeout)
        t_start = time.perf_counter()
        print(f"ooc.train: starting {workers} worker processes on {LOOPBACK}:{port} (each "
              f"loads torch, PyG and the kernels before its first line)", flush=True)
        cmd = [python or sys.executable, "-m", "ooc.train", *argv]
        hb_env = {HB.ENV_PATH: str(hb_path), HB.ENV_TIMEOUT: str(hb_timeout)}
        for r in range(workers):
            group.start(r, cmd, worker_env(r, workers, port, hb_env))
        failure = watch(group, monitor, workers, HB.interval_s(hb_timeout))
        if failure is not None:
            group.terminate()
        group.join_output()
        if failure is not None:
            print(group.failure_message(failure), file=sys.stderr, flush=True)
            return 2 if failure.rc == 2 else 1  # a worker's one-line error stays exit 2
        print(f"ooc.train: {workers} workers finished in "
              f"{time.perf_counter() - t_start:.1f}s, start-up included", flush=True)
        return 0
    finally:
        group.terminate()
        shutil.rmtree(hb_dir, ignore_errors=True)


def watch(group: WorkerGroup, monitor: HB.HeartbeatMonitor, workers: int,
          poll: float) -> Failure | None:
    """Wait for the workers to end; the one that ended the run, or None if all exited 0."""
    running = set(range(workers))
    failure = _first_failure(group, monitor, running, poll)
    if failure is not None and failure.rc == PEER_LOST_RC:
        failure = _find_cause(group, monitor, running, poll) or failure
    return failure


def _first_failure(group: WorkerGroup, monitor: HB.HeartbeatMonitor, running: set[int],
                   poll: float) -> Failure | None:
    """The first non-zero exit or stalled worker (``running`` loses the exited ranks)."""
    while running:
        ended = group.next_exit(poll)
        if ended is None:
            stalled = _stalled(group, monitor, running)
            if stalled is not None:
                return stalled
            continue
        r, rc = ended
        running.discard(r)
        if rc != 0:
            return Failure(r, rc)
    return None


def _find_cause(group: WorkerGroup, monitor: HB.HeartbeatMonitor, running: set[int],
                poll: float) -> Failure | None:
    """After a peer-lost exit: the worker that caused it, exiting with another status
    within :data:`CAUSE_WAIT_S`, else one that has been silent that long, else the live
    worker the others were waiting for (:meth:`~.heartbeat.HeartbeatMonitor.laggard`: one
    still starting up or working while they sat in a collective)."""
    t_end = time.monotonic() + CAUSE_WAIT_S
    while time.monotonic() < t_end:
        ended = group.next_exit(max(0.01, min(poll, t_end - time.monotonic())))
        if ended is None:
            continue
        r, rc = ended
        running.discard(r)
        if rc not in (0, PEER_LOST_RC):
            return Failure(r, rc)
    found = _stalled(group, monitor, running, limit=CAUSE_WAIT_S)
    if found is None and running:  # alive and beating, yet the others timed out on it
        lag = monitor.laggard(sorted(running))
        if lag is not None:
            group.kill(lag[0])
            found = Failure(lag[0], reason=lag[1])
    return found


def _stalled(group: WorkerGroup, monitor: HB.HeartbeatMonitor, running: set[int],
             limit: float | None = None) -> Failure | None:
    """A running worker the monitor finds stalled, killed at once; else None."""
    found = monitor.check(sorted(running), limit=limit)
    if found is None:
        return None
    group.kill(found[0])
    return Failure(found[0], reason=found[1])
