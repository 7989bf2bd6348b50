"""A feature-cache gather's misses: read into a row buffer and scattered, or read straight
into the batch's rows (``DirectFeatures.read_into``), side by side.

    python -m bench gather --nodes 2000000 --feature-dim 128 --rounds 9

Writes (once, under ``--work``) a ``features.bin`` of N x D float32, fills a
cache with a random 10% of the rows, then gathers batches of ``--batch`` distinct
random ids through ``FeatureCache.gather`` both ways, in alternating rounds, the
misses read with O_DIRECT from the disk: ``read_into`` over the reader itself,
``scatter`` over the same reader wrapped so that its rows are read into a row buffer
of their own and then scattered into the batch. Prints the medians (the warm-up
round dropped) and their ratio; ``--report`` writes them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ooc.caches.feature_cache import FeatureCache
from ooc.storage import DirectFeatures, FeatureLayout
from ooc.storage.features import FeatureWrapper

from . import harness as H


class ReadOnly(FeatureWrapper):
    """A row source that reads rows into a row buffer of their own, then scatters them
    into the target rows."""

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        got = self.inner.read(ids)
        if rows is None:
            out[:] = got
        else:
            out[rows] = got


def write_features(path: Path, n: int, dim: int) -> None:
    """``n`` x ``dim`` standard-normal float32 rows in ooc's page-aligned layout."""
    lay = FeatureLayout(n, dim, "float32")
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        step = max(1, (64 << 20) // lay.row_bytes // lay.rows_per_page * lay.rows_per_page)
        for s in range(0, n, step):
            part = FeatureLayout(min(step, n - s), dim, "float32")
            buf = np.zeros(part.file_bytes, np.uint8)
            part.view(buf)[:] = rng.standard_normal((part.num_rows, dim)).astype(np.float32)
            f.write(buf.data)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench gather", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=9, help="measured rounds (after a warm-up)")
    ap.add_argument("--work", default="bench_out/gather")
    ap.add_argument("--report", type=Path, default=None, help="JSON report (default: none)")
    a = ap.parse_args(argv)
    n, dim = a.nodes, a.feature_dim
    lay = FeatureLayout(n, dim, "float32")
    path = Path(a.work) / f"features_{n}_{dim}.bin"
    if not path.exists():
        write_features(path, n, dim)
    feats = DirectFeatures(path, lay)
    rng = np.random.default_rng(1)
    cache = FeatureCache(n, n // 10, dim, "float32")
    cache.switch(rng.choice(n, n // 10, replace=False), feats)
    sources = {"read_into": feats, "scatter": ReadOnly(feats)}
    batch = {"ids": rng.choice(n, min(a.batch, n), replace=False)}

    def case(name: str):
        def run() -> float:
            out = np.empty((len(batch["ids"]), dim), np.float32)
            return H.timed(lambda: cache.gather(batch["ids"], sources[name], out))()
        return run

    def next_batch(s: H.Sample) -> None:
        if s.case == H.round_order(list(sources), s.round)[-1]:   # a new batch each round
            batch["ids"] = rng.choice(n, min(a.batch, n), replace=False)

    rounds = H.run_rounds({k: case(k) for k in sources}, a.rounds, on_sample=next_batch)
    feats.close()
    med = H.medians(rounds)
    rel = H.ratio(med["read_into"]["s"], med["scatter"]["s"])
    print(f"{n:,} rows x {dim} float32, cache 10%, {a.batch:,} ids a batch, backend "
          f"{feats.backend}: scatter {med['scatter']['s'] * 1e3:.1f} ms, read_into "
          f"{med['read_into']['s'] * 1e3:.1f} ms, read_into / scatter {rel:.2f}")
    if a.report:
        H.write_report(a.report, "gather", {"medians": med, "read_into_over_scatter": rel,
                                            "backend": feats.backend},
                       spec={"nodes": n, "feature_dim": dim, "batch": a.batch},
                       samples=rounds, data_path=path, args=a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
