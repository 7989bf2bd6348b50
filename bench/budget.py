"""The memory budget as a bound: refusal, suggestion and measured peaks, per mode.

    python -m bench budget --data ~/.cache/ooc/bench-1100000-1024 --budget 1GiB \\
        --too-small 256MiB --report bench_out/budget.json

For each mode, in one invocation:

1. ``ooc.train --memory-budget TOO_SMALL`` (no cgroup): refused; the budget it
   suggests is read from its one-line error.
2. ``ooc.train --memory-budget BUDGET`` and ``--memory-budget SUGGESTED``, each
   inside a cgroup-v1 memory cgroup limited to that budget (``ooc.executor.sizing.memcg``):
   the peak RSS the trainer reports (``VmHWM``), the child's ``ru_maxrss``,
   and the cgroup's ``max_usage_in_bytes`` and ``failcnt``.

Prints the README's table (markdown). Training options are the benchmark's
(``python -m bench modes``): batch 256, fanouts 10,5, hidden 64, no evaluation.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from ooc.core.sizes import format_size, parse_size
from ooc.executor.sizing import memcg
from ooc.storage.pagecache import drop_page_cache

from . import harness as H

MODES = ("baseline", "static", "ooc")


def train_argv(args, mode: str, budget: int, report: Path, runtime: Path) -> list[str]:
    return ["-m", "ooc.train", "--data", str(args.data), "--mode", mode,
            "--memory-budget", str(budget), "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--fanouts", args.fanouts,
            "--hidden", str(args.hidden), "--no-eval", "--no-progress", "--device", "cpu",
            "--runtime-dir", str(runtime), "--report", str(report)]


def measured_run(args, mode: str, budget: int, work: Path) -> dict:
    """One training run in a cgroup of ``budget``; its peaks."""
    drop_page_cache(args.data)
    rep = work / f"{mode}-{budget}.json"
    res = memcg.run(f"{mode}@{budget >> 20}MiB", train_argv(args, mode, budget, rep,
                                                            work / "runtime"), budget)
    out = {"budget": budget, "rc": res["rc"], "ru_maxrss": res["child_peak_rss_bytes"],
           "cgroup": res.get("cgroup") or {}}
    if res["rc"] != 0 or not rep.exists():
        out["error"] = memcg.exit_words(res["rc"]) + ": " + " | ".join(res["lines"][-2:])
        return out
    r = json.loads(rep.read_text())
    plan = r["memory_plan"]
    io = r["epochs"][-1].get("io", {})
    out.update(peak_rss=r["peak_rss_bytes"], working=plan["working"], reserve=plan["reserve"],
               feature_cache_bytes=plan["feature_cache_bytes"],
               neighbor_cache_bytes=plan["neighbor_cache_bytes"],
               superbatch_size=plan["superbatch_size"], stages=plan["stages"],
               epoch_s=r["epochs"][-1]["time_s"],
               miss_ratio=(io.get("feature_misses", 0) / io["feature_lookups"]
                           if io.get("feature_lookups") else None))
    return out


def refusal(args, mode: str, work: Path) -> dict:
    rep = work / f"{mode}-refused.json"
    res = memcg.run(f"{mode}@{args.too_small >> 20}MiB",
                    train_argv(args, mode, args.too_small, rep, work / "runtime"), None)
    text = "\n".join(res["lines"])
    m = re.search(r"the smallest budget that works is (\d+)MiB", text)
    return {"rc": res["rc"], "suggested": int(m.group(1)) << 20 if m else None,
            "line": res["lines"][-1] if res["lines"] else ""}


def table(rows: list[dict]) -> str:
    mib = lambda v: "–" if v is None else f"{v / 2**20:,.0f}"  # noqa: E731
    out = ["| mode | budget asked | budget suggested | run at | peak RSS (VmHWM) MiB | "
           "ru_maxrss MiB | cgroup peak MiB | cgroup failcnt | working + reserve MiB | "
           "caches MiB | epoch s | miss ratio |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for run in r["runs"]:
            asked, sugg = run["asked"], run["suggested"]
            if "error" in run:
                out.append(f"| {r['mode']} | {mib(asked)} | {mib(sugg)} | "
                           f"{mib(run['budget'])} | failed: {run['error'][:60]} |||||||| ")
                continue
            cg = run["cgroup"]
            miss = "–" if run["miss_ratio"] is None else f"{run['miss_ratio']:.3f}"
            out.append(
                f"| {r['mode']} | {mib(asked)} | {mib(sugg)} | {mib(run['budget'])} | "
                f"{run['peak_rss'] / 2**20:,.1f} | {mib(run['ru_maxrss'])} | "
                f"{mib(cg.get('max_usage_in_bytes'))} | {cg.get('failcnt', '–')} | "
                f"{mib(run['working'] + run['reserve'])} | "
                f"{mib(run['feature_cache_bytes'] + run['neighbor_cache_bytes'])} | "
                f"{run['epoch_s']:.2f} | {miss} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench budget", description=__doc__)
    p.add_argument("--data", type=Path, required=True, help="dataset folder")
    p.add_argument("--budget", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--too-small", type=parse_size, default=parse_size("256MiB"),
                   help="a budget the planner refuses (its suggestion is then run)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--report", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            ref = refusal(args, mode, work)
            runs = [dict(measured_run(args, mode, args.budget, work), asked=args.budget,
                         suggested=None)]
            if ref["suggested"]:
                runs.append(dict(measured_run(args, mode, ref["suggested"], work),
                                 asked=args.too_small, suggested=ref["suggested"]))
            rows.append({"mode": mode, "suggested": ref["suggested"], "refusal": ref,
                         "runs": runs})
    print(table(rows))
    over = [(r["mode"], run["budget"]) for r in rows for run in r["runs"]
            if "error" not in run and max(run["peak_rss"], run["ru_maxrss"],
                                          run["cgroup"].get("max_usage_in_bytes", 0))
            > run["budget"]]
    print(f"bench_budget: {format_size(args.budget)} and the suggested budgets; "
          + (f"OVER the budget: {over}" if over else "every peak within its budget"))
    if args.report:
        H.write_report(args.report, "budget", {"rows": rows}, spec={"data": args.data},
                       data_path=args.data, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
