"""A worker's environment: torchrun's variables, the timeouts, the launcher's child variables.

A process is a *worker* when ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` are set: by ``torchrun``, or by
:func:`~ooc.executor.distributed.launcher.launch`, which also sets
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the heartbeat's variables.

User settings (environment variables):

``OOC_DIST_TIMEOUT``
    seconds a collective may wait for the other workers (gloo's timeout),
    default 1800.
``OOC_HEARTBEAT_TIMEOUT``
    seconds without a heartbeat, or without progress outside a collective,
    after which the launcher declares a worker failed, default 120
    (:mod:`ooc.executor.distributed.heartbeat`).
"""
from __future__ import annotations

import math
import os
import socket
from typing import Any

from ooc.core.errors import InvalidValue

ENV_DIST_TIMEOUT = "OOC_DIST_TIMEOUT"
DEFAULT_DIST_TIMEOUT_S = 1800.0
#: The address the launcher's workers meet on.
LOOPBACK = "127.0.0.1"
_WORKER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def in_worker() -> bool:
    """Whether this process was started as a worker (by the launcher or by torchrun)."""
    return all(k in os.environ for k in _WORKER_VARS)


def env_rank() -> int:
    """``RANK`` (0 outside a worker)."""
    return int(os.environ.get("RANK", 0))


def node_rank() -> int:
    """The node this worker runs on: torchrun's ``GROUP_RANK`` (0 for the launcher's)."""
    return int(os.environ.get("GROUP_RANK", 0))


def identity() -> dict[str, Any]:
    """This worker as the others name it: ``rank``, ``node``, ``host`` and ``pid``."""
    return {"rank": env_rank(), "node": node_rank(), "host": socket.gethostname(),
            "pid": os.getpid()}


def describe(worker: dict[str, Any], full: bool) -> str:
    """``worker rank R``; with ``full`` (the workers run on several nodes) followed by
    ``(node N, host H, pid P)``."""
    name = f"worker rank {worker['rank']}"
    return f"{name} (node {worker['node']}, host {worker['host']}, pid {worker['pid']})" \
        if full else name


def env_world_size() -> int | None:
    """``WORLD_SIZE`` of a worker, else None."""
    return int(os.environ["WORLD_SIZE"]) if in_worker() else None


def seconds_from_env(name: str, default: float) -> float:
    """A positive, finite number of seconds from the variable ``name`` (unset or empty:
    ``default``); anything else is an :class:`OocError` naming the variable."""
    v = os.environ.get(name)
    try:
        t = float(v) if v else float(default)
    except ValueError:
        t = math.nan
    if not (t > 0 and math.isfinite(t)):
        raise InvalidValue(f"{name}={v!r}: expected a positive number of seconds")
    return t


def dist_timeout_s() -> float:
    """The collectives' timeout: ``OOC_DIST_TIMEOUT`` seconds, default 1800."""
    return seconds_from_env(ENV_DIST_TIMEOUT, DEFAULT_DIST_TIMEOUT_S)


def threads_per_worker(world: int) -> int:
    """Torch threads for one of the workers on this machine: the cores split evenly
    among ``LOCAL_WORLD_SIZE`` (default ``world``) workers, at least one."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, (os.cpu_count() or 1) // max(1, local))


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def worker_env(rank: int, workers: int, port: int, extra: dict[str, str]) -> dict[str, str]:
    """The environment of the launcher's worker ``rank`` of ``workers`` on this machine:
    this process's, with torchrun's variables, unbuffered output and ``extra``."""
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(workers), MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port),
                PYTHONUNBUFFERED="1", OOC_LAUNCHER_PID=str(os.getpid()), **extra)
