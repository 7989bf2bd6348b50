"""Memory cgroups (v1) for benchmark children: a budget the page cache counts against.

``run(tag, python_argv, limit)`` runs ``python *python_argv`` in a new
cgroup ``/sys/fs/cgroup/memory/ooc-bench-<pid>-<tag>`` limited to ``limit``
bytes (the child joins it before it execs, so everything it does counts;
``limit=None``: no cgroup), prints its output prefixed with the tag, and
removes the group afterwards, also when interrupted. The pieces
(``make_cgroup``, ``in_cgroup``, ``cgroup_stats``, ``remove_cgroup``) are
here too.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
# join the cgroup (argv[1] is its cgroup.procs), then exec the rest of argv
_JOIN = ("import os,sys; open(sys.argv[1],'w').write(str(os.getpid())); "
         "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")


def log(msg: str) -> None:
    print(f"bench: {msg}", flush=True)


def available() -> bool:
    return (CGROUP_ROOT / "cgroup.procs").exists()


def make_cgroup(name: str, limit: int) -> Path | None:
    """A new memory cgroup limited to ``limit`` bytes, or None (logged) when not possible."""
    if not available():
        return None
    cg = CGROUP_ROOT / name
    try:
        cg.mkdir(exist_ok=True)
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        return cg
    except OSError as e:
        log(f"cannot create memory cgroup {cg}: {e}")
        try:
            cg.rmdir()
        except OSError:
            pass
        return None


def in_cgroup(cg: Path | None, python_argv: list[str]) -> list[str]:
    """``[python, *python_argv]``, made to run inside ``cg`` when it is not None."""
    if cg is None:
        return [sys.executable, *python_argv]
    return [sys.executable, "-c", _JOIN, str(cg / "cgroup.procs"), *python_argv]


def cgroup_stats(cg: Path) -> dict:
    out = {}
    for k in ("memory.max_usage_in_bytes", "memory.failcnt", "memory.limit_in_bytes"):
        try:
            out[k.split(".", 1)[1]] = int((cg / k).read_text())
        except (OSError, ValueError):
            pass
    return out


def remove_cgroup(cg: Path) -> None:
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    log(f"could not remove cgroup {cg}")


def exit_words(rc: int) -> str:
    """An exit status in words (a child killed by a signal: which; SIGKILL: likely the OOM
    killer of its cgroup)."""
    if rc >= 0:
        return f"exit status {rc}"
    import signal

    name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
    return f"killed by {name}" + (" (out of memory in its cgroup?)" if -rc == 9 else "")


def run(tag: str, python_argv: list[str], limit: int | None) -> dict:
    """Run ``python *python_argv`` (in a cgroup of ``limit`` bytes unless None).

    Returns ``{"rc", "wall_s", "child_peak_rss_bytes", "cgroup" (its stats, when one
    was made), "lines" (the output)}``.
    """
    cg = None if limit is None else make_cgroup(f"ooc-bench-{os.getpid()}-{tag}", limit)
    where = f"cgroup {cg.name}, limit {limit >> 20} MiB" if cg is not None else "no cgroup"
    log(f"{tag}: {' '.join(python_argv)}  [{where}]")
    t0 = time.perf_counter()
    proc = subprocess.Popen(in_cgroup(cg, python_argv), cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            print(f"  [{tag}] {line.rstrip()}", flush=True)
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): stop the run, leave no cgroup
        proc.kill()
        proc.wait()
        if cg is not None:
            remove_cgroup(cg)
        raise
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    res: dict = {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2),
                 "child_peak_rss_bytes": ru.ru_maxrss * 1024, "lines": lines}
    if cg is not None:
        res["cgroup"] = cgroup_stats(cg)
        remove_cgroup(cg)
    return res
