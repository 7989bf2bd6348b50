"""Price of the neighbour-id bounds checks in the sampler kernels (issue 17):
in-memory sampling at a git revision without them against this checkout,
interleaved runs in one invocation, medians.

    python tools/bench_bounds_check.py --baseline 47557fa --nodes 500000 --edges 10000000

Two measurements: the ``hop_dedup`` kernel alone (both revisions' kernels
loaded in this process, the same hop-1 input of 32 batches, process CPU time,
median of 30 alternating calls), then whole sampling runs.

The baseline revision is extracted with ``git archive`` into ``--work`` (its
numba kernels compile once there). Each run is a fresh process that imports
ooc from one tree, samples the same seeded batches (fanouts 15,10,5) from an
in-memory ``indices`` array after a warm-up, and prints the seconds; both
trees' batches are checked to be identical.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
from ooc.sampling import NeighborSampler, derive_seed, epoch_batches
indptr = np.load(sys.argv[1]); indices = np.load(sys.argv[2], mmap_mode=None)
train = np.load(sys.argv[3]); bs, nb = int(sys.argv[4]), int(sys.argv[5])
s = NeighborSampler(indptr, indices, [15, 10, 5])
batches = epoch_batches(train, bs, seed=1, epoch=0)[:nb]
seeds = [derive_seed(1, 0, i) for i in range(len(batches))]
s.sample_many(batches[:4], seeds[:4])                     # compile / load kernels
t, c = time.perf_counter(), time.process_time()
out = s.sample_many(batches, seeds)
dt, dc = time.perf_counter() - t, time.process_time() - c
h = hashlib.sha256()
for b in out:
    h.update(b.node_ids.tobytes()); h.update(b.edge_index.tobytes())
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "edges": sum(b.num_edges for b in out),
                  "digest": h.hexdigest()}))
"""


def run(tree: Path, files: list[str], bs: int, nb: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, *files, str(bs), str(nb)], cwd=tree,
                       env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def kernel_only(old_tree: Path, work: Path, files: list[str], N: int) -> None:
    """hop_dedup of the baseline revision against this checkout's, in one process."""
    import shutil
    import time

    import numpy as np

    pkg = work / "oldpkg" / "oldooc"
    (pkg / "inspector").mkdir(parents=True, exist_ok=True)
    for f in ("__init__.py", "inspector/__init__.py"):
        (pkg / f).touch()
    shutil.copy(old_tree / "ooc" / "_random_kernels.py", pkg / "_random_kernels.py")
    shutil.copy(old_tree / "ooc" / "inspector" / "_sampler_kernels.py", pkg / "inspector")
    sys.path.insert(0, str(pkg.parent))
    from oldooc.inspector import _sampler_kernels as OK

    from ooc.sampling import _sampler_kernels as NK
    from ooc.sampling.sampler import epoch_batches

    indptr, indices, train = (np.load(f) for f in files)
    batches = epoch_batches(train, 256, seed=1, epoch=0)[:32]
    B = len(batches)
    ptr = np.zeros(B + 1, np.int64)
    np.cumsum([b.shape[0] for b in batches], out=ptr[1:])
    front = np.concatenate(batches)
    counts = np.empty(front.shape[0], np.int64)
    NK.hop_counts(front, indptr, 15, counts)
    offsets = np.zeros(front.shape[0] + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    m = int(offsets[-1])
    rel, epos = np.empty(m, np.int64), np.empty(m, np.int64)
    NK.hop_select(front, np.repeat(np.arange(B), np.diff(ptr)), np.arange(B, dtype=np.int64), 1,
                  indptr, offsets, rel, epos)
    nbr = indices[epos].astype(np.int64)

    def call(checked: bool) -> float:
        src, dst, nn = (np.empty(m, np.int64) for _ in range(3))
        nc = np.zeros(B, np.int64)
        t = time.process_time()
        if checked:
            NK.hop_dedup(front, ptr, ptr, offsets, nbr, N, src, dst, nn, nc, np.full(B, -1, np.int64))
        else:
            OK.hop_dedup(front, ptr, ptr, offsets, nbr, src, dst, nn, nc)
        return time.process_time() - t

    call(False), call(True)
    res: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(30):
        for checked in (False, True):
            res[checked].append(call(checked))
    old_ms, new_ms = (statistics.median(res[k]) * 1e3 for k in (False, True))
    print(f"hop_dedup kernel, {m} sampled edges (hop 1 of 32 batches of 256): baseline {old_ms:.3f} ms, "
          f"checked {new_ms:.3f} ms CPU (median of 30); checked / baseline = {new_ms / old_ms:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision without the bounds checks")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", default=None, help="folder for the graph and the baseline tree")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_bounds_"))
    work.mkdir(parents=True, exist_ok=True)
    old = work / f"tree-{a.baseline}"
    if not old.exists():
        old.mkdir()
        arc = subprocess.run(["git", "archive", a.baseline], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=arc.stdout, check=True)
    sys.path.insert(0, str(REPO))
    import numpy as np

    from ooc.storage import csc_from_edges

    files = [str(work / f"{k}_{a.nodes}_{a.edges}.npy") for k in ("indptr", "indices", "train")]
    if not Path(files[0]).exists():
        rng = np.random.default_rng(0)
        n, e = a.nodes, a.edges
        perm = rng.permutation(n)
        src = perm[(n * rng.random(e) ** 2.2).astype(np.int64)]
        dst = perm[(n * rng.random(e) ** 1.8).astype(np.int64)]
        indptr, indices = csc_from_edges(src, dst, n)
        np.save(files[0], indptr)
        np.save(files[1], indices.astype(np.int32))
        np.save(files[2], rng.choice(n, n // 10, replace=False).astype(np.int64))
    kernel_only(old, work, files, N=a.nodes)
    trees = {"baseline": old, "checked": REPO}
    times: dict[str, list[float]] = {k: [] for k in trees}
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    digests = {}
    for _ in range(a.repeats):
        for name, tree in trees.items():
            r = run(tree, files, a.batch_size, a.batches)
            times[name].append(r["seconds"])
            cpu[name].append(r["cpu_seconds"])
            digests[name] = r["digest"]
            edges = r["edges"]
    if digests["baseline"] != digests["checked"]:
        raise SystemExit("the two trees sampled different batches")
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{a.batches} batches of {a.batch_size} seeds, fanouts 15,10,5, {edges} sampled edges; "
          f"median of {a.repeats} interleaved runs (wall and process CPU seconds)")
    for k in trees:
        print(f"  {k:9s} wall {med[k]:.3f} s  cpu {mcpu[k]:.3f} s  "
              f"({edges / med[k] / 1e6:.2f} M edges/s)  wall runs {[round(x, 2) for x in times[k]]}")
    print(f"  checked / baseline: wall {med['checked'] / med['baseline']:.3f}, "
          f"cpu {mcpu['checked'] / mcpu['baseline']:.3f}")


if __name__ == "__main__":
    main()
