"""The partitioning kernels compiled in a child process before a partition run.

See :func:`ooc.core.jit.compile_in_child`: on a cold numba cache, kernels compiled in the
partitioning process would leave LLVM's compile-time memory there (measured: 82 MiB over
the memory plan on a 222k-node graph), so the first run would peak above later runs and
above ``planned_peak_bytes``. The child partitions a tiny graph of the dataset's dtypes
with the run's options, which calls every kernel of the assignment, the refinement, the
metrics and the split with the argument types the real run gives them.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def compile_partition_kernels(dataset, parts: int, algo: str, *, split: bool = True,
                              halo_hops: int = 1, refine_passes: int = 1,
                              **params) -> str:
    """Compile (or find in numba's cache) the kernels ``partition_dataset(dataset, ...,
    algo, ...)`` runs, in a child process; returns how it went, in words."""
    from ooc.core.jit import compile_in_child

    ordered = dataset.meta.get("feature_order") is not None
    idt, fdt = np.dtype(dataset.index_dtype).name, np.dtype(dataset.feature_dtype).name
    options = {"parts": min(int(parts), 4), "split": bool(split), "halo_hops": int(halo_hops),
               "refine_passes": int(refine_passes), "params": params}
    key = f"partition|{algo}|{idt}|{fdt}|{ordered}|{json.dumps(options, sort_keys=True)}"
    return compile_in_child(key, "ooc.partition.precompile:_child_main",
                            [algo, idt, fdt, str(int(ordered)), json.dumps(options)])


def _child_main(argv: list[str]) -> None:
    """``compile_partition_kernels``'s child: ALGO INDEX_DTYPE FEATURE_DTYPE ORDERED OPTIONS
    (JSON: parts, split, halo_hops, refine_passes, params)."""
    from ooc.storage.ingest import generate_synthetic
    from ooc.partition import partition_dataset
    from ooc.partition.base import warm_up

    algo, idt, fdt, ordered, options = argv
    opts = json.loads(options)
    warm_up(algo, np.dtype(idt))  # a graph of over 2**31 nodes stores int64 ids
    with tempfile.TemporaryDirectory(prefix="ooc-partition-jit-") as tmp:
        data = generate_synthetic(Path(tmp) / "d", nodes=640, avg_degree=6, feature_dim=4,
                                  dtype=fdt, progress=False,
                                  reorder="locality" if int(ordered) else "none")
        partition_dataset(data, Path(tmp) / "p", opts["parts"], algo, split=opts["split"],
                          halo_hops=opts["halo_hops"], refine_passes=opts["refine_passes"],
                          chunk_edges=512, **opts["params"])


if __name__ == "__main__":
    _child_main(sys.argv[1:])
