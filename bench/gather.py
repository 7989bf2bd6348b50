"""A feature-cache gather's misses: read into a row buffer and scattered, or read straight
into the batch's rows (``DirectFeatures.read_into``), side by side.

    python tools/bench_gather.py --nodes 2000000 --feature-dim 128 --rounds 9

Writes (once, under ``--work``) a ``features.bin`` of N x D float32, fills a
cache with a random 10% of the rows, then gathers batches of ``--batch`` distinct
random ids through it both ways, interleaved (order alternated per round), the
misses read with O_DIRECT from the disk. Prints the medians (the first round
dropped) and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ooc.executor.cache.feature_cache import K, FeatureCache, _bits  # noqa: E402
from ooc.storage import DirectFeatures, FeatureLayout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--work", default="bench_out/gather")
    a = ap.parse_args()
    n, dim = a.nodes, a.feature_dim
    lay = FeatureLayout(n, dim, "float32")
    path = Path(a.work) / f"features_{n}_{dim}.bin"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            step = max(1, (64 << 20) // lay.row_bytes // lay.rows_per_page * lay.rows_per_page)
            for s in range(0, n, step):
                rows = rng.standard_normal((min(step, n - s), dim)).astype(np.float32)
                buf = np.zeros(FeatureLayout(len(rows), dim, "float32").file_bytes, np.uint8)
                FeatureLayout(len(rows), dim, "float32").view(buf)[:] = rows
                f.write(buf.data)
    feats = DirectFeatures(path, lay)
    rng = np.random.default_rng(1)
    cache = FeatureCache(n, n // 10, dim, "float32")
    cache.switch(rng.choice(n, n // 10, replace=False), feats)
    times: dict[str, list[float]] = {"scatter": [], "read_into": []}
    for r in range(a.rounds):
        ids = rng.choice(n, min(a.batch, n), replace=False)
        for name in ("scatter", "read_into") if r % 2 else ("read_into", "scatter"):
            out = np.empty((len(ids), dim), np.float32)
            t0 = time.perf_counter()
            slots = cache.slots.get(ids)
            K.copy_slot_rows(slots, _bits(cache.cache), _bits(out))
            miss = np.flatnonzero(slots < 0)
            if name == "scatter":
                K.scatter_rows(_bits(np.ascontiguousarray(feats.read(ids[miss]))), miss,
                               _bits(out))
            else:
                feats.read_into(ids[miss], out, miss)
            times[name].append(time.perf_counter() - t0)
    feats.close()
    med = {k: statistics.median(v[1:] or v) for k, v in times.items()}
    print(f"{n:,} rows x {dim} float32, cache 10%, {a.batch:,} ids a batch, backend "
          f"{feats.backend}: scatter {med['scatter'] * 1e3:.1f} ms, read_into "
          f"{med['read_into'] * 1e3:.1f} ms, read_into / scatter "
          f"{med['read_into'] / med['scatter']:.2f}")


if __name__ == "__main__":
    main()
