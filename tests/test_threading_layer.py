"""Parallel kernels launched from several threads at once on any numba threading layer:
``workqueue`` (numba's fallback without libgomp or tbb) aborts the process on such a
launch unless ooc serialises them (:mod:`ooc.core.threading_layer`)."""
import copy
import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

import ooc
from ooc.core.threading_layer import ParallelKernel, dispatcher_of, parallel_kernel


def _kernel_modules():
    for info in pkgutil.walk_packages(ooc.__path__, "ooc."):
        if info.name.rsplit(".", 1)[-1].endswith("kernels"):
            yield importlib.import_module(info.name)


def test_every_parallel_kernel_of_ooc_is_guarded():
    guarded, bare = [], []
    for mod in _kernel_modules():
        for name, obj in vars(mod).items():
            disp = dispatcher_of(obj)
            if (isinstance(disp, numba.core.registry.CPUDispatcher)
                    and disp.targetoptions.get("parallel") and disp.py_func.__module__ == mod.__name__):
                (guarded if isinstance(obj, ParallelKernel) else bare).append(f"{mod.__name__}.{name}")
    assert not bare, f"parallel kernels without @parallel_kernel: {bare}"
    assert len(guarded) >= 20


def test_the_guard_takes_only_parallel_kernels_and_keeps_their_attributes():
    with pytest.raises(TypeError, match="not a parallel=True kernel"):
        parallel_kernel(numba.njit(lambda x: x))

    @numba.njit(parallel=True)
    def twice(x):
        """Double ``x``."""
        out = np.empty_like(x)
        for i in numba.prange(x.shape[0]):
            out[i] = 2 * x[i]
        return out

    k = parallel_kernel(twice)
    assert np.array_equal(k(np.arange(5.0)), 2 * np.arange(5.0))
    assert k.__doc__ == "Double ``x``." and k.__name__ == "twice"
    assert k.signatures == twice.signatures and dispatcher_of(k) is twice
    c = copy.copy(k)  # made without __init__: attribute lookups must not recurse
    assert dispatcher_of(c) is twice and np.array_equal(c(np.ones(3)), 2 * np.ones(3))


# Two threads copy rows through the feature cache's nogil parallel kernel while the main
# thread runs the dropout's backward kernel, as a training run's gather thread and model
# do. Every result is checked against numpy.
_CONCURRENT = textwrap.dedent("""
    import sys, threading
    import numpy as np
    from ooc.caches import _cache_kernels as CK
    from ooc.executor.training import _activation_kernels as AK

    raw = sys.argv[1] == "raw"
    scatter = CK.scatter_rows.dispatcher if raw else CK.scatter_rows
    scale = AK.masked_scale.dispatcher if raw else AK.masked_scale
    rows = np.random.default_rng(0).standard_normal((20000, 64)).astype(np.float32)
    pos = np.random.default_rng(1).permutation(20000).astype(np.int64)
    want = np.empty_like(rows)
    want[pos] = rows
    grad = rows.reshape(-1)
    keep = grad > 0
    want_grad = np.where(keep, grad * np.float32(2), np.float32(0))
    errors = []

    def copy():
        out = np.empty_like(rows)
        for _ in range(200):
            scatter(rows, pos, out)
            if not np.array_equal(out, want):
                errors.append("scatter_rows")

    threads = [threading.Thread(target=copy) for _ in range(2)]
    for t in threads:
        t.start()
    out = np.empty_like(grad)
    launches = 0
    while any(t.is_alive() for t in threads) or launches < 50:
        scale(grad, keep, np.float32(2), out)
        launches += 1
        if not np.array_equal(out, want_grad):
            errors.append("masked_scale")
    for t in threads:
        t.join()
    print("errors", sorted(set(errors)), "launches", launches)
    sys.exit(1 if errors else 0)
""")


def _run_concurrent(mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    return subprocess.run([sys.executable, "-c", _CONCURRENT, mode], env=env,
                          capture_output=True, text=True, timeout=600)


def test_concurrent_launches_on_the_workqueue_layer_run_and_are_right():
    res = _run_concurrent("guarded")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "errors []" in res.stdout
    assert "threading layer is 'workqueue'" in res.stderr  # the note on the slow layer


def test_without_the_guard_the_workqueue_layer_aborts():
    """The same launches straight to numba's dispatchers: numba aborts the process, which
    is what the guard prevents (a check that the test above exercises the race)."""
    res = _run_concurrent("raw")
    assert res.returncode != 0 and "not threadsafe" in res.stderr, res.stdout + res.stderr


def test_this_machine_has_a_thread_safe_layer():
    """Training's fast path: numba here runs on omp (libgomp) or tbb."""
    from ooc.core.threading_layer import layer_is_thread_safe

    assert layer_is_thread_safe(), numba.threading_layer()


def test_the_cold_cache_check_sees_guarded_kernels(tmp_path, monkeypatch):
    """``ooc.core.jit.kernels_cached`` looks through the guard: a module whose only kernel is
    guarded is cold before its first call (not unknown) and cached after it."""
    from ooc.core.jit import kernels_cached

    (tmp_path / "guarded_only_kernels.py").write_text(textwrap.dedent("""
        import numba
        from ooc.core.threading_layer import parallel_kernel

        @parallel_kernel
        @numba.njit(parallel=True, cache=True)
        def total(x):
            s = 0.0
            for i in numba.prange(x.shape[0]):
                s += x[i]
            return s
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("guarded_only_kernels")
    try:
        assert kernels_cached(mod.__name__) is False
        assert mod.total(np.arange(4.0)) == 6.0
        assert kernels_cached(mod.__name__) is True
    finally:
        sys.modules.pop(mod.__name__, None)
