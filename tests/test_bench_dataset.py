"""The benchmarks' cached dataset factory (bench.data.synthetic): a dataset it did not make
is used as it is and never overwritten; a folder that is not a dataset is refused."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from bench import data
from bench.modes import DEFAULT_DATASET
from ooc.storage.ingest import generate_synthetic

SPEC = dict(DEFAULT_DATASET, nodes=300, feature_dim=8, avg_degree=3.0,
            train_fraction=0.1, community_size=None, reorder="auto")


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_dataset_made_elsewhere_is_used_as_it_is(tmp_path):
    d = generate_synthetic(tmp_path / "mine", nodes=200, avg_degree=4, feature_dim=16,
                           progress=False)
    before = _digest(d)
    assert data.synthetic(SPEC, d) == d
    assert _digest(d) == before and not (d / "bench_spec.json").exists()


def test_a_folder_that_is_not_a_dataset_is_refused(tmp_path):
    f = tmp_path / "notes"
    f.mkdir()
    (f / "todo.txt").write_text("keep me")
    assert data.synthetic(SPEC, f) is None
    assert [p.name for p in f.iterdir()] == ["todo.txt"]


def test_its_own_dataset_is_reused_or_made_again(tmp_path):
    d = tmp_path / "b"
    assert data.synthetic(SPEC, d) == d
    assert json.loads((d / "bench_spec.json").read_text()) == SPEC
    stamp = (d / "features.bin").stat().st_mtime_ns
    assert data.synthetic(SPEC, d) == d
    assert (d / "features.bin").stat().st_mtime_ns == stamp  # reused
    other = dict(SPEC, feature_dim=4)
    assert data.synthetic(other, d) == d
    from ooc.storage import open_dataset

    assert open_dataset(d).feature_dim == 4
    assert np.asarray(open_dataset(d).train_idx).size > 0
