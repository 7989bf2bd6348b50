"""``python -m bench NAME [flags]``: run one benchmark; ``python -m bench table REPORT.json``:
print the markdown table of a report."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

#: Benchmarks by name (module ``bench.<name>``), with what each measures.
BENCHMARKS = {
    "modes": "training modes side by side (baseline, static, ooc, in-RAM), each in a cgroup",
    "loader": "the data path alone (sample, gather, to_data), presets in alternating rounds",
    "scale": "papers100M's shape at any scale: ingest, train, infer, partition",
    "ingest": "edge-list ingest stays memory-bounded",
    "reader": "the O_DIRECT reader against fio",
    "gather": "a feature-cache gather's misses: scattered, or read straight into the batch",
    "workers": "gather threads of ooc.NodeLoader",
    "runtime_writes": "runtime files: plain writes or aiofiles",
    "pyg": "PyG's loaders over ooc.pyg",
    "link_parity": "link prediction: a PyG model over ooc.LinkLoader against full-batch PyG",
    "sampler": "sampling with the neighbor cache",
    "cache_policies": "feature-cache policies' miss ratios",
    "inspector": "the inspector's changesets beside sampling",
    "changesets": "Belady changesets on the CPU and on CUDA",
    "partition": "SPRING against the baseline partitioners",
    "inference": "layer-wise against sample-wise inference",
    "averaging": "model averaging's accuracy and time",
    "budget": "the memory budget: each mode in a cgroup of the budget",
    "labels": "reading labels: memmap or in memory",
    "page_cache": "small rows: what to cache and in which node order",
    "sparse_step": "SAGE and GCN by CSR spmm against stock PyG",
    "activation": "fused activation + dropout against torch's",
    "peak_stacks": "the stacks that hold memory at each new RSS high (a tool)",
}


def table(argv: list[str]) -> int:
    """Print the markdown table of the report ``argv[0]`` (its benchmark's ``table``)."""
    from .harness import generic_table

    if len(argv) != 1:
        print("usage: python -m bench table REPORT.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"{path}: not a readable JSON report ({e})", file=sys.stderr)
        return 2
    name = rep.get("benchmark") if isinstance(rep, dict) else None
    if name not in BENCHMARKS:
        print(f"{path}: not a report of python -m bench (its 'benchmark' is {name!r})",
              file=sys.stderr)
        return 2
    mod = importlib.import_module(f"bench.{name}")
    print(getattr(mod, "table", generic_table)(rep))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nbenchmarks:")
        for n, what in BENCHMARKS.items():
            print(f"  {n:<15} {what}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "table":
        return table(rest)
    if name not in BENCHMARKS:
        print(f"python -m bench: unknown benchmark {name!r} (choose from "
              f"{', '.join(BENCHMARKS)}, or table)", file=sys.stderr)
        return 2
    rc = importlib.import_module(f"bench.{name}").main(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
