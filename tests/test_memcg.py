"""ooc.executor.sizing.memcg reads cgroup v2's files under v1's names (a v2 group faked in a temp folder:
this machine's memory controller may sit on v1), and on the machine it has a group run a child."""

import pytest

from ooc.executor.sizing import memcg


def test_v2_files_read_under_v1_names(tmp_path):
    root = tmp_path / "root"
    cg = root / "ooc-bench-1-x"
    cg.mkdir(parents=True)
    (root / "cgroup.subtree_control").write_text("cpu\n")
    memcg._write_limit_v2(root, cg, 123 << 20)
    assert "+memory" in (root / "cgroup.subtree_control").read_text()
    assert (cg / "memory.max").read_text() == str(123 << 20)
    (cg / "memory.peak").write_text("4096\n")
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    assert memcg.version(cg) == 2
    assert memcg.cgroup_stats(cg) == {"limit_in_bytes": 123 << 20, "max_usage_in_bytes": 4096,
                                      "failcnt": 7, "oom_kill": 1}
    (cg / "memory.max").write_text("max\n")
    assert memcg.cgroup_stats(cg)["limit_in_bytes"] == (1 << 63) - 1


def test_v1_files(tmp_path):
    cg = tmp_path / "g"
    cg.mkdir()
    (cg / "memory.limit_in_bytes").write_text("1048576\n")
    (cg / "memory.max_usage_in_bytes").write_text("2048\n")
    (cg / "memory.failcnt").write_text("3\n")
    assert memcg.version(cg) == 1
    assert memcg.cgroup_stats(cg) == {"limit_in_bytes": 1048576, "max_usage_in_bytes": 2048,
                                      "failcnt": 3}


def test_run_in_a_group_counts_the_child():
    if not memcg.available():
        pytest.skip("no writable memory cgroup (v1 or v2) on this machine")
    r = memcg.run("memcg-test", ["-c", "b = bytearray(64 << 20); print(len(b))"], 512 << 20)
    assert r["rc"] == 0 and r["lines"][-1] == str(64 << 20)
    assert r["child_peak_rss_bytes"] >= 64 << 20
    assert r["cgroup"]["limit_in_bytes"] == 512 << 20
    assert r["cgroup"]["max_usage_in_bytes"] >= 64 << 20
