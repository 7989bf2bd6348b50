"""The README's Python snippet runs as written, after the README's own Planetoid command."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, require_cora


def _readme() -> str:
    return (REPO / "README.md").read_text()


def test_python_snippet_runs_as_written(tmp_path):
    require_cora()
    text = _readme()
    prepare = re.search(r"^python -m ooc\.prepare planetoid .*$", text, re.M).group(0)
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    # the README's paths are relative to the project root, where ../shared lies beside it
    root = tmp_path / "proj"
    root.mkdir()
    (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    r = subprocess.run(prepare, shell=True, cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (root / "snippet.py").write_text(snippet)
    r = subprocess.run([sys.executable, "snippet.py"], cwd=root, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    acc = float(re.search(r"test accuracy ([0-9.]+)", r.stdout).group(1))
    assert acc > 0.7, r.stdout
    assert list((root / "ckpt").glob("*.pt")), "no checkpoint written"
    assert not list((root / "data" / "cora" / "runtime").glob("run*")), "runtime files left"
