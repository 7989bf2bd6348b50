"""bench.harness: cases in alternating rounds, the warm-up dropped, medians and ratios as
numpy computes them, and a report with the command, revision, machine, spec and samples;
``python -m bench table`` renders it, and refuses a file that is not a report."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from bench import harness as H


def _scripted(values: dict[str, list[float]], calls: list[str]):
    """Cases that return their next value from ``values`` and log each call."""
    it = {k: iter(v) for k, v in values.items()}

    def case(name: str):
        def run() -> float:
            calls.append(name)
            return next(it[name])
        return run
    return {k: case(k) for k in values}


def test_rounds_alternate_and_the_warmup_is_recorded_but_dropped():
    calls: list[str] = []
    vals = {"a": [100.0, 1.0, 3.0, 2.0], "b": [100.0, 4.0, 8.0, 6.0], "c": [100.0, 1, 1, 1]}
    r = H.run_rounds(_scripted(vals, calls), rounds=3, warmup=1)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [s.warmup for s in r.samples] == [True] * 3 + [False] * 9
    assert r.values("a", "s") == [1.0, 3.0, 2.0]          # the warm-up's 100 is not among them
    assert H.round_order(["x", "y"], 0) == ["x", "y"] and H.round_order(["x", "y"], 1) == ["y", "x"]


def test_medians_and_ratios_are_numpys():
    rng = np.random.default_rng(0)
    vals = {"fast": list(rng.random(8)), "slow": list(2 + rng.random(8))}
    r = H.run_rounds(_scripted(vals, []), rounds=6, warmup=2)
    med = H.medians(r)
    assert med["fast"]["s"] == pytest.approx(np.median(vals["fast"][2:]))
    assert med["slow"]["s"] == pytest.approx(np.median(vals["slow"][2:]))
    sp = H.ratios(med, [("fast", "slow"), ("fast", "absent")])
    assert sp == {"fast_vs_slow": pytest.approx(np.median(vals["slow"][2:]) /
                                                np.median(vals["fast"][2:]))}
    # per-round ratios: the median of slow/fast within each measured round
    per = []
    for k in range(2, 8):
        per.append(vals["slow"][k] / vals["fast"][k])
    assert H.round_ratios(r, "slow", "fast") == pytest.approx(np.median(per))


def test_metrics_cases_and_missing_values():
    seq = iter([{"t": 1.0, "n": None}, {"t": 3.0, "n": 2}, {"t": 5.0, "n": 4, "tag": "x"}])
    r = H.run_rounds({"only": lambda: next(seq)}, rounds=3, warmup=0)
    assert H.medians(r) == {"only": {"t": 3.0, "n": 3.0}}   # None skipped; strings are no metric
    assert H.median([]) is None and H.ratio(1.0, 0.0) is None
    with pytest.raises(ValueError):
        H.run_rounds({"x": lambda: 1.0}, rounds=0)


def test_epoch_plan_is_the_samplers():
    from ooc.sampling import derive_seed, epoch_batches

    train = np.arange(1000, 1100, dtype=np.int64)
    batches, seeds = H.epoch_plan(train, 32, 7, 3)
    want = epoch_batches(train, 32, 7, 3)
    assert len(batches) == len(want) == 4
    assert all(np.array_equal(a, b) for a, b in zip(batches, want, strict=True))
    assert seeds == [derive_seed(7, 3, b) for b in range(4)]


def test_the_report_has_every_field_and_renders_as_a_table(tmp_path):
    r = H.run_rounds({"x": lambda: 2.0, "y": lambda: 4.0}, rounds=2)
    meds = H.medians(r)
    path = tmp_path / "out" / "r.json"
    H.write_report(path, "gather", {"medians": meds, "speedup": H.ratios(meds, [("x", "y")])},
                   spec={"nodes": 10}, samples=r, data_path=tmp_path)
    rep = json.loads(path.read_text())
    assert rep["benchmark"] == "gather" and rep["spec"] == {"nodes": 10}
    assert rep["command"] and "revision" in rep and rep["speedup"] == {"x_vs_y": 2.0}
    m = rep["machine"]
    assert m["cpus"] >= 1 and m["ram_bytes"] > 0 and m["cpu_model"] and m["disk"]["total_bytes"] > 0
    assert len(rep["samples"]) == 6 and sum(s["warmup"] for s in rep["samples"]) == 2
    assert not list(path.parent.glob(".*.tmp"))
    p = subprocess.run([sys.executable, "-m", "bench", "table", str(path)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[:4] == ["| case | s |", "|---|---:|", "| x | 2 |", "| y | 4 |"]


def _one_line(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_table_of_a_file_that_is_no_report_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    for argv in ([str(bad)], [str(tmp_path / "missing.json")]):
        p = subprocess.run([sys.executable, "-m", "bench", "table", *argv], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        _one_line(p, argv[0])
    p = subprocess.run([sys.executable, "-m", "bench", "nosuch"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    _one_line(p, "nosuch")
