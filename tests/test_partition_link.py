"""Partitions that link the source's feature file (``ooc.partition --features link``)
instead of copying their rows: the same rows by node id, the same batches and inference
outputs as copied partitions, and a one-line error when the linked file is gone or
changed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_batches
from test_partition import _check_partitions

from ooc.core.errors import DatasetError
from ooc.partition import partition_dataset
from ooc.partition.__main__ import main
from ooc.storage import csc_from_edges, open_dataset, write_dataset
from ooc.storage.dataset import FEATURE_LINK, ROW_MAP_FILE


def _community_graph(tmp_path: Path, reorder: str) -> tuple[Path, np.ndarray]:
    """2,400 nodes in 100 communities hidden by an id permutation, 32 float32 dims (128 B
    rows, 32 a page), written in node order or in a locality order."""
    rng = np.random.default_rng(3)
    n, size = 2400, 24
    comm = np.arange(n) // size
    src = rng.integers(0, n, 12 * n)
    dst = comm[src] * size + rng.integers(0, size, src.size)
    perm = rng.permutation(n)
    indptr, indices = csc_from_edges(perm[src], perm[dst], n)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    path = write_dataset(tmp_path / f"d_{reorder}", indptr, indices, x, rng.integers(0, 3, n),
                         np.arange(0, n, 2), np.arange(1, n, 4), np.arange(3, n, 4),
                         num_classes=3, reorder=reorder)
    return path, x


@pytest.fixture(scope="module", params=["none", "locality"])
def linked(request, tmp_path_factory):
    """A source (node order or locality order) partitioned twice: rows copied and linked."""
    tmp = tmp_path_factory.mktemp(f"link_{request.param}")
    path, x = _community_graph(tmp, request.param)
    reports = {how: partition_dataset(path, tmp / how, 3, "spring", features=how)
               for how in ("copy", "link")}
    return path, x, tmp, reports


def test_linked_partitions_hold_no_feature_rows_and_read_the_sources(linked):
    """Every invariant of a partition holds (each node's row read by node id among them);
    a linked partition has no features.bin, maps its nodes to the source's rows and says
    where that file is, relative to itself and absolute."""
    path, x, tmp, reports = linked
    assert reports["link"]["features"] == "link" and reports["copy"]["features"] == "copy"
    _check_partitions(path, tmp / "link", reports["link"])
    source = open_dataset(path)
    for q in range(3):
        part = tmp / "link" / f"part_{q:03d}"
        assert not (part / "features.bin").exists()
        d = open_dataset(part, verify=True)
        link = d.meta[FEATURE_LINK]
        assert d.meta["feature_order"] == {"kind": "linked"}
        assert (part / link["path"]).resolve() == source.features_file.resolve()
        assert Path(link["abs_path"]) == source.features_file.resolve()
        assert link["num_rows"] == source.num_nodes
        gids = np.load(part / "global_ids.npy")
        want = gids if source.row_of is None else np.asarray(source.row_of)[gids]
        np.testing.assert_array_equal(np.asarray(d.row_of), want)
        assert d.file_layout.num_rows == source.num_nodes and d.layout.num_rows == d.num_nodes
        copied = tmp / "copy" / f"part_{q:03d}"
        assert d.disk_bytes() < open_dataset(copied).disk_bytes() - d.num_nodes * 128 // 2


def test_the_direct_reader_reads_a_linked_partition_by_node_id(linked):
    """The O_DIRECT feature reader over the linked file, addressed through the row map."""
    from ooc.storage.direct import DirectFeatures

    _, x, tmp, _ = linked
    for q in range(3):
        d = open_dataset(tmp / "link" / f"part_{q:03d}")
        gids = np.load(d.path / "global_ids.npy")
        ids = np.random.default_rng(q).permutation(d.num_nodes)
        with DirectFeatures(d.features_file, d.file_layout) as f:
            np.testing.assert_array_equal(d.by_node(f).read(ids), x[gids[ids]])


@pytest.mark.parametrize("preset", ["ooc", "static", "baseline"])
def test_a_loader_gives_the_same_batches_from_linked_and_copied_rows(linked, preset):
    """NodeLoader batches (n_id, x, y, edges) over a linked partition are those over the
    copied one, for each preset's readers and caches."""
    import ooc

    _, x, tmp, _ = linked
    d_copy, d_link = (open_dataset(tmp / how / "part_001") for how in ("copy", "link"))
    gids = np.load(d_link.path / "global_ids.npy")
    out = []
    for ds in (d_copy, d_link):
        with ooc.NodeLoader(ds, num_neighbors=[4, 3], batch_size=64, input_nodes="train",
                            shuffle=True, preset=preset, seed=5, superbatch_size=3) as loader:
            out.append([list(loader) for _ in range(2)])
    assert_same_batches(*out, lambda ids: x[gids[ids]])


@pytest.mark.parametrize("aggregate", ["blocks", "streamed"])
def test_inference_over_a_linked_partition_equals_the_copied(linked, tmp_path, aggregate):
    """Layer-wise inference writes the same rows over a linked partition as over the
    copied one, by blocks and streamed."""
    import torch

    from ooc.executor.inference.layerwise import layerwise_inference, read_embeddings
    from ooc.executor.training.models import build_model

    _, _, tmp, _ = linked
    torch.manual_seed(0)
    model = build_model("sage", 32, 16, 3, num_layers=2)
    outs = []
    for how in ("copy", "link"):
        z = tmp_path / f"{how}.zarr"
        layerwise_inference(open_dataset(tmp / how / "part_002"), model, z, chunk_rows=64,
                            aggregate=aggregate)
        outs.append(read_embeddings(z, "h2"))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


def test_a_linked_partition_follows_its_source_when_both_move(linked, tmp_path):
    """Moved with its source (the relative path) or alone (the absolute path), a linked
    partition opens and reads its rows."""
    path, x, tmp, _ = linked
    both = tmp_path / "both"
    both.mkdir()
    shutil.copytree(path, both / path.name)
    shutil.copytree(tmp / "link", both / "link")
    d = open_dataset(both / "link" / "part_000")
    assert d.features_file.resolve() == (both / path.name / "features.bin").resolve()
    gids = np.load(d.path / "global_ids.npy")
    np.testing.assert_array_equal(d.features.read(np.arange(d.num_nodes)), x[gids])
    shutil.copytree(tmp / "link" / "part_000", tmp_path / "alone")
    d = open_dataset(tmp_path / "alone")
    assert d.features_file.resolve() == (path / "features.bin").resolve()


def test_a_missing_or_changed_linked_file_is_refused_naming_it(tmp_path, capsys):
    """The linked file gone: a one-line error naming it and what reads it (exit 2 from a
    CLI); the same size with other bytes: its sampled checksum names it."""
    from ooc.train import main as train_main

    path, _ = _community_graph(tmp_path, "locality")
    assert main(["--data", str(path), "--parts", "2", "--out", str(tmp_path / "p"),
                 "--features", "link", "--quiet"]) == 0
    part = tmp_path / "p" / "part_000"
    moved = tmp_path / "elsewhere.bin"
    (path / "features.bin").rename(moved)
    with pytest.raises(DatasetError, match=r"features\.bin: missing: .*part_000 reads its "
                                           r"feature rows from this file"):
        open_dataset(part)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_main(["--data", str(part), "--epochs", "1", "--fanouts", "3,3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path / 'features.bin'}: missing" in err[0], err
    size = moved.stat().st_size
    (path / "features.bin").write_bytes(np.random.default_rng(0).bytes(size))
    with pytest.raises(DatasetError, match=r"features\.bin: checksum of sampled pages does "
                                           r"not match"):
        open_dataset(part)


def test_a_damaged_link_is_refused(tmp_path):
    """A row map entry past the linked file's rows, or a repeated one, is refused naming the
    row map; a link without its fields names meta.json."""
    from ooc.storage.dataset import meta_checksum

    path, _ = _community_graph(tmp_path, "none")
    partition_dataset(path, tmp_path / "p", 2, "spring", features="link")
    part = tmp_path / "p" / "part_000"
    meta = json.loads((part / "meta.json").read_text())
    del meta["files"][ROW_MAP_FILE]["sha256"]
    meta["checksum"] = meta_checksum(meta)
    (part / "meta.json").write_text(json.dumps(meta))
    good = np.load(part / ROW_MAP_FILE)
    for at, bad in ((0, 2400), (1, int(good[0]))):  # past the file's rows; a repeat
        rows = good.copy()
        rows[at] = bad
        np.save(part / ROW_MAP_FILE, rows)
        with pytest.raises(DatasetError, match=rf"{ROW_MAP_FILE}: entry {at} \({bad}\) is out of "
                                               rf"range or repeated: not distinct rows of the "
                                               rf"linked file's 2400"):
            open_dataset(part)
    np.save(part / ROW_MAP_FILE, good)
    del meta[FEATURE_LINK]["abs_path"]
    meta["checksum"] = meta_checksum(meta)
    (part / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"meta\.json: field 'features_link' must hold"):
        open_dataset(part)


def test_a_partition_of_a_linked_partition_links_the_first_source(linked, tmp_path):
    """Partitioning a linked partition again links the file it reads (the first source's),
    with rows mapped through both."""
    path, x, tmp, _ = linked
    part = tmp / "link" / "part_000"
    partition_dataset(part, tmp_path / "again", 2, "spring", features="link")
    gids1 = np.load(part / "global_ids.npy")
    for q in range(2):
        d = open_dataset(tmp_path / "again" / f"part_{q:03d}")
        assert d.features_file.resolve() == (path / "features.bin").resolve()
        gids2 = np.load(d.path / "global_ids.npy")
        np.testing.assert_array_equal(d.features.read(np.arange(d.num_nodes)),
                                      x[gids1[gids2]])


def test_bad_features_option_exits_2(tmp_path, capsys):
    path, _ = _community_graph(tmp_path, "none")
    with pytest.raises(SystemExit) as e:
        main(["--data", str(path), "--parts", "2", "--out", str(tmp_path / "p"),
              "--features", "symlink"])
    assert e.value.code == 2
    assert "--features" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
