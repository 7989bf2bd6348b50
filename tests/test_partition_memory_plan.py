"""The partitioner's memory plan (ooc.partition.memory_plan): the per-node terms its
docstring states, and a real run's peak against the plan its report carries."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ooc.partition.__main__ import main as partition_main
from ooc.partition.memory_plan import main as plan_main
from ooc.partition.memory_plan import planned_peak, state_itemsize
from ooc.storage import write_dataset

MiB = 1 << 20
CHUNK = 1 << 20          # the default chunk of edges
ROOT = Path(__file__).resolve().parents[1]


def _graph(path: Path, n: int, deg: int, dim: int, seed: int = 0) -> Path:
    """A random graph of ``n`` nodes with ``deg`` in-edges each, ``dim`` float32 features,
    its rows stored in a locality order (as ingest stores them)."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(n + 1, dtype=np.int64) * deg
    indices = rng.integers(0, n, size=n * deg).astype(np.int32)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    y = rng.integers(0, 4, size=n)
    return write_dataset(path, indptr, indices, x, y, np.arange(0, n, 10),
                         np.arange(1, n, 100), np.arange(2, n, 100), num_classes=4,
                         reorder="locality")


def test_per_node_terms_of_the_docstring():
    """Doubling N (and E) adds exactly the per-node bytes the module docstring gives:
    16 (degrees), 24 (clustering, int32 state), 28 + 48 / 8 (merge, N / 8 clusters),
    12 and 20 (refine, metrics: what the allocator keeps is a constant at this size) and
    16 + 4 * 1.05 / 8 + 16 (the split's held arrays, then the owned nodes and the ids, int32,
    with their source rows, the int32 sort order and its scratch, or with the int64 copy of
    the ids written: the same bytes, the partition bounded by N). The merge is then the
    largest phase. ``indptr.npy`` is not resident: only the pages one chunk of edges spans."""
    n, e = 100_000_000, 3_000_000_000
    a = planned_peak(n, e, parts=8)
    b = planned_peak(2 * n, 2 * e, parts=8)
    assert a["assumed"]["state_itemsize"] == 4 and a["assumed"]["clusters"] == n // 8
    per_node = {k: (b["phases"][k] - a["phases"][k]) / n for k in a["phases"]}
    assert per_node["degrees"] == 16
    assert per_node["clustering"] == 24
    assert per_node["merge"] == pytest.approx(28 + 48 / 8, abs=1e-3)
    assert per_node["refine"] == 12 and per_node["metrics"] == 20
    assert per_node["split"] == pytest.approx(16 + 4 * 1.05 / 8 + 16, abs=1e-3)
    assert a["assumed"]["split_moment"] in ("sort", "ids")
    # exact at one size: a chunk's span of indptr, in- and out-degrees, one chunk of int32 ids
    assert a["phases"]["degrees"] == 8 * (CHUNK + (1 << 17)) + 16 * n + 4 * CHUNK
    assert a["peak_phase"] == "merge" and a["peak_bytes"] == max(a["phases"].values())


def test_state_dtype_and_index_width():
    """SPRING's state is int32 below 2^31 nodes and degrees, else int64 (40 bytes a node
    while clustering instead of 24)."""
    assert state_itemsize(2**31 - 2) == 4
    assert state_itemsize(2**31 - 1) == 8 and state_itemsize(1000, max_degree=2**31) == 8
    n, e = 2**31, 2**34
    a = planned_peak(n, e, parts=8, index_itemsize=8)
    b = planned_peak(n + 1000, e, parts=8, index_itemsize=8)
    assert a["assumed"]["state_itemsize"] == 8
    assert (b["phases"]["clustering"] - a["phases"]["clustering"]) / 1000 == 40


def test_options_change_the_plan():
    """Halo hops, a source in node order, more than 64 parts, no split, the edge
    partitioners: each term moves the way the code allocates."""
    n, e = 5_000_000, 100_000_000
    base = planned_peak(n, e, parts=8)
    # 2 hops: every node of the partition is inner, but its source offsets are read a piece
    # at a time (ID_PIECE nodes), so the split's largest moment stays the sort
    m = 200_000_000
    big = planned_peak(m, 20 * m, parts=8)
    two = planned_peak(m, 20 * m, parts=8, halo_hops=2)
    assert two["assumed"]["split_moment"] == big["assumed"]["split_moment"] == "sort"
    assert two["phases"]["split"] == big["phases"]["split"]
    assert planned_peak(n, e, parts=8, row_map=False)["phases"]["split"] < base["phases"]["split"]
    wide = planned_peak(n, e, parts=128)   # two uint64 words of replica bits a node
    assert wide["phases"]["metrics"] - planned_peak(n, e, parts=64)["phases"]["metrics"] == 8 * n
    no_split = planned_peak(n, e, parts=8, split=False)
    assert no_split["phases"]["split"] < no_split["phases"]["merge"]
    assert planned_peak(n, e, parts=8, refine_passes=0)["phases"].keys() == \
        base["phases"].keys() - {"refine"}
    hashed = planned_peak(n, e, parts=8, algo="hash")
    greedy = planned_peak(n, e, parts=8, algo="greedy")
    assert "degrees" not in hashed["phases"] and "clustering" not in hashed["phases"]
    assert greedy["phases"]["assign"] - hashed["phases"]["assign"] == 16 * n
    # a known partition plans for less than the bound N
    assert planned_peak(n, e, parts=8, part_nodes=n // 2)["peak_bytes"] < base["peak_bytes"]


def test_shape_only_cli(capsys):
    assert plan_main(["--nodes", "111059956", "--edges", "3231371744", "--dim", "128",
                      "--parts", "8", "--baseline", "160"]) == 0
    out = capsys.readouterr().out
    assert "split" in out and "GiB" in out and "B/node" in out


@pytest.mark.parametrize("bad,what", [(["--nodes", "0"], "nodes >= 1"),
                                      (["--dim", "0"], "dim >= 1"),
                                      (["--dtype", "foo"], "unknown feature dtype 'foo'")])
def test_shape_only_cli_refuses_bad_values_in_one_line(capsys, bad, what):
    argv = ["--nodes", "1000", "--edges", "5000", *bad]
    with pytest.raises(SystemExit) as e:
        plan_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ooc: ") and what in err and "\n" not in err


_RUN = """
import json, sys
from ooc.core.memory import reset_peak_rss
from ooc.partition import partition_dataset
warm, data, out = sys.argv[1:4]
partition_dataset(warm, out + "-warm", 4)   # kernels loaded (or compiled) before measuring
reset_peak_rss()
print(json.dumps(partition_dataset(data, out, 4)))
"""


@pytest.mark.parametrize("n,dim", [(100_000, 16), (200_000, 32)])
def test_plan_bounds_a_real_run(tmp_path, n, dim):
    """A fresh process partitions a random graph: its peak RSS (``VmHWM`` since the
    kernels were loaded) stays under the plan its report carries, which is not far above
    it; the report's phases are the formula's for the dataset's shape."""
    warm = _graph(tmp_path / "warm", 2000, 4, dim)
    data = _graph(tmp_path / "data", n, 8, dim, seed=1)
    res = subprocess.run([sys.executable, "-c", _RUN, str(warm), str(data),
                          str(tmp_path / "parts")], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout.strip().splitlines()[-1])
    base = r["rss_after_open_bytes"]
    planned, peak = r["planned_peak_bytes"] - base, r["peak_rss_bytes"] - base
    assert peak > 0
    assert planned >= peak - (4 * MiB + peak // 20), (planned / MiB, peak / MiB)
    assert planned <= 2 * peak + 16 * MiB, (planned / MiB, peak / MiB)
    plan = planned_peak(n, 8 * n, parts=4, feature_dim=dim)
    assert r["planned_phases"] == plan["phases"]
    assert r["planned_peak_phase"] == plan["peak_phase"] == "split"


def test_cli_report_carries_the_plan(tmp_path, capsys):
    data = _graph(tmp_path / "data", 3000, 4, 8)
    rep = tmp_path / "r.json"
    assert partition_main(["--data", str(data), "--parts", "3", "--out", str(tmp_path / "p"),
                           "--quiet", "--report", str(rep)]) == 0
    capsys.readouterr()
    r = json.loads(rep.read_text())
    assert r["planned_peak_bytes"] == r["rss_after_open_bytes"] + max(r["planned_phases"].values())
    assert set(r["planned_phases"]) == {"degrees", "clustering", "merge", "refine", "metrics",
                                        "split"}
