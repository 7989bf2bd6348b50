"""The one harness every benchmark runs on: rounds, medians, ratios and the JSON report.

- :func:`run_rounds` runs named cases in alternating rounds (the order rotated by one case
  each round, so no case always runs first or last on a machine whose speed drifts), the
  first ``warmup`` rounds recorded but left out of the medians.
- :func:`medians` and :func:`ratios` are computed once here, from those samples.
- :func:`write_report` writes one JSON report: the command line, the git revision, the
  machine (CPU model, cores, RAM, the disk under the data), the data spec, the benchmark's
  own results and every sample. ``python -m bench table REPORT.json`` renders its table.
- :func:`epoch_plan` is the loader's epoch plan (seed batches and their sampling seeds),
  the one place a benchmark builds it.
"""
from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ooc.sampling import EpochPlan

REPO = Path(__file__).resolve().parents[1]

#: A case returns its metrics (name -> number), or one number: its seconds (``"s"``).
CaseResult = float | Mapping[str, Any]


@dataclass
class Sample:
    """One run of one case: its round, whether the round was a warm-up, its metrics."""
    case: str
    round: int
    warmup: bool
    values: dict[str, Any]


@dataclass
class Rounds:
    """Every sample of a :func:`run_rounds` call, in the order they ran."""
    cases: list[str]
    samples: list[Sample] = field(default_factory=list)

    def measured(self, case: str) -> list[Sample]:
        """The samples of ``case`` outside the warm-up rounds."""
        return [s for s in self.samples if s.case == case and not s.warmup]

    def values(self, case: str, metric: str) -> list[float]:
        """``metric`` of every measured sample of ``case`` (None and absent skipped)."""
        return [s.values[metric] for s in self.measured(case) if s.values.get(metric) is not None]

    def as_list(self) -> list[dict]:
        """Every sample as a JSON-ready dict."""
        return [asdict(s) for s in self.samples]


def round_order(cases: Sequence[str], r: int) -> list[str]:
    """The order of round ``r``: ``cases`` rotated left by ``r`` (two cases alternate)."""
    k = r % len(cases) if cases else 0
    return list(cases[k:]) + list(cases[:k])


def _as_values(res: CaseResult) -> dict[str, Any]:
    return {"s": float(res)} if isinstance(res, (int, float)) else dict(res)


def run_rounds(cases: Mapping[str, Callable[[], CaseResult]], rounds: int, warmup: int = 1,
               on_sample: Callable[[Sample], None] | None = None) -> Rounds:
    """Run every case ``warmup + rounds`` times in alternating rounds (:func:`round_order`).

    ``cases[name]()`` returns its metrics or its seconds. The first ``warmup`` rounds are
    recorded with ``warmup=True`` and left out of :func:`medians`. ``on_sample`` sees each
    sample as it is taken (to print progress)."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got {rounds} and {warmup}")
    out = Rounds(list(cases))
    for r in range(warmup + rounds):
        for name in round_order(out.cases, r):
            s = Sample(name, r, r < warmup, _as_values(cases[name]()))
            out.samples.append(s)
            if on_sample is not None:
                on_sample(s)
    return out


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    """A case that returns the seconds ``fn()`` took (``time.perf_counter``)."""
    import time

    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def median(xs: Iterable[Any]) -> float | int | None:
    """The median of the numbers in ``xs`` (None skipped); None when there are none. Counts
    stay whole where their median is (a median of ints between two values is a float)."""
    v = [x for x in xs if x is not None]
    if not v:
        return None
    m = float(np.median([float(x) for x in v]))
    whole = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)
    return int(m) if whole and m.is_integer() else m


def medians(rounds: Rounds, metrics: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Per case, the median of each numeric metric over the measured rounds."""
    out: dict[str, dict[str, float]] = {}
    for case in rounds.cases:
        ms = rounds.measured(case)
        names = metrics or sorted({k for s in ms for k, v in s.values.items()
                                   if isinstance(v, (int, float)) and not isinstance(v, bool)})
        out[case] = {k: m for k in names if (m := median(rounds.values(case, k))) is not None}
    return out


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or None when either is missing or ``den`` is 0."""
    if num is None or den is None or den == 0 or math.isnan(den):
        return None
    return num / den


def ratios(meds: Mapping[str, Mapping[str, float]], pairs: Iterable[tuple[str, str]],
           metric: str = "s") -> dict[str, float]:
    """``"<a>_vs_<b>"``: ``meds[b][metric] / meds[a][metric]`` for each pair present (a
    speedup of ``a`` over ``b`` where the metric is a time)."""
    out = {}
    for a, b in pairs:
        r = ratio(meds.get(b, {}).get(metric), meds.get(a, {}).get(metric))
        if r is not None:
            out[f"{a}_vs_{b}"] = r
    return out


def round_ratios(rounds: Rounds, num: str, den: str, metric: str = "s") -> float | None:
    """The median over the measured rounds of ``num``'s metric / ``den``'s in the same
    round (for a disk whose speed drifts between rounds)."""
    by_round: dict[int, dict[str, float]] = {}
    for s in rounds.samples:
        if not s.warmup and s.values.get(metric) is not None:
            by_round.setdefault(s.round, {})[s.case] = s.values[metric]
    return median(ratio(r.get(num), r.get(den)) for r in by_round.values())


# -- the epoch plan ---------------------------------------------------------------------------


def epoch_plan(train_idx: np.ndarray, batch_size: int, seed: int, epoch: int,
               shuffle: bool = True) -> tuple[list[np.ndarray], list[int]]:
    """The loader's plan of one epoch: its seed batches and each batch's sampling seed."""
    return EpochPlan(train_idx, batch_size, seed, epoch, shuffle).first()


# -- the report -------------------------------------------------------------------------------


def git_revision(repo: Path = REPO) -> str | None:
    """The checkout's commit (``+dirty`` when tracked files changed), or None outside git."""
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def disk_of(path: Path) -> dict[str, Any]:
    """The file system under ``path``: its device, type, mount point, size, and whether
    the block device says it spins (``rotational``; None when it does not say)."""
    import psutil

    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    best = None
    for part in psutil.disk_partitions(all=True):
        if str(p).startswith(part.mountpoint.rstrip("/") + "/") or str(p) == part.mountpoint:
            if best is None or len(part.mountpoint) > len(best.mountpoint):
                best = part
    out: dict[str, Any] = {"path": str(p), "total_bytes": shutil.disk_usage(p).total}
    if best is not None:
        out.update(device=best.device, fstype=best.fstype, mountpoint=best.mountpoint)
        dev = Path(best.device).name
        rot = Path("/sys/class/block") / dev / "queue" / "rotational"
        parent = Path("/sys/class/block") / dev / ".." / "queue" / "rotational"
        for f in (rot, parent):
            if f.exists():
                out["rotational"] = f.read_text().strip() == "1"
                break
    return out


def machine(data_path: Path | None = None) -> dict[str, Any]:
    """The machine a report was measured on: CPU model, cores, RAM, OS, the disk under
    ``data_path`` (the current folder when None)."""
    import psutil

    return {"cpu_model": _cpu_model(), "cpus": os.cpu_count(),
            "ram_bytes": psutil.virtual_memory().total, "os": platform.platform(),
            "python": platform.python_version(), "disk": disk_of(data_path or Path.cwd())}


def command_line() -> str:
    """The command as it was typed (interpreter, ``-m bench NAME`` and every flag)."""
    import shlex

    return shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def settings(args: Any) -> dict[str, Any]:
    """The parsed flags of a benchmark (argparse's namespace) as JSON-ready values."""
    return {k: _jsonable(v) for k, v in vars(args).items()}


def report(benchmark: str, results: Mapping[str, Any], *, spec: Mapping[str, Any] | None = None,
           samples: Rounds | list | None = None, data_path: Path | None = None,
           args: Any = None) -> dict[str, Any]:
    """The report of one benchmark run: ``results`` (the benchmark's own keys, which stay at
    the top level) with the command, revision, machine, data spec, flags and every sample."""
    rep: dict[str, Any] = {"benchmark": benchmark, "command": command_line(),
                           "revision": git_revision(), "machine": machine(data_path),
                           "spec": dict(spec or {}),
                           "settings": settings(args) if args is not None else {}}
    rep.update(results)
    rep["samples"] = samples.as_list() if isinstance(samples, Rounds) else list(samples or [])
    return _jsonable(rep)


def write_report(path: Path | str, benchmark: str, results: Mapping[str, Any], **kw: Any
                 ) -> dict[str, Any]:
    """Write :func:`report` to ``path`` as JSON (under a temporary name, then renamed; the
    folder made first); return it."""
    import json

    rep = report(benchmark, results, **kw)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rep, indent=2, default=str))
    os.replace(tmp, path)
    return rep


# -- tables -----------------------------------------------------------------------------------


def fmt(x: Any, spec: str) -> str:
    """``format(x, spec)``, or an en dash for a missing value."""
    return "–" if x is None else format(x, spec)


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]],
             align: Sequence[str] | None = None) -> str:
    """A markdown table; ``align`` per column: ``"l"`` or ``"r"`` (numbers; the default
    after the first column)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def generic_table(rep: Mapping[str, Any]) -> str:
    """The table a report carries (``table``), else the medians of its samples, a row a
    case and a column a metric."""
    if isinstance(rep.get("table"), str):
        return rep["table"]
    meds = rep.get("medians") or {}
    if not meds and rep.get("samples"):
        rounds = Rounds(list(dict.fromkeys(s["case"] for s in rep["samples"])),
                        [Sample(**s) for s in rep["samples"]])
        meds = medians(rounds)
    metrics = sorted({k for m in meds.values() for k in m})
    return markdown(["case", *metrics],
                    [[c, *(fmt(m.get(k), ".4g") for k in metrics)] for c, m in meds.items()])
