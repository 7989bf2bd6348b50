"""Shared fixtures: small datasets built in temp folders."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.storage import csc_from_edges, write_dataset

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CORA_RAW = SHARED / "data" / "planetoid" / "Cora" / "raw"


def random_graph(n: int, e: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random directed edges (src, dst), int64 [e] each."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, e), rng.integers(0, n, e)


@pytest.fixture
def small_dataset(tmp_path: Path):
    """A 500-node random graph with 64-dim float32 features and 4 classes.

    Returns (path, arrays) where arrays holds the in-memory reference copies.
    """
    n, d = 500, 64
    src, dst = random_graph(n, 4000, seed=1)
    indptr, indices = csc_from_edges(src, dst, n)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, 4, n)
    perm = rng.permutation(n)
    arrays = dict(indptr=indptr, indices=indices, features=x, labels=y,
                  train_idx=np.sort(perm[:300]), val_idx=np.sort(perm[300:400]),
                  test_idx=np.sort(perm[400:]))
    path = write_dataset(tmp_path / "small", num_classes=4, **arrays)
    return path, arrays
