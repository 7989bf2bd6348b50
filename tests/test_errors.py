"""One error hierarchy: every error ooc raises for a user is an ``ooc.OocError`` and also
the builtin of its kind, so ``except ValueError`` (or ``FileNotFoundError``, ...) works."""
import ast
from pathlib import Path

import numpy as np
import pytest
from conftest import community_graph

import ooc

PKG = Path(ooc.__file__).resolve().parent
BUILTIN = {"BudgetError": ValueError, "DatasetError": ValueError, "IOFailure": OSError,
           "IdOutOfRange": IndexError, "InvalidValue": ValueError, "NotFound": FileNotFoundError,
           "OutputBusy": RuntimeError, "OutputExists": FileExistsError, "TimedOut": TimeoutError}


def test_every_exported_error_is_also_its_builtin():
    for name, builtin in BUILTIN.items():
        cls = getattr(ooc, name)
        assert issubclass(cls, ooc.OocError) and issubclass(cls, builtin), name
        e = cls("x", "one line") if name == "DatasetError" else cls("x: one line")
        assert str(e) == "x: one line", name


def test_no_bare_builtin_or_base_error_is_raised_by_the_library():
    """Kernels (numba), internal invariants (RuntimeError, TypeError) and a system error
    passed on with its errno (``OSError(errno, strerror, path)``, wrapped by the caller)
    aside, a raise names a class of the hierarchy."""
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        if f.name.endswith("_kernels.py"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id in (
                        "OocError", "ValueError", "IndexError", "KeyError", "FileNotFoundError",
                        "FileExistsError", "OSError") \
                    and not (node.exc.func.id == "OSError" and len(node.exc.args) >= 2):
                bad.append(f"{f.relative_to(PKG)}:{node.lineno} {node.exc.func.id}")
    assert not bad, bad


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return community_graph(tmp_path_factory.mktemp("err") / "g", n=200)


def test_library_calls_raise_the_builtin_of_their_kind(graph, tmp_path):
    with pytest.raises(ValueError, match="not a dataset folder"):
        ooc.open_dataset(tmp_path / "nope")
    ds = ooc.open_dataset(graph)
    with pytest.raises(ValueError, match="num_neighbors"):
        ooc.NodeLoader(ds, "10,10", batch_size=8)
    with pytest.raises(IndexError, match="out of range"):
        ooc.NodeLoader(ds, [3, 3], input_nodes=np.array([0, 10**6]), batch_size=8)
    with pytest.raises(FileExistsError, match="already exists"):
        ooc.write_dataset(graph, np.zeros(3, np.int64), np.zeros(0, np.int64),
                          np.zeros((2, 2), np.float32))
    from ooc.core.sizes import parse_size

    with pytest.raises(ValueError):
        parse_size("lots")
    assert ooc.open_dataset(graph).num_nodes == 200  # the refused write left it alone


def test_a_setting_is_named_the_way_its_caller_wrote_it(graph, tmp_path):
    """From Python the keyword (``memory_budget``), from a command line the flag."""
    import subprocess
    import sys

    from conftest import REPO

    from ooc.core.errors import cli_names, setting
    from ooc.executor.settings import BY_NAME

    assert setting("--memory-budget") == "memory_budget"
    assert BY_NAME["num_threads"].label() == "num_threads"     # the keyword, not "threads"
    with cli_names():
        assert setting("--memory-budget") == "--memory-budget"
        assert BY_NAME["num_threads"].label() == "--threads"
    ds = ooc.open_dataset(graph)
    with pytest.raises(ValueError, match=r"^memory_budget 1\.0 MiB is below what mode ooc needs"):
        ooc.NodeLoader(ds, [3, 3], batch_size=8, memory_budget="1MiB")
    with pytest.raises(ValueError, match=r"^queue_depth 0: must be an integer in \[1, 4096\]"):
        ooc.NodeLoader(ds, [3, 3], batch_size=8, queue_depth=0)
    with pytest.raises(ValueError, match=r"^batch_size 0: must be an integer"):
        ooc.TrainConfig(batch_size=0).validate()
    p = subprocess.run([sys.executable, "-m", "ooc.train", "--data", str(graph), "--memory-budget",
                        "1MiB", "--no-progress"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and "ooc: --memory-budget 1.0 MiB is below what mode ooc" in p.stderr, \
        p.stderr
