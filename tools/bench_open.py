"""What opening a dataset costs: the RSS ``ooc.open_dataset`` adds to a fresh process,
and its wall time, with the page cache dropped first when allowed (root).

    python tools/bench_open.py DATA [DATA ...]

Prints one line per dataset: nodes, edges, seconds, MiB added, bytes per node.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys, time, psutil
import ooc
p = psutil.Process()
r = p.memory_info().rss
t = time.perf_counter()
ds = ooc.open_dataset(sys.argv[1])
print(json.dumps({"nodes": ds.num_nodes, "edges": ds.num_edges, "s": time.perf_counter() - t,
                  "added": p.memory_info().rss - r}))
"""


def drop_caches() -> bool:
    """Drop the page cache (needs root); False where not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="+")
    args = ap.parse_args()
    for d in args.data:
        cold = drop_caches()
        out = subprocess.run([sys.executable, "-c", CHILD, d], capture_output=True, text=True)
        if out.returncode:
            print(f"{d}: {out.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        r = json.loads(out.stdout)
        print(f"{d}: {r['nodes']:,} nodes, {r['edges']:,} edges: open {r['s']:.2f}s "
              f"({'cold' if cold else 'warm'} cache), +{r['added'] / 2**20:.0f} MiB "
              f"({r['added'] / max(r['nodes'], 1):.2f} B/node)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
