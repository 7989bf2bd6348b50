"""The code passes ruff and mypy with the project's configuration (pyproject.toml [tool.ruff],
[tool.mypy])."""
import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO


def test_ruff_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "ooc", "bench", "tests"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_is_clean():
    """``mypy ooc`` passes with the project's configuration (pyproject.toml [tool.mypy])."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' installs it)")
    r = subprocess.run([sys.executable, "-m", "mypy", "ooc"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
