"""fio 4 KiB random reads: the physical limit the benchmarks compare the readers with.

``run_fio(path, qd, seconds)`` runs ``fio --rw=randread --bs=4k --direct=1``
(io_uring engine, else libaio, else psync) on ``path`` and returns IOPS and
CPU per read. CPU is what the fio processes used, io_uring's kernel worker
threads (``iou-wrk``) included, less fio's own start-up (a one-read run of the
same command, measured once per file): that is how the readers' CPU is
measured too (``time.process_time`` counts their workers). fio's own
per-job figure (``job_cpu_us_per_op``), which leaves the workers out, is
kept beside it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENGINES = ("io_uring", "libaio", "psync")
_startup_cpu: dict[tuple[str, str], float] = {}


def available() -> bool:
    return shutil.which("fio") is not None


def _cmd(path: Path, engine: str, qd: int) -> list[str]:
    return [shutil.which("fio") or "fio", "--name=randread", f"--filename={path}",
            "--rw=randread", "--bs=4k", "--direct=1", f"--ioengine={engine}",
            f"--iodepth={qd}", "--readonly", "--numjobs=1", "--output-format=json"]


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd``; also return the CPU seconds it used (its threads and children)."""
    before = os.times()
    r = subprocess.run(cmd, capture_output=True, text=True)
    after = os.times()
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return r, cpu


def run_fio(path: Path, queue_depth: int, seconds: float) -> dict | None:
    """4 KiB O_DIRECT random reads of ``path`` at ``queue_depth`` for ``seconds``.

    Returns ``{"engine", "iops", "mb_per_s", "ios", "lat_mean_us", "cpu_us_per_op",
    "job_cpu_us_per_op", "cmd"}``, or None when fio is missing or fails (the
    reason is printed on stderr).
    """
    if not available():
        return None
    err = ""
    for engine in ENGINES:
        key = (str(path), engine)
        if key not in _startup_cpu:
            r0, cpu0 = _run(_cmd(path, engine, 1) + ["--number_ios=1", "--size=4k"])
            if r0.returncode != 0:
                err = r0.stderr.strip()[:200]
                continue
            _startup_cpu[key] = cpu0
        cmd = _cmd(path, engine, queue_depth) + [f"--runtime={seconds:g}", "--time_based"]
        r, cpu = _run(cmd)
        if r.returncode != 0:
            err = r.stderr.strip()[:200]
            continue
        try:
            j = json.loads(r.stdout[r.stdout.index("{"):])
        except ValueError:
            err = "unreadable fio output"
            continue
        job = j["jobs"][0]
        rd = job["read"]
        ios = max(1, int(rd["total_ios"]))
        job_cpu = (job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) / 100 * \
            job.get("job_runtime", 0) / 1e3
        return {"engine": engine, "queue_depth": queue_depth, "iops": float(rd["iops"]),
                "mb_per_s": rd["bw_bytes"] / 1e6, "ios": ios,
                "lat_mean_us": float(rd["lat_ns"]["mean"]) / 1e3,
                "cpu_us_per_op": max(0.0, cpu - _startup_cpu[key]) / ios * 1e6,
                "job_cpu_us_per_op": job_cpu / ios * 1e6, "cmd": " ".join(cmd)}
    print(f"fio failed on {path}: {err}", file=sys.stderr)
    return None


def run_fio_seq(path: Path, write: bool, seconds: float, size: int = 1 << 30) -> float | None:
    """Bytes a second of 4 MiB O_DIRECT sequential reads of ``path`` (``write``: writes of a
    new file ``path`` of ``size`` bytes, removed after) at queue depth 4 for ``seconds``;
    None when fio is missing or fails."""
    if not available():
        return None
    rw = "write" if write else "read"
    cmd = [shutil.which("fio") or "fio", f"--name=seq{rw}", f"--filename={path}",
           f"--rw={rw}", "--bs=4M", "--direct=1", "--ioengine=psync" if write else
           "--ioengine=io_uring", "--iodepth=4", "--numjobs=1", "--output-format=json",
           f"--runtime={seconds:g}", "--time_based"] + ([f"--size={size}"] if write
                                                         else ["--readonly"])
    try:
        r, _ = _run(cmd)
        if r.returncode != 0:
            print(f"fio ({rw}) failed on {path}: {r.stderr.strip()[:200]}", file=sys.stderr)
            return None
        job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
        return float(job[rw]["bw_bytes"]) or None
    except ValueError:
        return None
    finally:
        if write:
            Path(path).unlink(missing_ok=True)
