"""Memory cgroups (v1 or v2) for measured children (``python -m ooc.size --verify``, the
benchmarks): a budget the page cache counts against.

``run(tag, python_argv, limit)`` runs ``python *python_argv`` in a new cgroup
``ooc-bench-<pid>-<tag>`` limited to ``limit`` bytes (the child joins it before it execs, so
everything it does counts; ``limit=None``: no cgroup), prints its output prefixed with the
tag, and removes the group afterwards, also when interrupted. The pieces (``make_cgroup``,
``in_cgroup``, ``cgroup_stats``, ``remove_cgroup``) are here too.

Both hierarchies are supported: cgroup v1's memory controller at ``/sys/fs/cgroup/memory``
(``memory.limit_in_bytes``, ``memory.max_usage_in_bytes``, ``memory.failcnt``) and a cgroup v2
mount whose root offers the ``memory`` controller (``memory.max``, ``memory.peak`` or the
largest ``memory.current`` seen, ``memory.events``' ``max`` count). :func:`cgroup_stats`
reports both under v1's names so callers read one set of keys.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
# join the cgroup (argv[1] is its cgroup.procs), then exec the rest of argv
_JOIN = ("import os,sys; open(sys.argv[1],'w').write(str(os.getpid())); "
         "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")


def log(msg: str) -> None:
    """Print ``msg`` as a ``bench:`` line, flushed at once."""
    print(f"bench: {msg}", flush=True)


def _v2_root() -> Path | None:
    """The mount point of a cgroup v2 hierarchy whose root offers the memory controller."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            root = Path(parts[1])
            try:
                if "memory" in (root / "cgroup.controllers").read_text().split():
                    return root
            except OSError:
                continue
    return None


def _root() -> tuple[Path, int] | None:
    """Where new memory cgroups go, and the hierarchy's version (v1 preferred when mounted)."""
    if (V1_ROOT / "cgroup.procs").exists():
        return V1_ROOT, 1
    v2 = _v2_root()
    return (v2, 2) if v2 is not None else None


#: Where new memory cgroups go (for messages); None when neither hierarchy is usable.
CGROUP_ROOT = (_root() or (None, 0))[0]


def available() -> bool:
    """Whether a memory cgroup can be made here (v1 or v2)."""
    return _root() is not None


def version(cg: Path) -> int:
    """1 or 2: the hierarchy ``cg`` belongs to."""
    return 1 if (cg / "memory.limit_in_bytes").exists() else 2


def _write_limit_v2(root: Path, cg: Path, limit: int) -> None:
    ctl = root / "cgroup.subtree_control"
    if "memory" not in ctl.read_text().split():
        ctl.write_text("+memory")
    (cg / "memory.max").write_text(str(limit))
    try:
        (cg / "memory.swap.max").write_text("0")
    except OSError:
        pass  # no swap accounting: nothing to switch off


def make_cgroup(name: str, limit: int) -> Path | None:
    """A new memory cgroup limited to ``limit`` bytes, or None (logged) when not possible."""
    found = _root()
    if found is None:
        return None
    root, ver = found
    cg = root / name
    try:
        cg.mkdir(exist_ok=True)
        if ver == 1:
            (cg / "memory.limit_in_bytes").write_text(str(limit))
        else:
            _write_limit_v2(root, cg, limit)
            _PeakWatch.start(cg)
        return cg
    except OSError as e:
        log(f"cannot create memory cgroup {cg}: {e}")
        try:
            cg.rmdir()
        except OSError:
            pass
        return None


class _PeakWatch:
    """The largest ``memory.current`` of a v2 group, sampled every 10 ms, for kernels
    without ``memory.peak`` (before 5.19)."""

    _peaks: dict[Path, int] = {}
    _stops: dict[Path, threading.Event] = {}

    @classmethod
    def start(cls, cg: Path) -> None:
        if (cg / "memory.peak").exists():
            return
        stop = threading.Event()
        cls._peaks[cg], cls._stops[cg] = 0, stop

        def watch() -> None:
            while not stop.wait(0.01):
                try:
                    cls._peaks[cg] = max(cls._peaks[cg], int((cg / "memory.current").read_text()))
                except (OSError, ValueError):
                    return
        threading.Thread(target=watch, daemon=True).start()

    @classmethod
    def peak(cls, cg: Path) -> int | None:
        return cls._peaks.get(cg)

    @classmethod
    def stop(cls, cg: Path) -> None:
        ev = cls._stops.pop(cg, None)
        if ev is not None:
            ev.set()
        cls._peaks.pop(cg, None)


def in_cgroup(cg: Path | None, python_argv: list[str]) -> list[str]:
    """``[python, *python_argv]``, made to run inside ``cg`` when it is not None."""
    if cg is None:
        return [sys.executable, *python_argv]
    return [sys.executable, "-c", _JOIN, str(cg / "cgroup.procs"), *python_argv]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return (1 << 63) - 1 if text == "max" else int(text) if text.lstrip("-").isdigit() else None


def cgroup_stats(cg: Path) -> dict:
    """``limit_in_bytes``, ``max_usage_in_bytes`` (the group's peak, page cache included) and
    ``failcnt`` (times the limit was hit), under v1's names for either hierarchy."""
    if version(cg) == 1:
        keys = {"limit_in_bytes": "memory.limit_in_bytes",
                "max_usage_in_bytes": "memory.max_usage_in_bytes", "failcnt": "memory.failcnt"}
        return {k: v for k, f in keys.items() if (v := _read_int(cg / f)) is not None}
    out: dict = {}
    if (v := _read_int(cg / "memory.max")) is not None:
        out["limit_in_bytes"] = v
    peak = _read_int(cg / "memory.peak")
    peak = peak if peak is not None else _PeakWatch.peak(cg)
    if peak is not None:
        out["max_usage_in_bytes"] = peak
    try:
        events = dict(line.split() for line in (cg / "memory.events").read_text().splitlines())
        out["failcnt"] = int(events.get("max", 0))
        out["oom_kill"] = int(events.get("oom_kill", 0))
    except (OSError, ValueError):
        pass
    return out


def remove_cgroup(cg: Path) -> None:
    """Stop watching ``cg``'s peak and remove the cgroup, retrying while its processes exit
    (logs a line when it stays)."""
    _PeakWatch.stop(cg)
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    log(f"could not remove cgroup {cg}")


def drop_page_cache() -> bool:
    """Write back dirty pages and drop the page cache (root only); False when refused."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
        return True
    except OSError:
        return False


def exit_words(rc: int) -> str:
    """An exit status in words (a child killed by a signal: which; SIGKILL: likely the OOM
    killer of its cgroup)."""
    if rc >= 0:
        return f"exit status {rc}"
    import signal

    name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
    return f"killed by {name}" + (" (out of memory in its cgroup?)" if -rc == 9 else "")


def run(tag: str, python_argv: list[str], limit: int | None,
        seconds: float | None = None) -> dict:
    """Run ``python *python_argv`` (in a cgroup of ``limit`` bytes unless None), killed
    after ``seconds`` when given.

    Returns ``{"rc", "wall_s", "child_peak_rss_bytes", "cgroup" (its stats, when one
    was made), "lines" (the output), "stopped" (whether the time limit killed it)}``.
    """
    cg = None if limit is None else make_cgroup(f"ooc-bench-{os.getpid()}-{tag}", limit)
    where = f"cgroup {cg.name}, limit {limit >> 20} MiB" if cg is not None and limit else \
        "no cgroup"
    log(f"{tag}: {' '.join(python_argv)}  [{where}]")
    t0 = time.perf_counter()
    proc = subprocess.Popen(in_cgroup(cg, python_argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        proc.kill()

    timer = threading.Timer(seconds, stop) if seconds else None
    if timer is not None:
        timer.daemon = True
        timer.start()
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
    if timer is not None:
        timer.cancel()
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    res: dict = {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2),
                 "child_peak_rss_bytes": ru.ru_maxrss * 1024,
                 "bytes_read": ru.ru_inblock * 512, "bytes_written": ru.ru_oublock * 512,
                 "lines": lines, "stopped": stopped.is_set()}
    if cg is not None:
        res["cgroup"] = cgroup_stats(cg)
        remove_cgroup(cg)
    return res
