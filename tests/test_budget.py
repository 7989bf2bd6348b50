"""--memory-budget is a bound: refuse with a budget that works; in a memory cgroup at that
budget every mode runs and its peak RSS (VmHWM, psutil samples, the cgroup's
max_usage_in_bytes) stays at or below it, with no tolerance."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# memcg: the cgroup helpers of ooc.size --verify and the benchmarks
from ooc.executor.sizing import memcg
from ooc.executor.sizing.budget import STABILITY, default_reserve, smallest_budget, suggest_budget
from ooc.storage.ingest import generate_synthetic

REPO = Path(__file__).resolve().parents[1]

MiB = 1 << 20
TRAIN = ["--epochs", "2", "--fanouts", "5,5", "--batch-size", "128", "--hidden", "16",
         "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    # power-law graph; 40 MB of features, more than the caches get at the budgets below
    return generate_synthetic(tmp_path_factory.mktemp("b") / "d", nodes=20_000, avg_degree=8,
                              feature_dim=512, train_fraction=0.1, progress=False)


def _cgroup(limit: int) -> Path:
    """A memory cgroup (v1 or v2) limited to ``limit`` bytes (the test skips, saying why,
    where neither hierarchy is writable)."""
    if not memcg.available():
        pytest.skip("no writable memory cgroup (neither v1 at /sys/fs/cgroup/memory nor a cgroup2 "
                    "mount offering the memory controller): the cgroup peak cannot be measured here")
    cg = memcg.make_cgroup(f"ooc-test-budget-{os.getpid()}-{time.monotonic_ns()}", limit)
    if cg is None:
        pytest.skip(f"cannot create a memory cgroup under {memcg.CGROUP_ROOT}")
    return cg


def _train(data, *extra, cgroup_limit: int | None = None, env=None):
    """Run ooc.train; with ``cgroup_limit``, inside a fresh cgroup of that limit while
    psutil samples the child's RSS. Returns (rc, output, psutil peak, cgroup stats)."""
    import psutil

    cmd = [sys.executable, "-m", "ooc.train", "--data", str(data), *TRAIN, *extra]
    cg = _cgroup(cgroup_limit) if cgroup_limit else None

    def join() -> None:
        with open(cg / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    try:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, preexec_fn=join if cg else None,
                             env={**os.environ, **(env or {})})
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(p.stdout))
        reader.start()
        proc, peak = psutil.Process(p.pid), 0
        while p.poll() is None:
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.002)
        reader.join()
        return p.returncode, "".join(out), peak, memcg.cgroup_stats(cg) if cg else {}
    finally:
        if cg is not None:
            memcg.remove_cgroup(cg)


def _suggestion(out: str) -> int:
    m = re.search(r"the smallest budget that works is (\d+)MiB", out)
    assert m, out
    return int(m.group(1)) * MiB


def test_suggestion_and_check_use_one_reserve_rule():
    for need in (1, 48 * MiB, 300 * MiB, 431 * MiB + 12345, 600 * MiB, 4000 * MiB + 1):
        b = smallest_budget(need)
        assert b % MiB == 0
        assert b - default_reserve(b) >= need                     # accepted
        assert (b - MiB) - default_reserve(b - MiB) < need        # and the smallest such
        assert suggest_budget(need) == smallest_budget(-(-need * (1 + STABILITY) // 1))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["baseline", "static", "ooc"])
def test_refuse_then_the_suggestion_runs_under_it(graph, tmp_path, mode):
    rc, out, _, _ = _train(graph, "--mode", mode, "--memory-budget", "64MiB")
    assert rc == 2, out
    line = out.strip().splitlines()[-1]
    assert line.startswith("ooc: --memory-budget") and "Traceback" not in out, out
    # a larger budget goes to the caches: baseline has none, so it runs at the suggestion only
    extra = () if mode == "baseline" else (_suggestion(out) + 24 * MiB,)
    for budget in (_suggestion(out), *extra):
        rep = tmp_path / f"r{budget}.json"
        rc, out2, sampled, cg = _train(graph, "--mode", mode, "--memory-budget", str(budget),
                                       "--report", str(rep), cgroup_limit=budget)
        assert rc == 0, (budget, out2[-2000:])
        r = json.loads(rep.read_text())
        plan = r["memory_plan"]
        assert plan["budget"] == budget
        caches = plan["feature_cache_bytes"] + plan["neighbor_cache_bytes"]
        assert plan["working"] + caches + plan["reserve"] <= budget
        if mode != "baseline" and budget > _suggestion(out):
            # the caches got the rest of the budget (with a cold kernel cache the measured
            # working memory is smaller, and the rest can hold all 20,000 rows)
            assert 0 < r["mode_info"]["feature_cache_rows"] <= 20_000
            assert caches > 0
        # the bound, three ways, no tolerance
        assert r["peak_rss_bytes"] <= budget, (r["peak_rss_bytes"], plan)
        assert sampled <= budget, (sampled, plan)
        assert cg["max_usage_in_bytes"] <= budget, cg


@pytest.mark.slow
def test_estimate_is_stable_from_a_cold_numba_cache(graph, tmp_path):
    """The first run (kernels compiled: in a child) measures what later runs measure."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cold")}
    seen = []
    for _ in range(2):
        rc, out, _, _ = _train(graph, "--mode", "ooc", "--memory-budget", "64MiB", env=env)
        assert rc == 2, out
        working = float(re.search(r"needs: ([\d.]+) MiB working memory", out).group(1))
        seen.append((working, _suggestion(out)))
    (w1, s1), (w2, s2) = seen
    assert abs(w1 - w2) <= 0.02 * max(w1, w2), seen
    assert abs(s1 - s2) <= 0.02 * max(s1, s2), seen
