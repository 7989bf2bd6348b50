"""The partitioning kernels compiled in a child process before a partition run.

See :func:`ooc.core.jit.compile_in_child`: on a cold numba cache, kernels compiled in the
partitioning process would leave LLVM's compile-time memory there (tens of MiB over the
memory plan), so the first run would peak above later runs and
above ``planned_peak_bytes``. The child partitions a tiny graph of the dataset's dtypes
with the run's options, which calls every kernel of the assignment, the refinement, the
metrics and the split with the argument types the real run gives them.
"""
from __future__ import annotations

import json

import numpy as np

from ooc.core.jit import compile_in_child


def compile_partition_kernels(dataset, parts: int, algo: str, *, split: bool = True,
                              halo_hops: int = 1, refine_passes: int = 1,
                              **params) -> str:
    """Compile (or find in numba's cache) the kernels ``partition_dataset(dataset, ...,
    algo, ...)`` runs, in a child process; returns how it went, in words."""

    ordered = dataset.meta.get("feature_order") is not None
    idt, fdt = np.dtype(dataset.index_dtype).name, np.dtype(dataset.feature_dtype).name
    options = {"parts": min(int(parts), 4), "split": bool(split), "halo_hops": int(halo_hops),
               "refine_passes": int(refine_passes), "params": params}
    key = f"partition|{algo}|{idt}|{fdt}|{ordered}|{json.dumps(options, sort_keys=True)}"
    return compile_in_child(key, "ooc.partition.compile_child:main",
                            [algo, idt, fdt, str(int(ordered)), json.dumps(options)])
