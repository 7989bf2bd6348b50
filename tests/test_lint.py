"""The code passes ruff with the project's configuration (pyproject.toml [tool.ruff])."""
import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO


def test_ruff_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "ooc", "tools", "tests"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
