"""``ooc.prepare verify DATASET``: every page against its checksum, every id in range, every
feature row finite; the first problem in one line (exit 2), else a summary (exit 0)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, community_graph, nan_in_an_unsampled_row

from ooc.core.errors import DatasetError
from ooc.storage import open_dataset
from ooc.storage.dataset import INDEX_BLOCK, block_crc32s, meta_checksum, sampled_pages, sampled_sha256
from ooc.storage.layout import PAGE
from ooc.storage.verify import verify_dataset

REPO = Path(__file__).resolve().parents[1]


def _verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ooc.prepare", "verify", str(path),
                           "--no-progress"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def _record(path: Path, name: str, blocks: bool = True) -> None:
    """Record ``name``'s current bytes in meta.json (its sampled checksum, and its block
    checksums unless ``blocks`` is False: then they are dropped, as an older ooc wrote
    it), as if a corruption had happened before the dataset was written."""
    mp = path / "meta.json"
    meta = json.loads(mp.read_text())
    entry = meta["files"][name]
    entry["sampled_sha256"] = sampled_sha256(path / name, entry["bytes"])
    if blocks:
        entry["block_crc32"] = block_crc32s(path / name, entry["bytes"])
    else:
        entry.pop("block_crc32", None)
    meta["checksum"] = meta_checksum(meta)
    mp.write_text(json.dumps(meta))


def _unsampled_page(f: Path) -> int:
    sampled = set(sampled_pages(f.stat().st_size).tolist())
    return next(p for p in range(f.stat().st_size // PAGE) if p not in sampled)


@pytest.fixture
def graph(tmp_path) -> Path:
    return community_graph(tmp_path / "g", n=20_000)  # 157 pages of features


def test_every_file_of_a_written_dataset_is_covered(graph):
    """The writer records page checksums of every file a full sha256 does not cover."""
    meta = open_dataset(graph).meta
    for name, entry in meta["files"].items():
        assert "sha256" in entry or "block_crc32" in entry, name
    assert len(meta["files"]["features.bin"]["block_crc32"]) == \
        -(-meta["files"]["features.bin"]["bytes"] // INDEX_BLOCK)


def test_a_sound_dataset_verifies(graph):
    p = _verify(graph)
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip()
    assert line.startswith(f"{graph}: verified 7 files, ") and "20,000 feature rows finite" in line
    assert "without page checksums" not in line


def test_verify_writes_its_report_and_never_one_inside_the_dataset(graph, tmp_path):
    report = tmp_path / "v.json"
    p = subprocess.run([sys.executable, "-m", "ooc.prepare", "verify", str(graph),
                        "--no-progress", "--report", str(report)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(report.read_text())
    assert doc["ooc_report"] == "ooc.prepare verify"
    assert doc["files"] == 7 and doc["rows"] == 20_000 and doc["uncovered"] == []
    assert doc["bytes"] == sum((graph / name).stat().st_size
                               for name in open_dataset(graph).meta["files"])
    inside = graph / "v.json"
    p = subprocess.run([sys.executable, "-m", "ooc.prepare", "verify", str(graph),
                        "--no-progress", "--report", str(inside)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and not inside.exists()
    assert_one_line_error(p.stderr, str(inside))


def test_an_edited_feature_page_outside_the_sample_is_found(graph):
    f = graph / "features.bin"
    page = _unsampled_page(f)
    x = np.memmap(f, dtype=np.float32, mode="r+")
    x[page * PAGE // 4 + 3] = 1e6
    x.flush()
    del x
    open_dataset(graph)  # the cheap checks cannot see it
    p = _verify(graph)
    assert p.returncode == 2
    first = page * PAGE // INDEX_BLOCK * INDEX_BLOCK
    assert_one_line_error(p.stderr, f"{f}: bytes {first}..", "do not match their checksum in "
                                    "meta.json (corrupted file)")


def test_an_in_range_edit_of_indices_is_found(graph):
    f = graph / "indices.bin"
    page = _unsampled_page(f)
    ids = np.memmap(f, dtype=np.int32, mode="r+")
    ids[page * PAGE // 4] = (ids[page * PAGE // 4] + 1) % 20_000
    ids.flush()
    del ids
    open_dataset(graph)
    p = _verify(graph)
    assert p.returncode == 2
    assert_one_line_error(p.stderr, f"{f}: bytes ", "do not match their checksum")


def test_a_nan_row_is_named_by_its_node(tmp_path):
    """A NaN recorded in the checksums (there before the dataset was written) is still
    found, by its node; so it is in a dataset an older ooc wrote without page checksums,
    whose summary says so."""
    path, node = nan_in_an_unsampled_row(tmp_path / "g")
    _record(path, "features.bin")
    p = _verify(path)
    assert p.returncode == 2
    assert_one_line_error(p.stderr, f"{path}/features.bin: the row of node {node} (row {node} "
                                    f"of the file) holds NaN or infinite values")
    _record(path, "features.bin", blocks=False)
    with pytest.raises(DatasetError, match=f"the row of node {node} "):
        verify_dataset(path, progress=False)
    x = np.memmap(path / "features.bin", dtype=np.float32, mode="r+")
    x[node * 1024 + 5] = 0.0
    x.flush()
    del x
    _record(path, "features.bin", blocks=False)
    p = _verify(path)
    assert p.returncode == 0, p.stderr
    assert "features.bin without page checksums (written by an older ooc" in p.stdout


def test_a_nan_row_of_a_reordered_dataset_is_named_by_its_node(tmp_path):
    """Rows stored in a locality order: the node named is the one whose row holds it."""
    from conftest import random_graph

    from ooc.storage import csc_from_edges, write_dataset

    n = 3000
    src, dst = random_graph(n, 20 * n)
    x = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)
    path = write_dataset(tmp_path / "r", *csc_from_edges(src, dst, n), x, reorder="locality")
    ds = open_dataset(path)
    node = 1234
    row = int(ds.row_of[node])
    assert row != node
    mm = np.memmap(path / "features.bin", dtype=np.float32, mode="r+")
    mm[int(ds.layout.row_offsets(np.array([row]))[0]) // 4 + 2] = np.inf
    mm.flush()
    del mm
    _record(path, "features.bin")
    with pytest.raises(DatasetError, match=f"the row of node {node} \\(row {row} of the file\\)"):
        verify_dataset(path, progress=False)
