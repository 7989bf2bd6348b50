"""The process group of the workers: rank, world size and sum/max reductions over gloo."""
from __future__ import annotations

import contextlib
import datetime

import torch

from .environment import dist_timeout_s, env_rank, env_world_size
from .heartbeat import Heartbeat

#: Exit status of a worker whose collective failed because a peer vanished or timed out
#: (a consequence, not the cause: the launcher then waits a moment for the cause to exit).
PEER_LOST_RC = 75


class PeerLost(RuntimeError):
    """A collective failed: another worker died, or did not answer within the timeout."""


class Comm:
    """Rank, world size and reductions; a no-op group of one without torch.distributed.

    ``heartbeat``: marks the time spent in collectives for the launcher (None:
    not watched).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, initialized: bool = False,
                 heartbeat: Heartbeat | None = None):
        self.rank, self.world_size, self.initialized = rank, world_size, initialized
        self.heartbeat = heartbeat

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

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        if not self.initialized:
            return t
        import torch.distributed as dist

        marks = self.heartbeat.collective() if self.heartbeat is not None \
            else contextlib.nullcontext()
        try:
            with marks:
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        except RuntimeError as e:  # gloo: connection closed, or the timeout
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PeerLost(f"all_reduce failed, another worker died or timed out "
                           f"({msg[:240]})") from None
        return t

    def close(self) -> None:
        """Leave the process group (best effort: this runs on the way out)."""
        if not self.initialized:
            return
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        self.initialized = False
