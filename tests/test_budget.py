"""--memory-budget: caches sized from the measured working memory; peak RSS within budget."""
import os
import subprocess
import sys

import pytest

from ooc.storage.ingest import generate_synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    # 200 MB of features: more than the caches can get under the budget below
    p = tmp_path_factory.mktemp("b") / "d"
    path = generate_synthetic(p, nodes=50_000, avg_degree=8, feature_dim=1024, progress=False)
    # Fill numba's on-disk kernel cache first, as any earlier run on the machine
    # would: a cold first run also holds the JIT's code (~80 MB here), which the
    # planner measures and would rightly refuse the tight budgets below for.
    rc, out = _train(path, "--mode", "ooc")
    assert rc == 0, out
    return path


def _train(data, *extra):
    cmd = [sys.executable, "-m", "ooc.train", "--data", str(data), "--epochs", "1",
           "--fanouts", "5,5", "--batch-size", "256", "--hidden", "16", "--no-progress",
           "--no-eval", "--device", "cpu", *extra]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    out = p.communicate()[0]
    return p.returncode, out


def test_budget_below_working_memory_fails(big):
    rc, out = _train(big, "--mode", "static", "--memory-budget", "100MiB")
    assert rc == 2, out
    assert "smallest budget that can work is" in out and out.strip().count("\n") < 3


@pytest.mark.parametrize("mode", ["static", "baseline", "ooc"])
def test_peak_rss_within_budget(big, tmp_path, mode):
    import json
    import resource

    # baseline's working memory includes the file pages its memmaps touch
    budget = (960 if mode == "baseline" else 720) << 20
    rep = tmp_path / "r.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rc, out = _train(big, "--mode", mode, "--memory-budget", str(budget), "--report", str(rep))
    assert rc == 0, out
    r = json.loads(rep.read_text())
    plan = r["memory_plan"]
    assert plan["budget"] == budget and plan["working"] > plan["stages"]["setup_rss"]
    if mode != "baseline":
        # the caches took the rest of the budget, and it was not the whole dataset
        assert 0 < r["mode_info"]["feature_cache_rows"] < 50_000
        assert plan["feature_cache_bytes"] + plan["neighbor_cache_bytes"] \
            >= budget - plan["working"] - plan["reserve"] - (1 << 20)
    peak = r["peak_rss_bytes"]
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert peak <= 1.10 * budget, (peak, plan)
    if child > before * 1024:
        assert child <= 1.10 * budget
