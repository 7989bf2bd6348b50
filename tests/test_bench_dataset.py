"""The benchmark tools' dataset folder: a dataset they did not make is used as it is and
never overwritten; a folder that is not a dataset is refused."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import bench  # noqa: E402  (tools/bench.py)

from ooc.storage.ingest import generate_synthetic  # noqa: E402

SPEC = dict(bench.DEFAULT_DATASET, nodes=300, feature_dim=8, avg_degree=3.0,
            train_fraction=0.1, community_size=None, reorder="auto")


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_dataset_made_elsewhere_is_used_as_it_is(tmp_path):
    d = generate_synthetic(tmp_path / "mine", nodes=200, avg_degree=4, feature_dim=16,
                           progress=False)
    before = _digest(d)
    assert bench.ensure_dataset(d, SPEC) == d
    assert _digest(d) == before and not (d / "bench_spec.json").exists()


def test_a_folder_that_is_not_a_dataset_is_refused(tmp_path):
    f = tmp_path / "notes"
    f.mkdir()
    (f / "todo.txt").write_text("keep me")
    assert bench.ensure_dataset(f, SPEC) is None
    assert [p.name for p in f.iterdir()] == ["todo.txt"]


def test_its_own_dataset_is_reused_or_made_again(tmp_path):
    d = tmp_path / "b"
    assert bench.ensure_dataset(d, SPEC) == d
    assert json.loads((d / "bench_spec.json").read_text()) == SPEC
    stamp = (d / "features.bin").stat().st_mtime_ns
    assert bench.ensure_dataset(d, SPEC) == d
    assert (d / "features.bin").stat().st_mtime_ns == stamp  # reused
    other = dict(SPEC, feature_dim=4)
    assert bench.ensure_dataset(d, other) == d
    from ooc.storage import open_dataset

    assert open_dataset(d).feature_dim == 4
    assert np.asarray(open_dataset(d).train_idx).size > 0
