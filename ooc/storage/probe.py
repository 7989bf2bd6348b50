"""Probe a native read backend in a child process before a process first uses it.

A binary wheel built for another CPU dies with SIGILL (or SIGSEGV) the first
time it runs an instruction this CPU lacks; no ``try`` catches that, so the
backend is first run in ``python -m ooc.storage.probe_child MODULE:CLASS FILE``: import,
open (ring set-up), read the file's first page with ``O_DIRECT`` and compare
it with a buffered read. The verdict (``ok``, refused, failed, or killed by a
signal) is cached under ``<cache>/probe/`` keyed by the backend, its
version and the files it would be imported from, ooc's version, the Python, the kernel, the
CPU's feature flags and the file system (device) of the file, so later runs pay nothing.

The cache folder is ``$OOC_CACHE``, else ``$XDG_CACHE_HOME/ooc``, else
``~/.cache/ooc`` (see :func:`cache_dir`).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ooc.core.version import __version__

#: Seconds a probe may take before it counts as failed (a hung ring set-up).
PROBE_TIMEOUT_S = 60.0

_memo: dict[str, "Verdict"] = {}


@dataclass(frozen=True)
class Verdict:
    """Whether a backend works here; ``reason`` is one line when it does not."""

    ok: bool
    reason: str = ""


def cache_dir() -> Path:
    """ooc's per-user cache folder (``$OOC_CACHE``, ``$XDG_CACHE_HOME/ooc`` or ``~/.cache/ooc``)."""
    root = os.environ.get("OOC_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ooc"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def _origin(module: str) -> str:
    """The file ``module`` would be imported from (found, not imported)."""
    if not module:
        return ""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return "not found"
    return str(spec.origin) if spec is not None else "not found"


def _key(target: str, version: str, binding: str, path: str) -> str:
    try:
        dev = os.stat(path).st_dev
    except OSError:
        dev = -1
    parts = [target, version, _origin(binding), _origin(target.split(":")[0]), __version__,
             sys.version, platform.release(), platform.machine(), _cpu_flags(), str(dev)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _run_child(target: str, path: str, label: str) -> Verdict:
    cmd = [sys.executable, "-m", "ooc.storage.probe_child", target, path]
    env = dict(os.environ, PYTHONFAULTHANDLER="")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                           env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"{label} hung in a probe (no answer in {PROBE_TIMEOUT_S:.0f} s)")
    except OSError as e:
        return Verdict(False, f"{label} could not be probed: {e}")
    out = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode < 0:
        return Verdict(False, f"{label} crashed in a probe ({_signal_name(r.returncode)})")
    if r.returncode == 0 and out == "ok":
        return Verdict(True)
    why = out or (r.stderr.strip().splitlines() or ["no output"])[-1]
    verb = "refused" if r.returncode == 3 else "failed in a probe"
    return Verdict(False, f"{label} {verb}: {why}")


def load_class(target: str) -> type[Any]:
    """The backend class named by ``"module:Class"``."""
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def verdict(name: str, target: str, path: str) -> Verdict:
    """Whether backend ``name`` (class ``target``, ``"module:Class"``) works here, probed once.

    The first call for a key runs the child and writes the verdict to the
    cache; later calls (in any process) read it.
    """
    cls = load_class(target)
    version = cls.version()
    label = f"{name} {version}".strip()
    key = _key(target, version, cls.binding, path)
    if key in _memo:
        return _memo[key]
    file = cache_dir() / "probe" / f"{name}-{key}.json"
    try:
        d = json.loads(file.read_text())
        v = Verdict(bool(d["ok"]), str(d.get("reason", "")))
    except (OSError, ValueError, KeyError, TypeError):
        v = _run_child(target, path, label)
        _save(file, {"backend": name, "version": version, "ok": v.ok, "reason": v.reason})
    _memo[key] = v
    return v


def _save(file: Path, d: dict) -> None:
    """Write the verdict atomically; an unwritable cache only costs a probe next time."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, file)
    except OSError:
        pass


def forget() -> None:
    """Drop this process's memo of verdicts (tests)."""
    _memo.clear()
