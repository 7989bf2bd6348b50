"""numba kernel of :class:`ooc.storage.neighbors.MmapNeighbors` (nogil: run from many
threads, so the page faults of one overlap with those of the others)."""
from __future__ import annotations

import numba as nb


@nb.njit(nogil=True, cache=True)
def gather_ids(indices, edge_pos, out, start, end):
    """out[k] = indices[edge_pos[k]] for k in [start, end) (int32/int64 memmap)."""
    for k in range(start, end):
        out[k] = indices[edge_pos[k]]
