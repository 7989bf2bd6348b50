"""The ingest kernels compiled in a child process before an ingest.

See :func:`ooc.core.jit.compile_in_child`: on a cold numba cache, kernels compiled in the
ingesting process would leave LLVM's compile-time memory there (tens of MiB above a warm
run), so a first ingest would peak above later ones and its
memory plan. The child ingests a tiny graph with the run's options: an edge list of
``.npy`` files (edges reach every ingest's passes as int64 chunks, whatever their file:
the count, scatter, sort and compaction kernels, the locality order and the row placement,
and once more with a buffer that routes the entries of many windows and places the rows
through bucket files),
a tiny text edge list and CSV rows (the parsers of the text formats), or, for the
``synthetic`` command, a tiny generated graph.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from ooc.core.jit import compile_in_child
from ooc.storage.ingest import generate_synthetic, ingest_edgelist
from ooc.storage.ingest.ogb import parse_rows

#: An ingest buffer small enough for the child's graphs to be cut into windows whose
#: entries are routed (:mod:`.edge_buckets`), as large graphs are.
ROUTED_BUFFER = 8 << 10


def compile_ingest_kernels(command: str, *, undirected: bool = True, dedup: bool = False,
                           remove_self_loops: bool = False, dtype: str | None = None,
                           reorder: str = "auto") -> str:
    """Compile (or find in numba's cache) the kernels ``python -m ooc.prepare command``
    runs with these options, in a child process; returns how it went, in words."""

    options = {"undirected": bool(undirected), "dedup": bool(dedup),
               "remove_self_loops": bool(remove_self_loops), "dtype": dtype or "float32",
               "reorder": reorder}
    kind = "synthetic" if command == "synthetic" else "files"
    key = f"ingest|{kind}|{json.dumps(options, sort_keys=True)}"
    return compile_in_child(key, "ooc.storage.ingest.precompile:_child_main",
                            [kind, json.dumps(options)])


def _child_main(argv: list[str]) -> None:
    """``compile_ingest_kernels``'s child: KIND (``synthetic`` or ``files``) OPTIONS (JSON)."""

    kind, options = argv
    o = json.loads(options)
    common = dict(progress=False, reorder=o["reorder"], buffer_bytes=1 << 20)
    with tempfile.TemporaryDirectory(prefix="ooc-ingest-jit-") as name:
        tmp = Path(name)
        if kind == "synthetic":
            for out, buffer in ((tmp / "d", 1 << 20), (tmp / "r", ROUTED_BUFFER)):
                generate_synthetic(out, nodes=640, avg_degree=6, feature_dim=4,
                                   dtype=o["dtype"], undirected=o["undirected"],
                                   community_size=16, **{**common, "buffer_bytes": buffer})
            return
        rng = np.random.default_rng(0)
        n, e = 640, 4000
        np.save(tmp / "edges.npy", rng.integers(0, n, (2, e)))
        np.save(tmp / "x.npy", rng.standard_normal((n, 4)).astype(np.float32))
        np.save(tmp / "y.npy", rng.integers(0, 5, n))
        np.save(tmp / "train.npy", np.arange(0, n, 3))
        opts = dict(undirected=o["undirected"], dedup=o["dedup"],
                    remove_self_loops=o["remove_self_loops"], feature_dtype=o["dtype"], **common)
        ingest_edgelist(tmp / "edges.npy", tmp / "d", features=tmp / "x.npy",
                        labels=tmp / "y.npy", train_idx=tmp / "train.npy", **opts)
        ingest_edgelist(tmp / "edges.npy", tmp / "r", features=tmp / "x.npy",
                        **{**opts, "buffer_bytes": ROUTED_BUFFER})
        (tmp / "edges.csv").write_text("".join(f"{i % n},{(7 * i) % n}\n" for i in range(e)))
        ingest_edgelist(tmp / "edges.csv", tmp / "t", num_nodes=n, **opts)
        parse_rows(tmp / "x.csv", b"0.5,1\n2,3e-1\n", 0, 2)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
