"""Fault injection into real multi-worker runs, for the tests only.

A process started with this folder first on ``PYTHONPATH`` loads its
``sitecustomize.py``; with ``OOC_TEST_FAULT=R:E[:how]`` set, that wraps
:meth:`ooc.executor.distributed.averaging_trainer.AveragingTrainer.train_local`
(a worker's local training of one epoch) when the module is imported, so
that rank ``R`` fails right after its local training of epoch ``E``, before
the epoch's first collective. ``how``: ``exit`` (``os._exit(3)``, the
default), ``raise`` (a RuntimeError), ``kill`` (SIGKILL to itself), ``stop``
(SIGSTOP to itself) or ``hang`` (the main thread sleeps for ever; the
heartbeat thread runs on). The variables reach the launcher's workers through
its environment; ooc itself reads neither.
"""
from __future__ import annotations

import os
from pathlib import Path

from .sitecustomize import ENV, parse

#: The folder to put on ``PYTHONPATH``.
FOLDER = Path(__file__).resolve().parent


def fault_env(rank: int, epoch: int, how: str = "exit") -> dict[str, str]:
    """The environment variables that make rank ``rank`` fail after epoch ``epoch``
    (``PYTHONPATH`` with this folder first, then this process's)."""
    spec = f"{rank}:{epoch}:{how}"
    parse(spec)
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(FOLDER), *([rest] if rest else [])]),
            ENV: spec}
