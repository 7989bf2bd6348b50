"""Runtime files of one superbatch: plain writes against aiofiles, side by side.

    python -m bench runtime_writes --rounds 7

The inspector writes each superbatch's sampled batches (``ooc.sampling.runtime``)
from its own thread. This times ``write_samples`` (plain writes, what ooc does)
against the same files written through aiofiles from an event loop per
superbatch (``asyncio.gather`` over the files), at two superbatch sizes, the
variants interleaved; medians. aiofiles is not a dependency of ooc: without it
only the plain column is printed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from ooc.sampling import runtime as R


def aiofiles_write(folder: Path, samples: R.SuperbatchSamples) -> None:
    import aiofiles

    async def one(path: Path, arr: np.ndarray) -> None:
        tmp = path.with_name(path.name + ".tmp")
        async with aiofiles.open(tmp, "wb") as f:
            await f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        os.replace(tmp, path)

    async def all_files() -> None:
        arrays = samples.arrays()
        await asyncio.gather(*(one(folder / f"{k}.bin", a) for k, a in arrays.items()))
        spec = {k: {"dtype": a.dtype.name, "shape": list(a.shape)} for k, a in arrays.items()}
        async with aiofiles.open(folder / (R.SAMPLE_MARK + ".tmp"), "w") as f:
            await f.write(json.dumps(spec))
        os.replace(folder / (R.SAMPLE_MARK + ".tmp"), folder / R.SAMPLE_MARK)

    folder.mkdir(parents=True, exist_ok=True)
    asyncio.run(all_files())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench runtime_writes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--work", default="bench_out/runtime_writes")
    a = ap.parse_args(argv)
    variants = {"plain": R.write_samples}
    try:
        import aiofiles  # noqa: F401
        variants["aiofiles"] = aiofiles_write
    except ImportError:
        print("aiofiles is not installed: plain writes only (pip install aiofiles to compare)")
    rng = np.random.default_rng(0)
    root = Path(a.work)
    for s, ids_per, edges_per in [(4, 50_000, 60_000), (16, 300_000, 400_000)]:
        samples = R.SuperbatchSamples(
            rng.integers(0, 10**7, s * ids_per), np.arange(s + 1) * ids_per,
            rng.integers(0, ids_per, (2, s * edges_per)).astype(np.int32),
            np.arange(s + 1) * edges_per, np.ones((s, 4), np.int64), np.ones((s, 3), np.int64))
        times: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(a.rounds):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in names:
                folder = root / name
                shutil.rmtree(folder, ignore_errors=True)
                t0 = time.perf_counter()
                variants[name](folder, samples)
                times[name].append(time.perf_counter() - t0)
        shutil.rmtree(root, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        line = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
        ratio = f", plain / aiofiles {med['plain'] / med['aiofiles']:.2f}" if "aiofiles" in med else ""
        print(f"superbatch of {s} batches ({samples.nbytes / 2**20:.0f} MiB): {line}{ratio}")


if __name__ == "__main__":
    main()
