"""The process group of the workers: rank, world size, sum/max reductions and a gather of
small objects over gloo; who is still alive (:mod:`.liveness`) when a collective fails."""
from __future__ import annotations

import contextlib
import datetime
from typing import Any, Callable

import torch

from ooc.executor.distributed.environment import dist_timeout_s, env_rank, env_world_size
from ooc.executor.distributed.heartbeat import Heartbeat
from ooc.executor.distributed.liveness import Liveness

#: Exit status of a worker whose collective failed because a peer vanished or timed out
#: (a consequence, not the cause: the launcher then waits a moment for the cause to exit).
PEER_LOST_RC = 75


class PeerLost(RuntimeError):
    """A collective failed: another worker died, or did not answer within the timeout."""


class Comm:
    """Rank, world size and reductions; a no-op group of one without torch.distributed.

    ``heartbeat``: marks the time spent in collectives for the launcher (None:
    not watched). A joined group of several also beats in the group's store
    (``liveness``), so that :meth:`gone` can tell which workers are gone.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, initialized: bool = False,
                 heartbeat: Heartbeat | None = None):
        self.rank, self.world_size, self.initialized = rank, world_size, initialized
        self.heartbeat = heartbeat
        self.liveness = Liveness(rank, world_size) if initialized else None

    @classmethod
    def from_env(cls, heartbeat: Heartbeat | None = None) -> "Comm":
        """Join the gloo group described by ``RANK``/``WORLD_SIZE``/``MASTER_*`` (env://),
        with ``OOC_DIST_TIMEOUT`` as the collectives' timeout."""
        import torch.distributed as dist

        rank, world = env_rank(), env_world_size() or 1
        if world == 1:
            return cls(0, 1, False, heartbeat)
        marks = heartbeat.collective() if heartbeat is not None else contextlib.nullcontext()
        try:
            with marks:  # the rendezvous waits on the others like a collective
                dist.init_process_group("gloo", init_method="env://", rank=rank,
                                        world_size=world,
                                        timeout=datetime.timedelta(seconds=dist_timeout_s()))
        except (RuntimeError, TimeoutError) as e:  # DistStoreError, a closed connection
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PeerLost(f"joining the workers failed, another worker did not arrive "
                           f"within the timeout or died ({msg[:240]})") from None
        return cls(rank, world, True, heartbeat)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the workers, in place; returns ``t``."""
        return self._all_reduce(t, "SUM")

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum of ``t`` over the workers, in place; returns ``t``."""
        return self._all_reduce(t, "MAX")

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every worker's ``obj`` (picklable, small), in rank order."""
        if not self.initialized:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        self._collective("all_gather", lambda: dist.all_gather_object(out, obj))
        return out

    def gone(self) -> list[int] | None:
        """The ranks of the other workers that are gone (:meth:`.Liveness.gone`); None when
        it cannot be told."""
        return self.liveness.gone() if self.liveness is not None else None

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        if not self.initialized:
            return t
        import torch.distributed as dist

        self._collective("all_reduce", lambda: dist.all_reduce(t, op=getattr(dist.ReduceOp, op)))
        return t

    def _collective(self, name: str, run: Callable[[], Any]) -> None:
        """``run()``, marked as a collective; :class:`PeerLost` when gloo fails it."""
        marks = self.heartbeat.collective() if self.heartbeat is not None \
            else contextlib.nullcontext()
        try:
            with marks:
                run()
        except RuntimeError as e:  # gloo: connection closed, or the timeout
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PeerLost(f"{name} failed, another worker died or timed out "
                           f"({msg[:240]})") from None

    def close(self) -> None:
        """Leave the process group (best effort: this runs on the way out)."""
        if self.liveness is not None:
            self.liveness.close()
        if not self.initialized:
            return
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        self.initialized = False
