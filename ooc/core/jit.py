"""Say when numba's on-disk kernel cache is cold, before the compile starts.

Every kernel is ``cache=True``: the first run on a machine compiles them
(tens of seconds on two cores), later runs load them. Without a word the
first epoch looks hung, so entry points call :func:`note_if_cold` first.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from ooc.core.notes import note
from ooc.core.threading_layer import dispatcher_of


def kernels_cached(module: str) -> bool | None:
    """Whether any cached kernel of ``module`` has an index file on disk (None: unknown)."""
    try:
        import numba

        mod = importlib.import_module(module)
        seen = False
        for obj in map(dispatcher_of, vars(mod).values()):
            # _cache is a numba internal the dispatcher sets at runtime (not in numba's hints)
            if isinstance(obj, numba.core.registry.CPUDispatcher) and obj._cache is not None:  # type: ignore[attr-defined]
                seen = True
                if os.path.exists(obj._cache._cache_file._index_path):  # type: ignore[attr-defined]
                    return True
        return False if seen else None
    except Exception:  # noqa: BLE001 - numba internals: no note rather than a failure
        return None


#: Set in a command re-run after its kernel cache was cleared (so it is cleared once).
RESET_ENV = "OOC_KERNEL_CACHE_RESET"


def from_kernel_cache(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while numba loaded a cached kernel (a truncated or
    tampered ``.nbi``/``.nbc`` file makes its unpickling fail with any error)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/numba/" in name and name.endswith("caching.py"):
            return True
        tb = tb.tb_next
    return False


def clear_kernel_cache() -> int:
    """Delete the cached kernels of ooc (``*.nbi``/``*.nbc`` where numba keeps them: under
    ``NUMBA_CACHE_DIR`` those of ooc's modules when it is set, else ooc's ``__pycache__``
    folders); returns how many files went. numba compiles them again on their next call."""
    import hashlib

    package = Path(__file__).resolve().parents[1]  # the ooc package
    custom = os.environ.get("NUMBA_CACHE_DIR")
    if custom:  # numba keeps a source folder's kernels in <name>_<sha1 of its path>
        folders = [Path(custom) / f"{d.name}_{hashlib.sha1(str(d).encode()).hexdigest()}"
                   for d in [package, *package.rglob("*")] if d.is_dir()]
    else:
        folders = [d for d in package.rglob("__pycache__") if d.is_dir()]
    gone = 0
    for folder in folders:
        for f in list(folder.glob("*.nb[ic]")):
            try:
                f.unlink()
                gone += 1
            except OSError:
                pass
    return gone


def note_if_cold(modules: tuple[str, ...], what: str = "the kernels") -> bool:
    """One note when none of ``modules`` has a cached kernel yet; returns whether it was cold."""
    cold = all(kernels_cached(m) is False for m in modules)
    if cold:
        note(f"first run on this machine: compiling {what} (once, 10-60 s; numba caches them "
             f"on disk for later runs)", key="jit-cold")
    return cold


def kernels_stamp(key: str) -> Path | None:
    """A file that exists once a child process compiled the kernels ``key`` names (a stage,
    its mode and the dtypes it runs them with) from the current kernel sources
    (``_*kernels.py``, where every numba kernel of ooc lives) and numba version; it lives
    beside numba's cache (``NUMBA_CACHE_DIR``, else ``ooc/__pycache__``), so clearing the
    cache clears the stamps, and for this CPU (numba keeps a kernel per CPU model and
    features, so a cache shared with another machine is cold for this one). None when the
    sources cannot be read."""
    import hashlib

    import llvmlite.binding as ll
    import numba

    package = Path(__file__).resolve().parents[1]  # the ooc package
    cpu = f"{ll.get_host_cpu_name()}|{ll.get_host_cpu_features().flatten()}"
    h = hashlib.sha1(f"{numba.__version__}|{cpu}|{key}".encode())
    try:
        for f in sorted(package.rglob("_*kernels.py")):
            st = f.stat()
            h.update(f"{f.relative_to(package)}:{st.st_mtime_ns}:{st.st_size}".encode())
    except OSError:
        return None
    # numba.config sets its settings at import time, out of its type hints' sight
    cache = numba.config.CACHE_DIR  # type: ignore[attr-defined]
    root = Path(cache) if cache else package / "__pycache__"
    return root / f"ooc-kernels-{h.hexdigest()[:20]}.ok"


def compile_in_child(key: str, entry: str, args: list[str], timeout: float = 600.0) -> str:
    """Compile (or find in numba's on-disk cache) a stage's kernels in a child process,
    unless :func:`kernels_stamp` of ``key`` says an earlier child did.

    A kernel compiled in the calling process leaves LLVM's compile-time memory behind
    (which ``malloc_trim`` does not return): a first
    run would peak higher than later runs and than its memory plan. The child runs
    ``entry`` (``"package.module:function"``, called with ``args``), which calls the stage's
    kernels with the argument types the real run gives them, on tiny data. Returns how it
    went, in words; on any other failure than input the run itself refuses (an
    :class:`~ooc.core.errors.OocError`) the kernels compile in this process instead,
    and a note says so.
    """
    stamp = kernels_stamp(key)
    if stamp is not None and stamp.exists():
        return "loaded from numba's cache (compiled by an earlier run)"
    module, function = entry.split(":")
    # input the run itself refuses (an OocError) is exit code 2: the run says why, in one line
    cmd = [sys.executable, "-c", f"import sys\nfrom ooc.core.errors import OocError\n"
           f"from {module} import {function}\ntry:\n    {function}(sys.argv[1:])\n"
           f"except OocError as e:\n    print(e)\n    sys.exit(2)", *args]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        if p.returncode == 0:
            if stamp is not None:
                try:
                    stamp.parent.mkdir(parents=True, exist_ok=True)
                    stamp.touch()
                except OSError:
                    pass
            return "compiled (or loaded from numba's cache) in a child process"
        why = (p.stdout.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        if p.returncode == 2:
            return f"child process refused its input ({why}); the run will say why"
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    note(f"compiling the kernels in a child process failed ({why}); they compile in this "
         f"process, whose first run then peaks higher", key="jit-child")
    return f"child process failed ({why}); compiled in this process"
