"""The README's Python snippet runs as written, after the README's own Planetoid command."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, require_cora


def _readme() -> str:
    return (REPO / "README.md").read_text()


def test_python_snippets_run_as_written(tmp_path):
    """Each ```python block of the README, in order, in the project folder the README's
    commands assume: the trainer, ooc.NodeLoader with a stock GraphSAGE, PyG's loader."""
    require_cora()
    text = _readme()
    prepare = re.search(r"^python -m ooc\.prepare planetoid .*$", text, re.M).group(0)
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(snippets) >= 3
    # the README's paths are relative to the project root, where ../shared lies beside it
    root = tmp_path / "proj"
    root.mkdir()
    (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    r = subprocess.run(prepare, shell=True, cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = []
    for k, snippet in enumerate(snippets):
        (root / f"snippet{k}.py").write_text(snippet)
        r = subprocess.run([sys.executable, f"snippet{k}.py"], cwd=root, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (k, r.stderr[-3000:])
        out.append(r.stdout)
    acc = float(re.search(r"test accuracy ([0-9.]+)", out[0]).group(1))
    hit = float(re.search(r"feature cache hit ratio ([0-9.]+)", out[1]).group(1))
    assert 0 < hit <= 1
    assert acc > 0.7, out[0]
    assert list((root / "ckpt").glob("*.pt")), "no checkpoint written"
    assert not list((root / "data" / "cora" / "runtime").glob("run*")), "runtime files left"
