"""The feature cache's lookups through its id map: hash table against a direct table.

    python tools/bench_id_map.py --nodes 111000000 --cached 3000000 --batch 300000

Fills a feature cache of ``--cached`` rows (``--dim`` float32) of a graph of
``--nodes`` nodes, then times a gather's hits (look every id of a batch up with
``find_many``, then copy the cached rows with ``copy_slot_rows``, as the cache does) for
random batches of ``--batch`` distinct ids, through the hash table the cache uses and
through a direct table of every node (what the cache used before), alternating the two
in each round. Prints the median per batch of each,
their ratio and the memory of each map.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ooc.caches import _cache_kernels as K  # noqa: E402
from ooc.caches.feature_cache import FeatureCache  # noqa: E402
from ooc.storage._id_map_kernels import find_many  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000_000)
    ap.add_argument("--cached", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    fc = FeatureCache(a.nodes, a.cached, a.dim, np.float32)
    ids = rng.choice(a.nodes, fc.capacity, replace=False).astype(np.int64)
    fc.slots.put(ids, np.arange(fc.capacity))
    direct = np.full(a.nodes, -1, np.int32)
    direct[ids] = np.arange(fc.capacity, dtype=np.int32)
    del ids
    tables = {"hash map": fc.slots.table, "direct table": (np.zeros(0, np.int32), direct, 0)}
    cache = fc.cache.view(np.uint32)
    out = np.empty((a.batch, a.dim), np.uint32)
    slots = np.empty(a.batch, np.int64)
    times: dict[str, list[float]] = {k: [] for k in tables}
    for r in range(a.rounds + 1):
        batch = rng.choice(a.nodes, a.batch, replace=False).astype(np.int64)
        hits = set()
        for name, (keys, vals, shift) in tables.items():
            t0 = time.perf_counter()
            find_many(keys, vals, shift, batch, slots)
            K.copy_slot_rows(slots, cache, out)
            hits.add(int((slots >= 0).sum()))
            if r:  # the first round compiles / loads the kernels
                times[name].append(time.perf_counter() - t0)
        assert len(hits) == 1, "the two maps disagree"
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{a.nodes:,} nodes, {fc.capacity:,} cached rows of {a.dim} float32, batches of "
          f"{a.batch:,} ids, {a.rounds} rounds")
    print(f"hash map ({'direct' if fc.slots.direct else 'hash'}, {fc.slots.nbytes / 2**20:.0f} MiB): "
          f"{med['hash map']:.2f} ms per batch")
    print(f"direct table ({direct.nbytes / 2**20:.0f} MiB): {med['direct table']:.2f} ms per batch")
    print(f"hash / direct: {med['hash map'] / med['direct table']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
