"""The child process :func:`ooc.partition.precompile.compile_partition_kernels` runs: it
partitions a tiny synthetic graph with the given algorithm and dtypes, so that numba compiles
(or loads from its cache) every kernel the real run will call."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from ooc.partition import partition_dataset
from ooc.partition.base import warm_up
from ooc.storage.ingest import generate_synthetic


def main(argv: list[str]) -> None:
    """``compile_partition_kernels``'s child: ALGO INDEX_DTYPE FEATURE_DTYPE ORDERED OPTIONS
    (JSON: parts, split, halo_hops, refine_passes, params)."""
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
