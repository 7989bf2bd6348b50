"""Size the caches and the superbatch from a short profile (Ginex §3.5).

    python -m ooc.size --data DIR --memory-budget 600MiB --runtime-disk-budget 1GiB \\
        --fanouts 10,5 --batch-size 256 --report sizes.json --plot curve.png
    python -m ooc.train --data DIR --sizes sizes.json            # train with the recommendation

Measures what a read costs the disk under the dataset (an operation against a page's
transfer: the gap between wanted pages worth reading through, ``--read-gap``, unless
given; :mod:`ooc.storage.read_cost`), the peak RSS of the sample stage and of the main
loop (the same measurement as ``ooc.train --memory-budget``), runtime-file bytes per batch,
sampling / changeset / gather / compute rates, CUDA memory of the changeset
pass when a GPU is present; recommends the neighbor and feature cache bytes
and the superbatch size, with the arithmetic; trains the epoch's first batches
with them as training runs them (a rehearsal) and extrapolates the expected
epoch time from it; draws Belady / static degree-ordered / LRU miss-ratio
curves. Without ``--mode`` every preset is profiled and the one with the
shortest expected run of ``--epochs`` epochs recommended (its build, its first
epoch, in which the ``ooc`` cache fills, and the later ones). The logic is
:mod:`ooc.executor.sizing.profiler`.

``--verify`` then trains one epoch with the recommendation in a subprocess
inside a memory cgroup limited to the budget (:mod:`ooc.executor.sizing.memcg`) and
prints predicted vs measured miss ratio, epoch time and peak memory side by
side (also in the report, ``verification``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Sequence

from ooc.cli import ArgumentParser, add_report_arg, main_wrapper, write_report
from ooc.core.errors import InvalidValue
from ooc.core.memory import tune_malloc
from ooc.core.sizes import format_size, parse_size
from ooc.executor.loader.presets import PRESET_NAMES
from ooc.executor.settings import BY_NAME, add_arguments
from ooc.executor.sizing import memcg
from ooc.executor.sizing.options import check_options, mode_options, resolve
from ooc.executor.sizing.plot import plot_curves
from ooc.executor.sizing.profiler import compare_presets, profile
from ooc.storage import open_dataset
from ooc.storage.pagecache import drop_page_cache
from ooc.storage.read_cost import measure_read_cost

#: The training settings the profile depends on (as ``python -m ooc.train`` takes them).
TRAINING = ("model", "fanouts", "batch_size", "hidden", "heads", "lr", "weight_decay", "dropout",
            "seed", "epochs", "device", "num_threads", "queue_depth", "io_backend",
            "page_reads", "read_gap", "runtime_dir", "runtime_disk_budget")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m ooc.size``."""
    p = ArgumentParser(prog="python -m ooc.size", description=__doc__.split("\n")[0],
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--data", metavar="DIR", required=True, help="dataset folder")
    p.add_argument("--memory-budget", metavar="SIZE", required=True,
                   help="memory the training process may use")

    p.add_argument("--mode", choices=PRESET_NAMES, help="profile this preset only (default: "
                   "every preset of --presets, recommending the fastest)")
    p.add_argument("--presets", metavar="P1,P2,..", help="presets to profile and compare "
                   f"(default {','.join(PRESET_NAMES)})")
    add_arguments(p, [BY_NAME[n] for n in TRAINING])
    p.add_argument("--layers", type=int, help="number of layers (must match --fanouts)")
    p.add_argument("--reserve", metavar="SIZE", help="headroom (default max(48MiB, 10%% of "
                   "the budget))")
    p.add_argument("--trace-batches", type=int, help="batches sampled for the rates and "
                   "curves (default: the superbatch, at most 128)")
    p.add_argument("--plot", metavar="PNG", help="miss-ratio curve plot")
    p.add_argument("--verify", action="store_true", help="then train one epoch with the "
                   "recommendation inside a memory cgroup at the budget, and print predicted "
                   "vs measured side by side (needs --report: ooc.train reads its sizes)")
    p.add_argument("--verify-epochs", type=int, help="as --verify, training this many epochs "
                   "(the first is compared)")
    add_report_arg(p)
    return p


def _presets(text: str | None, mode: str | None) -> list[str]:
    """The presets to profile: ``--mode`` alone, else ``--presets`` (default all)."""

    if mode is not None:
        if text is not None:
            raise InvalidValue("give --mode (one preset) or --presets (a comparison), not both")
        return [mode]
    names = list(PRESET_NAMES) if text is None else [t.strip() for t in text.split(",")]
    bad = [n for n in names if n not in PRESET_NAMES]
    if bad or not names:
        raise InvalidValue(f"--presets {text!r}: choose from {','.join(PRESET_NAMES)}")
    return list(dict.fromkeys(names))


def verify(report_path: Path, rep: dict, epochs: int, settings: dict) -> dict:
    """Train ``epochs`` epochs with ``--sizes`` in a memory cgroup limited to the budget
    (:mod:`ooc.executor.sizing.memcg`); the first epoch's measured miss ratio and time against the
    predicted ones. ``rep`` is one preset's report (its ``sizes`` and ``recommendation``);
    the sizes are written beside ``report_path`` for the run and removed after."""

    budget = rep["budget_bytes"]
    data = rep["dataset"]["path"]
    drop_page_cache(data)
    mode = rep["sizes"]["mode"]
    report_path = report_path.resolve()
    out = report_path.with_name(f"{report_path.stem}.{mode}.train.json")
    sizes_file = report_path.with_name(f"{report_path.stem}.{mode}.sizes.json")
    sizes_file.write_text(json.dumps({"sizes": rep["sizes"]}))
    train = ["-m", "ooc.train", "--data", data, "--sizes", str(sizes_file),
             "--epochs", str(epochs), "--no-progress", "--no-eval", "--report", str(out)]
    for k in ("model", "fanouts", "batch_size", "hidden", "heads", "lr", "weight_decay",
              "dropout", "seed", "device", "threads", "queue_depth", "runtime_dir", "io_backend"):
        if settings.get(k) is not None:
            train += [f"--{k.replace('_', '-')}", str(settings[k])]
    try:
        run = memcg.run(f"verify-{mode}", train, budget if memcg.available() else None)
    finally:
        sizes_file.unlink(missing_ok=True)
    res: dict = {"mode": mode, "rc": run["rc"], "wall_s": run["wall_s"],
                 "cgroup": run.get("cgroup"),
                 "child_peak_rss_bytes": run["child_peak_rss_bytes"], "command": train}
    if run["rc"] != 0 or not out.exists():
        res["error"] = memcg.exit_words(run["rc"]) + ": " + " | ".join(run["lines"][-3:])
        return res
    tr = json.loads(out.read_text())
    out.unlink()
    e1 = tr["epochs"][0]
    io = e1.get("io", {})
    rec = rep["recommendation"]
    later = [e["time_s"] for e in tr["epochs"][1:]]
    res.update(epoch_times_s=[e["time_s"] for e in tr["epochs"]],
               measured_epoch_s=e1["time_s"], predicted_epoch_s=rec["expected_epoch_s"],
               measured_later_epoch_s=statistics.median(later) if later else None,
               predicted_later_epoch_s=rec["expected_later_epoch_s"],
               measured_run_s=tr.get("total_time_s"), predicted_run_s=rec["run"]["total_s"]
               if rec["run"]["epochs"] == epochs else None,
               measured_miss_ratio=(io.get("feature_misses", 0) / io["feature_lookups"]
                                    if io.get("feature_lookups") else None),
               predicted_miss_ratio=rec["predicted_miss_ratio"],
               peak_rss_bytes=tr.get("peak_rss_bytes"),
               within_budget=(tr.get("peak_rss_bytes") or 0) <= budget,
               timers=e1["timers"], mode_info=tr.get("mode_info"))
    return res


def print_verification(v: dict, budget: int) -> None:
    """Predicted vs measured, side by side."""
    cg = v.get("cgroup") or {}
    rows = [("miss ratio (epoch 1)", f"{v['predicted_miss_ratio']:.3f}",
             "n/a" if v["measured_miss_ratio"] is None else f"{v['measured_miss_ratio']:.3f}"),
            ("epoch 1 time", f"{v['predicted_epoch_s']:.2f} s", f"{v['measured_epoch_s']:.2f} s"),
            ("later epochs (median)", f"{v['predicted_later_epoch_s']:.2f} s",
             "n/a" if v["measured_later_epoch_s"] is None
             else f"{v['measured_later_epoch_s']:.2f} s"),
            (f"run of {len(v['epoch_times_s'])} epochs",
             "n/a" if v["predicted_run_s"] is None else f"{v['predicted_run_s']:.2f} s",
             "n/a" if v["measured_run_s"] is None else f"{v['measured_run_s']:.2f} s"),
            ("peak RSS (VmHWM)", f"<= {format_size(budget)}", format_size(v["peak_rss_bytes"])),
            ("cgroup max usage", f"<= {format_size(budget)}",
             format_size(cg["max_usage_in_bytes"]) if "max_usage_in_bytes" in cg
             else "no cgroup")]
    print(f"ooc.size: verified {v.get('mode', '')} (one training run with these sizes):")
    print(f"  {'':22} {'predicted':>14} {'measured':>14}")
    for name, p, m in rows:
        print(f"  {name:22} {p:>14} {m:>14}")


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m ooc.size`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    given = vars(build_parser().parse_args(argv))
    report_path = given.pop("report", None)
    plot_path = given.pop("plot", None)
    verify_epochs = given.pop("verify_epochs", None)
    if given.pop("verify", False) and verify_epochs is None:
        verify_epochs = 1
    trace = given.pop("trace_batches", None)
    presets = _presets(given.pop("presets", None), given.get("mode"))
    budget = BY_NAME["memory_budget"].size(given.pop("memory_budget"))
    reserve = given.pop("reserve", None)
    reserve = None if reserve is None else parse_size(reserve)
    if trace is not None and trace < 1:
        raise InvalidValue(f"--trace-batches must be >= 1, got {trace}")
    if verify_epochs is not None and (verify_epochs < 1 or report_path is None):
        raise InvalidValue("--verify needs --report (ooc.train reads its sizes), and "
                       "--verify-epochs N >= 1")


    s = resolve(given)
    config = check_options(s, progress=False)
    config.mode = presets[0]
    options = mode_options(s)
    dataset = open_dataset(s["data"])  # bad input fails here, before torch is loaded


    tune_malloc()
    options.validate()
    options, read_cost = _measured_read_gap(dataset, options, "read_gap" in given)
    if len(presets) == 1:
        rep = profile(dataset, config, options, budget, reserve=reserve, trace_batches=trace)
    else:
        rep = compare_presets(dataset, config, options, budget, presets, reserve=reserve,
                              trace_batches=trace)
        _print_comparison(rep)
    rep["read_cost"] = None if read_cost is None else read_cost.as_dict()
    rep["command"] = " ".join([sys.executable, *sys.argv]) if argv is None else \
        " ".join(["python -m ooc.size", *argv])
    r = rep["recommendation"]
    print("ooc.size: " + "\n  ".join(["recommendation (arithmetic):", *rep["arithmetic"]]))
    print(f"ooc.size: feature cache {format_size(r['feature_cache_bytes'])} "
          f"({r['feature_cache_rows']:,} rows, {r['feature_cache_fraction']:.1%}), neighbor cache "
          f"{format_size(r['neighbor_cache_bytes'])}, superbatch {r['superbatch_size']}, "
          f"predicted miss ratio {r['predicted_miss_ratio']:.3f}, expected epoch "
          f"{r['expected_epoch_s']:.2f}s; train with: python -m ooc.train --data {s['data']} "
          f"--sizes {report_path or 'sizes.json'}")
    if plot_path:
        plot_curves(rep, plot_path)
        rep["plot"] = str(plot_path)

    if report_path:
        write_report(report_path, rep)
    if verify_epochs:
        failed = False
        for name, one in _per_preset(rep).items():
            v = verify(Path(report_path), one, verify_epochs, s)
            rep.setdefault("verification", {})[name] = v
            write_report(report_path, rep)
            if "error" in v:
                print(f"ooc.size: verification run of {name} failed ({v['error']})")
                failed = True
                continue
            print_verification(v, rep["budget_bytes"])
        if failed:
            return 1
    return 0


def _measured_read_gap(dataset, options, given: bool):
    """``(options, cost)``: the read cost of the disk under the dataset's features
    (:func:`~ooc.storage.read_cost.measure_read_cost`) and ``options`` reading through the
    gaps it recommends, unless ``--read-gap`` was given (then ``cost`` is None, as when the
    reader does not bypass the page cache)."""
    from dataclasses import replace


    if given:
        return options, None
    cost = measure_read_cost(dataset.features_file, queue_depth=options.queue_depth,
                             backend=options.io_backend)
    if cost is None:
        print(f"ooc.size: reads of {dataset.features_file} go through the page cache: "
              f"--read-gap stays {format_size(options.read_gap)}")
        return options, None
    print(f"ooc.size: a read of {dataset.features_file} costs the disk "
          f"{cost.op_s * 1e6:.1f} us + {cost.page_s * 1e6:.2f} us a page (QD "
          f"{options.queue_depth}): gaps of up to {cost.gap_pages} pages are read through "
          f"(--read-gap {format_size(cost.gap_bytes)})")
    return replace(options, read_gap=cost.gap_bytes), cost


def _per_preset(rep: dict) -> dict[str, dict]:
    """Each profiled preset as a report :func:`verify` takes (its sizes and predictions)."""
    if "presets" not in rep:
        return {rep["sizes"]["mode"]: rep}
    return {name: {"budget_bytes": rep["budget_bytes"], "dataset": rep["dataset"],
                   "sizes": p["sizes"], "recommendation": p}
            for name, p in rep["presets"].items() if "error" not in p}


def _print_comparison(rep: dict) -> None:
    """The presets side by side, and which one the measurements favour."""
    epochs = rep["recommendation"]["run"]["epochs"]
    print("ooc.size: presets under the same budget (expected seconds from each one's "
          "rehearsal):")
    print(f"  {'preset':10} {'build':>7} {'epoch 1':>8} {'later':>7} {f'{epochs} epochs':>10} "
          f"{'miss ratio':>11} {'feature cache rows':>19} {'superbatch':>10}")
    for name, p in rep["presets"].items():
        if "error" in p:
            print(f"  {name:10} does not fit: {p['error']}")
            continue
        print(f"  {name:10} {p['run']['build_s']:7.2f} {p['expected_epoch_s']:8.2f} "
              f"{p['expected_later_epoch_s']:7.2f} {p['expected_run_s']:10.2f} "
              f"{p['predicted_miss_ratio']:11.3f} {p['feature_cache_rows']:19,} "
              f"{str(p['superbatch_size'] or '-'):>10}")
    print(f"ooc.size: recommended preset: {rep['recommended_preset']} (shortest expected "
          f"run of {epochs} epochs)")


if __name__ == "__main__":
    sys.exit(main())
