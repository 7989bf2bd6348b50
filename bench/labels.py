"""Reading a batch's labels: by page through the page cache (``Dataset.read_labels``, an
``EntryReader``) against indexing the ``labels.npy`` memmap, side by side.

    python -m bench labels DATA [DATA ...] [--batch 1024] [--batches 50] [--rounds 5]

Per dataset: milliseconds per read of ``--batch`` labels at random (median of the rounds,
the two ways alternating in order, page cache warm), and the RSS a memmap read mapped at
its largest.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ooc
from ooc.core.memory import current_rss_bytes, peak_rss_bytes, reset_peak_rss
from ooc.storage.pagecache import release_mapped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench labels", description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="+")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    for path in a.data:
        ds = ooc.open_dataset(path)
        rng = np.random.default_rng(0)
        batches = [rng.choice(ds.num_nodes, min(a.batch, ds.num_nodes), replace=False)
                   for _ in range(a.batches)]
        mapped = [0]

        def memmap(ids: np.ndarray, ds=ds, mapped=mapped) -> np.ndarray:
            ok = reset_peak_rss()
            r0 = current_rss_bytes()
            out = np.asarray(ds.labels[ids], dtype=np.int64)
            if ok:
                mapped[0] = max(mapped[0], peak_rss_bytes() - r0)
            release_mapped(ds.labels)
            return out

        ways = {"memmap": memmap, "pages": ds.read_labels}
        for b in batches[:3]:
            assert np.array_equal(memmap(b), ds.read_labels(b))
        ms: dict[str, list[float]] = {k: [] for k in ways}
        for r in range(a.rounds):
            for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                t = time.perf_counter()
                for b in batches:
                    ways[name](b)
                ms[name].append((time.perf_counter() - t) / len(batches) * 1e3)
        med = {k: float(np.median(v)) for k, v in ms.items()}
        print(f"{path}: {ds.num_nodes:,} nodes; {a.batch} labels: pages {med['pages']:.3f} ms, "
              f"memmap {med['memmap']:.3f} ms ({med['pages'] / med['memmap']:.2f}x); "
              f"a memmap read mapped up to {mapped[0] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
