"""Shared fixtures: small datasets built in temp folders."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings as hypothesis_settings

import ooc
from ooc.storage import csc_from_edges, write_dataset

# property tests draw the same examples on every run and machine (no example database)
hypothesis_settings.register_profile("ooc", derandomize=True, database=None)
hypothesis_settings.load_profile("ooc")

# the test process runs as ooc's commands do (OpenMP pools that do not busy-wait, tuned
# malloc); `import ooc` alone changes nothing process-wide
ooc.configure_process()


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (pyproject's default): a worker for each core this process may run on, at
    most 4 (each worker holds ~1 GiB and compiles numba's kernels it meets first)."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CORA_RAW = SHARED / "data" / "planetoid" / "Cora" / "raw"


def require_cora() -> Path:
    """The Planetoid Cora raw folder in ``../shared``; the test fails (not skips) without it."""
    if not CORA_RAW.is_dir():
        pytest.fail(f"{CORA_RAW} is missing: the tests need the project's shared/ folder beside "
                    f"the checkout (../shared/data/planetoid/Cora/raw)", pytrace=False)
    return CORA_RAW


@pytest.fixture
def cora_raw() -> Path:
    return require_cora()


def assert_one_line_error(stderr: str, *needles: str) -> str:
    """``stderr`` of a failed CLI: ``ooc: note:`` lines, then one ``ooc: <error>`` line, last,
    containing every needle; no traceback. Returns the error line."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert "Traceback" not in stderr, stderr[-3000:]
    *before, last = lines
    assert last.startswith("ooc: ") and not last.startswith("ooc: note:"), stderr[-3000:]
    assert all(line.startswith("ooc: note: ") for line in before), stderr[-3000:]
    for n in needles:
        assert n in last, (n, last)
    return last


def budget_above(extra: int) -> int:
    """A memory budget of ``extra`` bytes above what this process holds now (a test process
    that has run many tests holds more than a fresh script)."""
    from ooc.core.memory import current_rss_bytes

    return current_rss_bytes() + extra


def backend_or_skip(backend: str, path) -> None:
    """Skip unless ``backend`` can read ``path`` here: the probe's verdict, taken in a child
    process for a native binding, so a wheel built for another CPU (SIGILL) is never
    imported by the test process."""
    from ooc.storage import DirectReader, OocError

    try:
        DirectReader(path, backend=backend).close()
    except OocError as e:
        pytest.skip(f"{backend} cannot run on this machine: {str(e).split(': ', 1)[-1]}")


def feature_file(tmp_path: Path, num_rows: int, dim: int, dtype: str, seed: int = 0):
    """``features.bin`` of ``num_rows`` random rows laid out as ooc stores them: ``(path,
    layout, rows)`` (rows: [num_rows, dim] of ``dtype``)."""
    from ooc.storage import FeatureLayout

    lay = FeatureLayout(num_rows, dim, dtype)
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((num_rows, dim)).astype(dtype)
    buf = np.zeros(lay.file_bytes, np.uint8)
    lay.view(buf)[0:num_rows] = rows
    path = tmp_path / f"features_{dim}_{dtype}.bin"
    buf.tofile(path)
    return path, lay, rows


def in_threads(work, n: int = 4) -> list[BaseException]:
    """Run ``work(k)`` for ``k`` in ``range(n)``, each on a thread of its own, all at once;
    the exceptions they raised (an assertion in a thread is otherwise lost)."""
    import threading

    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


#: A stand-in native binding: ``Crash`` kills its process with a signal in its constructor,
#: as a wheel built for another CPU does; ``Refuse`` refuses as a kernel without io_uring.
STAND_IN_BINDING = """
import os, signal
from ooc.storage.io_backends import ReadBackend, Refused

class Crash(ReadBackend):
    name = "crashy"
    probe_in_child = True

    @classmethod
    def version(cls):
        return "{version}"

    def __init__(self, path, size, queue_depth, page_cache=False):
        os.kill(os.getpid(), signal.{sig})

class Refuse(ReadBackend):
    name = "refusing"

    def __init__(self, path, size, queue_depth, page_cache=False):
        raise Refused("io_uring_setup failed: Operation not permitted")
"""


def write_stand_in_binding(folder: Path, module: str, sig: str = "SIGILL",
                           version: str = "9.9") -> Path:
    """``folder/module.py`` holding :data:`STAND_IN_BINDING` (put ``folder`` on PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(STAND_IN_BINDING.replace("{sig}", sig).replace("{version}", version))
    return path


def mount_small_tmpfs(path: Path, size: str = "256k") -> str | None:
    """Mount a tmpfs of ``size`` at ``path`` (created) to fill a disk; None, or why it
    cannot be done here (the caller skips with that reason and unmounts in a finally)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        return "mounting a small tmpfs (to fill a disk) needs root"
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"mount -t tmpfs refused: {r.stderr.strip()}"


def mapped_kib(path) -> int:
    """KiB of this process's RSS that map ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = len(head) >= 6 and head[-1] == str(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def random_graph(n: int, e: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random directed edges (src, dst), int64 [e] each."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, e), rng.integers(0, n, e)


def community_graph(out: Path, n: int = 400, classes: int = 3, seed: int = 0,
                    dim: int = 8) -> Path:
    """A graph whose edges mostly stay inside the label's class and whose
    features carry the label (so models learn); splits 50/25/25%."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    src, dst = rng.integers(0, n, 20 * n), rng.integers(0, n, 20 * n)
    keep = (y[src] == y[dst]) | (rng.random(src.size) < 0.05)
    indptr, indices = csc_from_edges(src[keep], dst[keep], n)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[np.arange(n), y] += 1.0
    perm = rng.permutation(n)
    a, b = n // 2, 3 * n // 4
    return write_dataset(out, indptr, indices, x, y, perm[:a], perm[a:b], perm[b:],
                         num_classes=classes)


def skewed_dataset(out: Path, seed: int, dim: int, dtype: str, n: int = 3000):
    """A dataset of ``n`` nodes with Pareto-skewed (hot) sources, 30,000 edges, features
    ``[n, dim]`` of ``dtype``, 3 classes and a 1500/300/rest split. Returns
    ``(Dataset, x)``."""
    rng = np.random.default_rng(seed)
    src = (rng.pareto(1.2, 30000) * 50).astype(np.int64) % n   # hot sources
    dst = rng.integers(0, n, 30000)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, dim)).astype(dtype)
    perm = rng.permutation(n)
    p = write_dataset(out, indptr, indices, x, labels=rng.integers(0, 3, n),
                      train_idx=np.sort(perm[:1500]), val_idx=np.sort(perm[1500:1800]),
                      test_idx=np.sort(perm[1800:]), num_classes=3)
    return ooc.open_dataset(p), x


@pytest.fixture
def small_dataset(tmp_path: Path):
    """A 500-node random graph with 64-dim float32 features and 4 classes.

    Returns (path, arrays) where arrays holds the in-memory reference copies.
    """
    n, d = 500, 64
    src, dst = random_graph(n, 4000, seed=1)
    indptr, indices = csc_from_edges(src, dst, n)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, 4, n)
    perm = rng.permutation(n)
    arrays = dict(indptr=indptr, indices=indices, features=x, labels=y,
                  train_idx=np.sort(perm[:300]), val_idx=np.sort(perm[300:400]),
                  test_idx=np.sort(perm[400:]))
    path = write_dataset(tmp_path / "small", num_classes=4, **arrays)
    return path, arrays


def draw_batches(data, S: int, N: int, max_size: int) -> list[np.ndarray]:
    """``S`` hypothesis-drawn batches of unique node ids in ``[0, N)`` (int64, up to
    ``max_size`` each): the access traces of the cache-policy tests."""
    from hypothesis import strategies as st

    return [np.array(data.draw(st.lists(st.integers(0, N - 1), max_size=max_size, unique=True)),
                     np.int64) for _ in range(S)]


def assert_same_batches(epochs_a: list, epochs_b: list, x_of) -> None:
    """Two loaders' epochs (lists of PyG batches) hold the same batches: ``n_id``, ``x``,
    ``y`` and edges alike, and ``x`` the rows ``x_of(n_id)`` (int64 [n] -> [n, dim])."""
    for ea, eb in zip(epochs_a, epochs_b, strict=True):
        assert len(ea) == len(eb) > 0
        for a, b in zip(ea, eb, strict=True):
            np.testing.assert_array_equal(a.n_id.numpy(), b.n_id.numpy())
            np.testing.assert_array_equal(b.x.numpy(), x_of(b.n_id.numpy()))
            np.testing.assert_array_equal(a.x.numpy(), b.x.numpy())
            np.testing.assert_array_equal(a.y.numpy(), b.y.numpy())
            np.testing.assert_array_equal(a.edge_index.numpy(), b.edge_index.numpy())


def brute_belady_steps(batches, capacity: int) -> list[int]:
    """Belady's misses of each batch in plain Python: C_0 the ids used first, C_{i+1} the
    ``capacity`` ids of C_i ∪ ids_i used again soonest (ties by id)."""
    bs = [set(int(v) for v in b) for b in batches]

    def nxt(x, i):
        return next((j for j in range(i + 1, len(bs)) if x in bs[j]), None)

    first: dict = {}
    for i, b in enumerate(bs):
        for x in b:
            first.setdefault(x, i)
    c = set(sorted(first, key=lambda x: (first[x], x))[:capacity])
    misses = []
    for i, b in enumerate(bs):
        misses.append(len(b - c))
        cands = [(nxt(x, i), x) for x in c | b if nxt(x, i) is not None]
        c = set(x for _, x in sorted(cands)[:capacity])
    return misses


def nan_in_an_unsampled_row(out: Path) -> tuple[Path, int]:
    """A 300-node graph with 4 KiB feature rows (a page each, node order) whose row of one
    node, on a page its sampled checksum does not read, was later overwritten with NaN
    in place (what a corrupted page looks like); returns ``(path, that node)``."""
    from ooc.storage.dataset import sampled_pages

    n, d = 300, 1024
    src, dst = random_graph(n, 8 * n, seed=4)
    indptr, indices = csc_from_edges(src, dst, n)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, d)).astype(np.float32)
    perm = rng.permutation(n)
    path = write_dataset(out, indptr, indices, x, rng.integers(0, 3, n), perm[:200],
                         perm[200:250], perm[250:], num_classes=3)
    sampled = set(sampled_pages((path / "features.bin").stat().st_size).tolist())
    node = next(v for v in range(n // 2, n) if v not in sampled)  # row v is page v
    mm = np.memmap(path / "features.bin", dtype=np.float32, mode="r+")
    mm[node * d + 5] = np.nan
    mm.flush()
    del mm
    return path, node
