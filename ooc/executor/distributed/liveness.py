"""Which workers are still alive, seen from any node: counters in the group's store.

The launcher watches its own workers (:mod:`.heartbeat`); under torchrun with
several nodes no process sees them all. So every worker of a group of several
runs a daemon thread that adds one to its counter ``ooc/alive/<run>/<rank>``
in the group's TCP store (``MASTER_ADDR:MASTER_PORT``: torchrun's agent store,
or the launcher's rank 0) every :data:`INTERVAL_S` seconds, over a connection
of its own. A worker whose collective lost a peer reads the counters twice,
:data:`SETTLE_S` seconds apart (:meth:`Liveness.gone`): those that did not move
belong to workers that are gone (killed, crashed, or their node is down), and
the worker names them (:func:`~.environment.describe`: rank, node, host, pid).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time

#: Seconds between a worker's beats in the store.
INTERVAL_S = 1.0
#: Seconds between the two readings of the counters that find the gone workers.
SETTLE_S = 3 * INTERVAL_S
#: Seconds a connection to the store may take (the store's host may be gone too).
CONNECT_S = 5.0


def _key(rank: int) -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"ooc/alive/{run}/{attempt}/{rank}"


def _connect():
    """A client connection to the group's store (an exception when it is unreachable)."""
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=CONNECT_S))


class Liveness:
    """This worker's beats in the store, and the reading of the others'."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ooc-liveness", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            store, key = _connect(), _key(self.rank)
            while True:
                store.add(key, 1)
                if self._stop.wait(INTERVAL_S):
                    return
        except Exception:  # the store's host is gone: nothing to beat into
            return

    def gone(self) -> list[int] | None:
        """The other workers whose counters did not move in :data:`SETTLE_S` seconds; None
        when the store cannot be read (its host is gone too)."""
        others = [r for r in range(self.world) if r != self.rank]
        try:
            store = _connect()
            before = [store.add(_key(r), 0) for r in others]
            time.sleep(SETTLE_S)
            after = [store.add(_key(r), 0) for r in others]
        except Exception:  # DistStoreError, a refused or closed connection
            return None
        return [r for r, b, a in zip(others, before, after, strict=True) if a == b]

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=2 * INTERVAL_S)
