"""Counter-based random numbers shared by the numba kernels (splitmix64).

A draw is a pure function of its counters, so results never depend on thread
scheduling or on which work was done together. Imports nothing of ooc; the
synthetic generator (storage) and the sampler (inspector) both use it.
"""
from __future__ import annotations

import numba as nb
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@nb.njit(inline="always", cache=True)
def mix64(z):
    """splitmix64 finaliser; ``z`` and the result are uint64."""
    z = (z ^ (z >> _S30)) * M1
    z = (z ^ (z >> _S27)) * M2
    return z ^ (z >> _S31)
