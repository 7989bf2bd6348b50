"""Layer-wise inference equals the in-memory full-graph forward pass."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CORA_RAW, require_cora

from ooc.caches.chunk_cache import ChunkCache, simulate
from ooc.executor.inference.layerwise import (
    SAFETY_BYTES,
    compute_order,
    layerwise_inference,
    partial_path,
    plan_memory,
    read_embeddings,
)
from ooc.executor.training.models import build_model
from ooc.storage import OocError, csc_from_edges, open_dataset, write_dataset

TOL = 1e-4


def _edge_index(indptr: np.ndarray, indices: np.ndarray) -> torch.Tensor:
    dst = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return torch.from_numpy(np.stack([np.asarray(indices, dtype=np.int64), dst]))


def _reference(model, x: np.ndarray, indptr, indices) -> list[np.ndarray]:
    """Every layer's output of the in-memory full-graph pass (eval mode)."""
    model.eval()
    outs = []
    with torch.no_grad():
        h = torch.from_numpy(np.asarray(x, dtype=np.float32))
        ei = _edge_index(indptr, indices)
        for l in range(model.num_layers):
            h = model.layer(l, h, ei)
            outs.append(h.numpy().copy())
        full = model(torch.from_numpy(np.asarray(x, dtype=np.float32)), ei).numpy()
    assert np.abs(full - outs[-1]).max() < 1e-5  # forward == layer(0..L-1)
    return outs


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A 2,000-node skewed random graph with self loops and duplicate edges."""
    rng = np.random.default_rng(7)
    n, e, d = 2000, 16000, 24
    src = (rng.pareto(1.5, e) * 50).astype(np.int64) % n   # skewed out-degrees
    dst = rng.integers(0, n, e)
    src[:40] = dst[:40]                                      # self loops
    src[40:80], dst[40:80] = src[80:120], dst[80:120]        # duplicates
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, 5, n)
    path = write_dataset(tmp_path_factory.mktemp("synth") / "ds", indptr, indices, x, labels=y,
                         num_classes=5, train_idx=np.arange(0, 1000),
                         val_idx=np.arange(1000, 1500), test_idx=np.arange(1500, 2000))
    return open_dataset(path), x


def _cora_arrays(tmp: Path):
    from torch_geometric.datasets import Planetoid

    root = tmp / "planetoid"
    shutil.copytree(CORA_RAW, root / "Cora" / "raw")
    data = Planetoid(str(root), "Cora")[0]
    n = data.num_nodes
    ei = data.edge_index.numpy()
    indptr, indices = csc_from_edges(ei[0], ei[1], n)
    return dict(indptr=indptr, indices=indices, features=data.x.numpy(), labels=data.y.numpy(),
                train_idx=np.flatnonzero(data.train_mask.numpy()),
                val_idx=np.flatnonzero(data.val_mask.numpy()),
                test_idx=np.flatnonzero(data.test_mask.numpy()))


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    require_cora()
    tmp = tmp_path_factory.mktemp("cora")
    a = _cora_arrays(tmp)
    path = write_dataset(tmp / "cora", num_classes=7, **a)
    return open_dataset(path), a["features"]


def _check(ds, x, model, out, **kw):
    ref = _reference(model, x, ds.indptr, np.asarray(ds.indices))
    rep = layerwise_inference(ds, model, out, keep_layers=True, **kw)
    for l, r in enumerate(ref):
        h = read_embeddings(out, f"h{l + 1}")
        assert h.shape == r.shape
        assert np.abs(h - r).max() < TOL, f"layer {l + 1}: {np.abs(h - r).max()}"
    return rep, ref


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_synthetic_matches_full_forward(synth, tmp_path, kind):
    ds, x = synth
    torch.manual_seed(0)
    model = build_model(kind, x.shape[1], 32, 5, num_layers=3)
    rep, ref = _check(ds, x, model, tmp_path / "out.zarr", chunk_rows=128, block_rows=50,
                      cache_chunks=8, aggregate="blocks")
    assert rep["num_chunks"] == 16
    later = [la for la in rep["layers"] if la["layer"] > 1]
    assert all(la["reads"]["mode"] == "chunks" for la in later)   # fewer bytes than rows here
    assert all(la["cache"]["evictions"] + la["cache"]["bypasses"] > 0 for la in later)
    assert all(la["blocks"] > rep["num_chunks"] for la in rep["layers"])
    # predictions and accuracy
    pred = read_embeddings(tmp_path / "out.zarr", "pred")
    np.testing.assert_array_equal(pred, ref[-1].argmax(1))
    labels = np.asarray(ds.labels)
    expect = float((ref[-1].argmax(1)[ds.test_idx] == labels[ds.test_idx]).mean())
    assert rep["test_accuracy"] == pytest.approx(expect)


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_cora_matches_full_forward_with_budget(cora, tmp_path, kind):
    ds, x = cora
    torch.manual_seed(1)
    model = build_model(kind, x.shape[1], 16, 7, num_layers=2)
    rep, _ = _check(ds, x, model, tmp_path / "cora.zarr", chunk_rows=256, block_rows=64,
                    cache_chunks=2, memory_budget="3GiB", aggregate="blocks")
    assert rep["num_chunks"] == 11
    assert rep["layers"][1]["cache"]["misses"] > rep["layers"][1]["cache"]["capacity_chunks"]
    assert rep["within_budget"]
    assert 0.0 <= rep["test_accuracy"] <= 1.0


def test_plan_memory_splits_the_budget():
    mib = 1 << 20
    cap, work = plan_memory(600 * mib, 400 * mib, 1000, 64, 32, True)
    free = 600 * mib - 400 * mib - 2 * 1000 * 32 * 4 - SAFETY_BYTES
    assert cap == int(free * 0.5) // (1000 * 64 * 4)
    assert cap * 1000 * 64 * 4 + work <= free
    assert plan_memory(600 * mib, 400 * mib, 1000, 64, 32, False)[0] == 0
    assert plan_memory(600 * mib, 400 * mib, 1000, 64, 32, True, cache_chunks=3)[0] == 3
    with pytest.raises(OocError, match="too small"):
        plan_memory(400 * mib, 390 * mib, 1000, 64, 32, True)


def test_sized_from_budget_stays_within_it(synth, tmp_path):
    """Without explicit sizes a tight budget gives small blocks and a bounded cache."""
    import psutil

    ds, x = synth
    torch.manual_seed(2)
    model = build_model("sage", x.shape[1], 512, 5, num_layers=3)
    ref = _reference(model, x, ds.indptr, np.asarray(ds.indices))
    # a first run loads what every run holds (compiled kernels, the readers' libraries), so
    # the budget's 96 MiB above it are what the layers get
    layerwise_inference(ds, model, tmp_path / "warm.zarr", chunk_rows=128, progress=False)
    budget = psutil.Process().memory_info().rss + 96 * (1 << 20)
    out = tmp_path / "b.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=128, memory_budget=budget)
    assert np.abs(read_embeddings(out, "h3") - ref[-1]).max() < TOL
    for la in rep["layers"]:
        c = la["cache"] or {"capacity_chunks": 0, "chunk_bytes": 0}
        assert la["work_bytes"] + c["capacity_chunks"] * c["chunk_bytes"] \
            < budget - la["rss_at_start"]
        assert la["sub_costs"]["measured"]  # the layer's memory was measured, not guessed
    assert rep["within_budget"], (rep["peak_rss_bytes"], budget)
    with pytest.raises(OocError, match="too small"):
        layerwise_inference(ds, model, tmp_path / "c.zarr", memory_budget="64MiB")


@pytest.mark.parametrize("order", ["degree", "pds", "locality", "lru", "fifo"])
def test_orders_and_policies_agree(synth, tmp_path, order):
    ds, x = synth
    torch.manual_seed(3)
    model = build_model("gcn", x.shape[1], 16, 5, num_layers=2)
    kw = dict(chunk_rows=200, block_rows=64, cache_chunks=6)
    if order == "pds":
        kw["order"] = np.random.default_rng(0).integers(0, 4, ds.num_nodes)
    elif order in ("degree", "locality"):
        kw["order"] = order
    else:
        kw["policy"] = order
    rep, _ = _check(ds, x, model, tmp_path / "o.zarr", **kw)
    if order in ("degree", "pds", "locality"):
        assert rep["order"] == order
        import zarr

        assert "row_of_node" in zarr.open_group(str(tmp_path / "o.zarr"), mode="r")
    else:
        assert rep["layers"][1]["cache"]["policy"] == order


@pytest.mark.parametrize("cap,mode", [(16, "chunks"), (0, "rows")])
def test_layer0_reads_rows_or_chunks(synth, tmp_path, cap, mode):
    """Layer 0 reads feature pages per block or whole chunks through the
    cache, whichever the plan says is fewer bytes; both are exact."""
    ds, x = synth
    torch.manual_seed(5)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    rep, _ = _check(ds, x, model, tmp_path / "l0.zarr", chunk_rows=128, block_rows=64,
                    cache_chunks=cap, order="degree", aggregate="blocks")
    l0 = rep["layers"][0]
    assert l0["reads"]["mode"] == mode
    if mode == "chunks":
        assert l0["chunk_reads"] == 16 and l0["cache"]["hits"] > 0


def test_pds_order_is_partition_then_degree(synth):
    ds, _ = synth
    owner = np.random.default_rng(1).integers(0, 3, ds.num_nodes)
    perm, name = compute_order(ds, "auto", partition=owner)
    assert name == "pds"
    deg = ds.in_degrees()[perm]
    assert np.all(np.diff(owner[perm]) >= 0)
    for p in range(3):
        d = deg[owner[perm] == p]
        assert np.all(np.diff(d) <= 0)
    assert compute_order(ds, "auto")[1] == "natural"
    with pytest.raises(OocError, match="partitioning"):
        compute_order(ds, "pds")


def test_resume_after_crash_gives_same_arrays(synth, tmp_path):
    ds, x = synth
    torch.manual_seed(4)
    model = build_model("gcn", x.shape[1], 16, 5, num_layers=3)
    kw = dict(chunk_rows=128, block_rows=40, cache_chunks=3, keep_layers=True)
    full = tmp_path / "full.zarr"
    layerwise_inference(ds, model, full, **kw)

    class Crash(Exception):
        pass

    def crash_at(layer, chunk):
        def hook(l, c):
            if l == layer and c == chunk:
                raise Crash
        return hook

    out = tmp_path / "crash.zarr"
    with pytest.raises(Crash):
        layerwise_inference(ds, model, out, on_chunk=crash_at(1, 5), **kw)
    assert not out.exists()  # only the partial folder, under another name
    prog = json.loads((partial_path(out) / "progress.json").read_text())
    assert prog["layers_done"] == 1 and prog["chunks_done"] == 6
    seen = []
    rep = layerwise_inference(ds, model, out, on_chunk=lambda l, c: seen.append((l, c)), **kw)
    assert rep["resumed"] and rep["resumed_chunks"] == 16 + 6
    assert seen[0] == (1, 6) and len(seen) == 10 + 16
    assert not partial_path(out).exists()
    for name in ("h1", "h2", "h3", "pred"):
        np.testing.assert_array_equal(read_embeddings(out, name), read_embeddings(full, name))
    # a finished run resumes to a no-op
    rep = layerwise_inference(ds, model, out, **kw)
    assert rep["resumed_chunks"] == 48
    # another model does not resume someone else's output
    other = build_model("gcn", x.shape[1], 16, 5, num_layers=3)
    with pytest.raises(OocError, match="already exists"):
        layerwise_inference(ds, other, out, **kw)
    layerwise_inference(ds, other, out, overwrite=True, **kw)


def test_belady_beats_lru_and_fifo():
    rng = np.random.default_rng(0)
    seq = np.concatenate([rng.integers(0, 20, 400), np.tile(np.arange(12), 30)])
    res = {p: simulate(seq, 6, p, num_keys=20) for p in ("belady", "lru", "fifo")}
    assert res["belady"]["hits"] >= res["lru"]["hits"]
    assert res["belady"]["hits"] >= res["fifo"]["hits"]
    assert res["belady"]["hits"] > res["lru"]["hits"]  # LRU thrashes on the cyclic part
    # textbook example, 3 frames: OPT 9 faults, LRU 12, FIFO 15; bypassing a
    # chunk used later than everything resident saves one more
    s = np.array([7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1])
    assert simulate(s, 3, "belady")["misses"] == 8
    assert simulate(s, 3, "lru")["misses"] == 12
    assert simulate(s, 3, "fifo")["misses"] == 15
    loads = []
    c = ChunkCache(2, "belady", sequence=np.array([1, 2, 1, 3, 1]), loader=lambda k: loads.append(k) or k)
    assert [c.get(k) for k in (1, 2, 1, 3, 1)] == [1, 2, 1, 3, 1]
    assert loads == [1, 2, 3]
    with pytest.raises(RuntimeError):
        c.get(5)


def _stored_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def test_layers_are_deleted_once_used_unless_kept(synth, tmp_path):
    """By default only the output layer stays (each input goes once the next layer is
    complete, a crash's leftovers on resume too); ``keep_layers`` keeps them all. The
    output layer is the same either way."""
    ds, x = synth
    torch.manual_seed(5)
    model = build_model("sage", x.shape[1], 32, 5, num_layers=3)
    ref = _reference(model, x, ds.indptr, np.asarray(ds.indices))
    kw = dict(chunk_rows=128, cache_chunks=4)
    kept, lean = tmp_path / "kept.zarr", tmp_path / "lean.zarr"
    layerwise_inference(ds, model, kept, keep_layers=True, **kw)
    seen: list[list[str]] = []

    def arrays_now(l, c):  # what the partial output holds while layer l+1 is written
        import zarr
        if c == 0:
            seen.append(sorted(zarr.open_group(str(partial_path(lean)), mode="r").array_keys()))

    rep = layerwise_inference(ds, model, lean, on_chunk=arrays_now, **kw)
    assert not rep["keep_layers"]
    assert seen == [["h1"], ["h1", "h2"], ["h2", "h3"]]  # never three layers at once
    np.testing.assert_array_equal(read_embeddings(lean, "h3"), read_embeddings(kept, "h3"))
    assert np.abs(read_embeddings(lean, "h3") - ref[-1]).max() < TOL
    for name in ("h1", "h2"):
        with pytest.raises(OocError, match=f"{name} was not kept.*keep_layers"):
            read_embeddings(lean, name)
        np.testing.assert_allclose(read_embeddings(kept, name), ref[int(name[1]) - 1], atol=TOL)
    assert _stored_bytes(lean) < _stored_bytes(kept) - x.shape[0] * 32 * 4


def test_float16_layers_halve_the_intermediate_bytes(synth, tmp_path):
    """``layer_dtype="float16"``: the layers before the last are stored (and read back) as
    float16, the output layer stays float32 and within float16's rounding of the exact
    one; an output past float16's range is refused naming the node."""
    ds, x = synth
    torch.manual_seed(6)
    model = build_model("sage", x.shape[1], 32, 5, num_layers=3)
    ref = _reference(model, x, ds.indptr, np.asarray(ds.indices))
    kw = dict(chunk_rows=128, cache_chunks=16, keep_layers=True)  # every chunk read once
    r32 = layerwise_inference(ds, model, tmp_path / "f32.zarr", **kw)
    r16 = layerwise_inference(ds, model, tmp_path / "f16.zarr", layer_dtype="float16", **kw)
    for name in ("h1", "h2"):
        h = read_embeddings(tmp_path / "f16.zarr", name)
        assert h.dtype == np.float16
        np.testing.assert_allclose(h.astype(np.float32), ref[int(name[1]) - 1], rtol=2e-3,
                                   atol=2e-3)
    h3 = read_embeddings(tmp_path / "f16.zarr", "h3")
    assert h3.dtype == np.float32
    scale = np.abs(ref[-1]).max()
    assert np.abs(h3 - ref[-1]).max() < 1e-2 * max(scale, 1.0)
    # layers 2 and 3 read float16 chunks: half the bytes of the float32 run
    for l in (1, 2):  # rows of half the bytes: pages of half, give or take a page per chunk
        assert abs(r16["layers"][l]["bytes_read"] * 2 - r32["layers"][l]["bytes_read"]) \
            <= 2 * 4096 * r32["num_chunks"]
        assert r16["layers"][l]["bytes_read"] < 0.6 * r32["layers"][l]["bytes_read"]
    with torch.no_grad():  # outputs past 65504 cannot be float16
        for p in model.parameters():
            p.mul_(1e3)
    with pytest.raises(OocError, match="past float16's range"):
        layerwise_inference(ds, model, tmp_path / "big.zarr", layer_dtype="float16", **kw)
    with pytest.raises(OocError, match="layer_dtype"):
        layerwise_inference(ds, model, tmp_path / "x.zarr", layer_dtype="bfloat16")


def test_a_disk_too_small_is_refused_before_anything_is_written(synth, tmp_path, monkeypatch):
    ds, x = synth
    model = build_model("sage", x.shape[1], 32, 5, num_layers=3)
    real = shutil.disk_usage

    def small(path):
        u = real(path)
        return type(u)(u.total, u.total - 300_000, 300_000)

    monkeypatch.setattr(shutil, "disk_usage", small)
    n = ds.num_nodes
    for kw, need in [(dict(keep_layers=True), n * (32 * 4 * 2 + 5 * 4 + 8)),  # all, pred
                     (dict(), n * 32 * 4 * 2),  # h1 beside h2 at the fullest
                     (dict(layer_dtype="float16", keep_layers=True), n * (32 * 2 * 2 + 5 * 4 + 8))]:
        out = tmp_path / "o.zarr"
        assert need > 300_000
        with pytest.raises(OocError, match="needs .* of disk, .* is free"):
            layerwise_inference(ds, model, out, chunk_rows=128, **kw)
        assert not out.exists() and not partial_path(out).exists()


@pytest.mark.parametrize("layer_dtype", ["float32", "float16"])
def test_later_layers_read_rows_from_chunk_files(synth, tmp_path, layer_dtype):
    """Without a chunk cache every layer reads the rows its blocks need (a later layer from
    the previous layer's chunk files): the same outputs as the full forward pass, and the
    bytes read are the planned pages."""
    ds, x = synth
    torch.manual_seed(6)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=3)
    out = tmp_path / f"rows-{layer_dtype}.zarr"
    if layer_dtype == "float32":
        rep, _ = _check(ds, x, model, out, chunk_rows=128, block_rows=64, cache_chunks=0,
                        aggregate="blocks")
    else:
        rep = layerwise_inference(ds, model, out, chunk_rows=128, block_rows=64, cache_chunks=0,
                                  layer_dtype="float16", keep_layers=True, aggregate="blocks")
        with torch.no_grad():
            ref = layerwise_inference(ds, model, tmp_path / "cached.zarr", chunk_rows=128,
                                      block_rows=64, cache_chunks=16, layer_dtype="float16",
                                      aggregate="blocks")
        np.testing.assert_array_equal(read_embeddings(out, "h3"),
                                      read_embeddings(tmp_path / "cached.zarr", "h3"))
        assert ref["layers"][2]["reads"]["mode"] == "chunks"
    for la in rep["layers"]:
        assert la["reads"]["mode"] == "rows" and la["cache"] is None
        assert la["bytes_read"] == la["reads"]["planned_row_bytes"] > 0
        # a later layer's rows come through the io_uring reader (this kernel has it)
        assert la["reads"]["backend"] == (None if la["layer"] == 1 else "io_uring")


def test_one_block_reads_rows_and_each_page_once(synth, tmp_path):
    """A layer whose targets fit one block reads the rows it needs (no chunk plan is made:
    whole chunks cannot read less than every needed page once), at most its input table."""
    ds, x = synth
    torch.manual_seed(7)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    rep, _ = _check(ds, x, model, tmp_path / "one.zarr", chunk_rows=128)
    for la, width in zip(rep["layers"], (ds.layout.row_bytes, 16 * 4), strict=True):
        assert la["blocks"] == 1 and la["reads"]["mode"] == "rows"
        assert la["reads"]["planned_chunk_bytes"] is None
        table = ds.layout.file_bytes if la["layer"] == 1 else -(-ds.num_nodes * width // 4096) * 4096
        assert 0 < la["bytes_read"] <= table + 4096 * (ds.num_nodes // 128 + 1)


def _distinct_pages(rows: np.ndarray, chunk_rows: int, row_bytes: int) -> int:
    """Distinct 4 KiB pages of the chunk files holding ``rows`` (an independent count)."""
    from ooc.storage.layout import PAGE
    pages = set()
    for r in rows.tolist():
        c, k = divmod(r, chunk_rows)
        pages.update((c, p) for p in range(k * row_bytes // PAGE,
                                           ((k + 1) * row_bytes - 1) // PAGE + 1))
    return len(pages)


@pytest.mark.parametrize("backend,dtype,dim", [
    ("io_uring", "float32", 100),      # rows of 400 B straddle pages; partial last pages
    ("io_uring", "float16", 256),      # 512 B rows, 8 to a page, cast to float32
    ("preadv", "float32", 1100),       # rows of 4400 B span two or three pages
    ("mmap", "float32", 100),
])
def test_chunk_file_rows_match_the_array(tmp_path, monkeypatch, backend, dtype, dim):
    """ChunkFileRows reads rows in any order across chunk files as zarr does, through the
    named page reader (io_uring here: the test fails rather than fall back), in requests
    of at most READ_PAGES pages that read each page once; a chunk Zarr did not write
    (fill values) reads as zeros; a truncated chunk file is one error."""
    import zarr

    from ooc.core.errors import DatasetError
    from ooc.executor.inference import chunk_rows as CR

    monkeypatch.setattr(CR, "READ_PAGES", 3)   # many requests per chunk, one row over
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1000, dim)).astype(dtype)
    a[256:384] = 0.0                                           # chunk 2: fill values only
    g = zarr.open_group(str(tmp_path / "g"), mode="w")
    arr = g.create_array("h1", shape=a.shape, dtype=dtype, chunks=(128, dim),
                         compressors=None, fill_value=0.0)
    arr[:] = a
    reader = CR.ChunkFileRows(tmp_path / "g" / "h1", 1000, 128, dim, dtype, backend=backend)
    rows = np.concatenate((rng.permutation(1000)[:300], np.arange(100, 140))).astype(np.int64)
    rows = np.unique(rows)[rng.permutation(np.unique(rows).shape[0])]
    out = np.full((rows.shape[0], dim), np.nan, np.float32)
    reader.read(rows, out)
    np.testing.assert_array_equal(out, a[rows].astype(np.float32))
    assert reader.backend_used == backend
    assert not (tmp_path / "g" / "h1" / "c" / "2" / "0").exists()  # all fill: no file
    written = rows[(rows < 256) | (rows >= 384)]
    assert reader.pages == _distinct_pages(written, 128, a.itemsize * dim) > 0
    out[:128] = np.nan
    reader.read(np.arange(256, 384, dtype=np.int64), out[:128])
    assert not out[:128].any()
    f = tmp_path / "g" / "h1" / "c" / "5" / "0"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(DatasetError, match=r"c/5/0: 1000 bytes, a chunk of 128 rows"):
        reader.read(np.array([700], np.int64), out[:1])


def test_chunk_row_requests_read_each_page_once():
    """The request cutter: consecutive rows, at most the limit of pages each (one row over
    alone), cut only where a row begins on an unread page; every row in one request."""
    from ooc.executor.inference.chunk_rows import _groups

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        fresh = rng.random(n) < 0.6
        fresh[0] = True
        new = np.where(fresh, rng.integers(1, 4, n), rng.integers(0, 3, n))
        limit = int(rng.integers(1, 8))
        gs = _groups(fresh, new, limit)
        assert gs[0][0] == 0 and gs[-1][1] == n
        assert all(gs[i][1] == gs[i + 1][0] for i in range(len(gs) - 1))
        cuts = np.flatnonzero(fresh).tolist() + [n]
        for a, z in gs:
            assert z > a and fresh[a]
            inner = [c for c in cuts if a < c < z]
            assert new[a:z].sum() <= limit or not inner   # over the limit: no cut inside
            after = [c for c in cuts if c > z]
            if z < n and after:                            # greedy: the next cut is over
                assert new[a:after[0]].sum() > limit


def test_a_budget_that_forces_extra_reads_is_noted():
    """A layer planned to read its input many times over gets one note naming the budget
    whose chunk cache holds all of it; none when the budget already does."""
    from ooc.core import notes
    from ooc.executor.inference.blocks import Chunking, LayerPlan, note_extra_reads
    from ooc.executor.inference.memory_plan import BlockCosts

    MiB = 1 << 20
    n, d = 100_000, 128                   # a 48.8 MiB input in 13 chunks of 4 MiB
    chunking = Chunking(8192, 13)
    none = np.zeros(0, np.int64)

    def plan(planned, one_block=0):
        return LayerPlan(1, d, d, none, None, None, none, 0, 0, 300 * MiB, False,
                         8192 * d * 4, MiB, BlockCosts(1, 1, 1), one_block,
                         reads={"mode": "rows", "planned_row_bytes": planned,
                                "planned_chunk_bytes": 10 * planned})

    lines: list[str] = []
    notes.reset()
    notes.sink = lines.append
    try:
        note_extra_reads(plan(10 * n * d * 4), 400 * MiB, n, chunking, d * 4, d * 4)
        # rss 300 + outputs 8 + safety 48 + a chunk 4 + 13 chunks twice 104 + margin 32
        assert len(lines) == 1 and "memory_budget 400.0 MiB" in lines[0], lines
        assert "layer 2 reads about 488.3 MiB (10x its input)" in lines[0], lines
        assert "; 496MiB reads it once" in lines[0], lines
        notes.reset()
        note_extra_reads(plan(10 * n * d * 4), 496 * MiB, n, chunking, d * 4, d * 4)
        note_extra_reads(plan(2 * n * d * 4), 400 * MiB, n, chunking, d * 4, d * 4)
        assert len(lines) == 1
        # one block of every node needing 60 MiB: 300 + 8 + 48 + 60 + 32
        note_extra_reads(plan(10 * n * d * 4, 60 * MiB), 400 * MiB, n, chunking, d * 4, d * 4)
        assert len(lines) == 2 and "; 448MiB reads it once" in lines[1], lines
    finally:
        notes.sink = None
        notes.reset()


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_sub_blocks_of_single_targets_match_full_forward(synth, tmp_path, kind, monkeypatch):
    """Blocks whose targets run through the layer one at a time (each on its own local graph,
    a GCN target with its self loop and full-graph weights) give the full forward pass."""
    from ooc.executor.inference import blocks

    monkeypatch.setattr(blocks, "SUB_SHARE", 1e-12)  # a sub-block of one byte: one target
    ds, x = synth
    torch.manual_seed(11)
    model = build_model(kind, x.shape[1], 16, 5, num_layers=2)
    rep, _ = _check(ds, x, model, tmp_path / "sub.zarr", chunk_rows=300, block_rows=700,
                    aggregate="blocks")
    for la in rep["layers"]:
        assert la["blocks"] == 3 and la["sub_blocks"] == ds.num_nodes


def test_blocks_span_output_chunks_and_resume_inside_one(synth, tmp_path):
    """A block may cover rows of several output chunks; a run stopped after a chunk in the
    middle of a block resumes from that block and writes the same arrays."""
    ds, x = synth
    torch.manual_seed(12)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    kw = dict(chunk_rows=100, block_rows=450, keep_layers=True, aggregate="blocks")
    ref = tmp_path / "ref.zarr"
    rep = layerwise_inference(ds, model, ref, **kw)
    assert rep["layers"][0]["blocks"] == 5 and rep["num_chunks"] == 20

    def crash(l, c):
        if (l, c) == (1, 6):     # chunk 7 (rows 700..799) is in the block of rows 450..899
            raise RuntimeError("crash")

    out = tmp_path / "out.zarr"
    with pytest.raises(RuntimeError, match="crash"):
        layerwise_inference(ds, model, out, on_chunk=crash, **kw)
    seen: list = []
    layerwise_inference(ds, model, out, on_chunk=lambda l, c: seen.append((l, c)), **kw)
    assert seen == [(1, c) for c in range(7, 20)]
    for name in ("h1", "h2"):
        np.testing.assert_array_equal(read_embeddings(out, name), read_embeddings(ref, name))


def test_measured_costs_find_what_a_layer_allocates():
    """A layer that holds exactly 10 KiB per target and 300 B per edge on top of its input
    is measured at those costs (within the margin), plus the sub-block's own arrays: a
    float32 row per node (its copy) and the int64 edge index."""
    from ooc.executor.inference.memory_plan import PROBE_MARGIN, measure_costs

    d = 64

    def layer(xs, ei, w, nt):
        held = np.ones(nt * 10240 + ei.shape[1] * 300, dtype=np.uint8)  # touched: resident
        return torch.from_numpy(xs.numpy()[:nt] * float(held[-1]))

    c = measure_costs(layer, d, d, False, 1 << 30)
    if c is None:
        pytest.skip("the kernel's peak RSS cannot be reset here (/proc/self/clear_refs)")
    assert c.measured
    assert 10240 <= c.target <= 10240 * PROBE_MARGIN + 4 * d * PROBE_MARGIN + 2048, c
    assert 4 * d <= c.node <= (4 * d + 16) * PROBE_MARGIN + 64, c
    assert 300 + 16 <= c.edge <= (300 + 16 + 8) * PROBE_MARGIN + 16, c


def test_a_locality_stored_datasets_row_map_is_the_orders_inverse(tmp_path):
    """Over a dataset stored in the locality order, the processing order's inverse is the
    dataset's own row map (memory-mapped, not a second array in memory); other orders and
    a dataset whose features lie in node order make their own."""
    from ooc.executor.inference.order import rows_and_nodes, stored_rows

    rng = np.random.default_rng(3)
    n = 900
    indptr, indices = csc_from_edges(rng.integers(0, n, 6000), rng.integers(0, n, 6000), n)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    for reorder in ("locality", "none"):
        ds = open_dataset(write_dataset(tmp_path / reorder, indptr, indices, x,
                                        reorder=reorder))
        for order in ("auto", "locality", "degree", "natural"):
            perm, name = compute_order(ds, order)
            stored = stored_rows(ds, name)
            p, rowof = rows_and_nodes(perm, n, stored)
            assert (stored is not None) == (reorder == "locality" and name == "locality")
            if stored is not None:
                assert rowof is ds.row_of and isinstance(rowof, np.memmap)
            if perm is not None:
                assert p is perm and np.array_equal(rowof[perm], np.arange(n))


def test_orders_hold_int32_ids_and_the_output_keeps_int64(synth, tmp_path):
    """Below 2^31 nodes the processing order and its inverse are int32 (4 bytes a node each,
    not 8); the run's fingerprint digests the ids as int64, as before, and the output's
    ``row_of_node`` stays int64 and inverts the order."""
    import hashlib

    import zarr

    from ooc.executor.inference.order import order_digest, rows_and_nodes

    ds, x = synth
    for order in ("degree", "locality"):
        perm, _ = compute_order(ds, order)
        assert perm.dtype == np.int32
        assert sorted(perm.tolist()) == list(range(ds.num_nodes))
        assert order_digest(perm) == hashlib.sha256(perm.astype(np.int64).tobytes()).hexdigest()[:24]
        p2, rowof = rows_and_nodes(perm, ds.num_nodes)
        assert p2 is perm and rowof.dtype == np.int32
        assert np.array_equal(rowof[perm], np.arange(ds.num_nodes))
    torch.manual_seed(3)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    _check(ds, x, model, tmp_path / "o.zarr", chunk_rows=200, order="degree")
    r = zarr.open_group(str(tmp_path / "o.zarr"), mode="r")["row_of_node"]
    assert r.dtype == np.int64
    perm, _ = compute_order(ds, "degree")
    assert np.array_equal(np.asarray(r[:])[perm], np.arange(ds.num_nodes))


class _NoWidth(torch.nn.Module):
    """A model of the layer-wise protocol that declares no input width (one linear map of
    ``d`` inputs, summed over in-neighbours)."""

    num_layers = 1

    def __init__(self, d: int):
        super().__init__()
        self.lin = torch.nn.Linear(d, 5)

    def layer(self, l, x, edge_index, edge_weight=None):
        h = self.lin(x)
        return h.index_add(0, edge_index[1], h[edge_index[0]])


@pytest.fixture
def no_pass(monkeypatch):
    """A pass over ``indices.bin`` fails the test: the checks run before it."""
    from ooc.storage.dataset import Dataset

    def check_indices(self):
        raise AssertionError("a pass over the graph before the options were checked")

    monkeypatch.setattr(Dataset, "check_indices", check_indices)


@pytest.mark.parametrize("model, needles", [
    (lambda: build_model("sage", 32, 16, 5, num_layers=2),
     ("sage: the model takes 32-dim input rows", "has 24-dim features", "in_dim=24")),
    (lambda: __import__("torch_geometric.nn", fromlist=["GraphSAGE"]).GraphSAGE(32, 16, 2, 5),
     ("GraphSAGE: the model takes 32-dim input rows", "has 24-dim features")),
    (lambda: _NoWidth(32), ("_NoWidth: layer 1 of the model does not take 24-dim input rows",)),
])
def test_a_model_of_another_input_width_is_one_line(synth, tmp_path, no_pass, model, needles):
    """A model built for 32-dim rows over 24-dim features: one ``InvalidValue`` naming both
    widths (from the width the model declares, or from running layer 1 on one row), before
    a pass over the graph and with nothing written (it was a traceback from inside torch)."""
    from ooc.storage import InvalidValue

    ds, _ = synth
    with pytest.raises(InvalidValue) as ei:
        layerwise_inference(ds, model(), tmp_path / "o.zarr", progress=False)
    msg = str(ei.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw, match", [
    (dict(memory_budget="64MiB"), "too small"),
    (dict(order="pds", partition=np.zeros(7, np.int64)), "partition assignment has 7 entries"),
    (dict(order="random"), "unknown order 'random'"),
    (dict(features="garbage"), "features='garbage': choose one of"),
    (dict(features=object()), "has no read"),
    (dict(aggregate="streamed", model="gcn"), "layer 1 cannot stream"),
    (dict(stream_rows=(0, None)), "stream_rows"),
    (dict(model="ckpt"), r"model: ckpt is a path, not a model; ooc.load_model\('ckpt'\)"),
    (dict(out=None), "out: a NoneType, not the output folder"),
])
def test_bad_options_are_refused_before_a_pass(synth, tmp_path, no_pass, kw, match):
    """Each bad option: one ``OocError`` that is a ``ValueError`` before the pass over
    ``indices.bin`` that precedes the order, nothing written."""
    ds, x = synth
    kw = {"out": tmp_path / "o.zarr", **kw}
    kind = kw.pop("model", "sage")
    model = kind if kind == "ckpt" else build_model(kind, x.shape[1], 16, 5, num_layers=2)
    with pytest.raises(OocError, match=match) as ei:
        layerwise_inference(ds, model, progress=False, **kw)
    assert isinstance(ei.value, ValueError) and "\n" not in str(ei.value)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def finished(synth, tmp_path_factory):
    """A finished 2-layer output of ``synth`` in degree order (rows are not node ids),
    every layer kept, and the in-memory reference of its layers."""
    ds, x = synth
    out = tmp_path_factory.mktemp("finished") / "o.zarr"
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    ref = _reference(model, x, ds.indptr, np.asarray(ds.indices))
    layerwise_inference(ds, model, out, order="degree", keep_layers=True, progress=False)
    torch.save(model.state_dict(), out.parent / "model.pt")
    return out, ref


def test_read_embeddings_of_what_is_not_an_output_is_one_line(synth, finished, tmp_path):
    """``read_embeddings`` on a missing path, a dataset folder, a file, a folder of the
    user's and an unfinished output: one line saying what it is and what to pass."""
    from ooc.storage import InvalidValue, NotFound

    ds, _ = synth
    out, _ = finished
    (tmp_path / "mine").mkdir()
    part = tmp_path / "part.zarr"
    shutil.copytree(out, part)
    meta = json.loads((part / "zarr.json").read_text())
    meta["attributes"]["complete"] = False
    (part / "zarr.json").write_text(json.dumps(meta))
    for path, err, needle in (
        (tmp_path / "nope.zarr", NotFound, "nope.zarr: not found"),
        (ds.path, InvalidValue, "is an ooc dataset, not an inference output; pass the --out "
                                "folder of ooc.infer"),
        (ds.path / "meta.json", InvalidValue, "meta.json: is a file, not an inference output"),
        (tmp_path / "mine", InvalidValue, "mine: is not an inference output"),
        (part, InvalidValue, "part.zarr: is an unfinished inference output"),
    ):
        with pytest.raises(err) as ei:
            read_embeddings(path, "h1")
        assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    assert isinstance(NotFound("x"), FileNotFoundError)


def test_read_embeddings_checks_its_name_and_ids(finished):
    """A layer the output does not have, ids outside ``[0, N)`` (negative ones used to
    read another node's row, too large ones an empty array), ids that are not integers:
    one line each. In range, the rows of the ids asked for, in their order."""
    from ooc.storage import IdOutOfRange, InvalidValue

    out, ref = finished
    for name in ("h3", "row_of_node", 2):
        with pytest.raises(InvalidValue, match="the output of a 2-layer model has h1 .. h2 "
                                               "and pred"):
            read_embeddings(out, name)
    for ids in ([2000], [-1], [5, 2000], np.array([2**64 - 1], np.uint64)):
        with pytest.raises(IdOutOfRange, match=r"node id -?\d+ out of range \[0, 2000\)") as ei:
            read_embeddings(out, "h2", ids)
        assert isinstance(ei.value, IndexError)
    for ids in ([1.5], [[1, 2]]):
        with pytest.raises(InvalidValue, match="1-d array of integer node ids"):
            read_embeddings(out, "h2", ids)
    ids = np.array([1999, 0, 7, 7], np.uint32)
    assert np.abs(read_embeddings(out, "h2", ids) - ref[1][ids.astype(np.int64)]).max() < TOL
    assert np.abs(read_embeddings(out, "h1", np.arange(3, 9)) - ref[0][3:9]).max() < TOL
    assert read_embeddings(out, "h2", []).shape == (0, 5)


def test_the_disk_check_runs_before_a_pass_and_not_for_a_finished_output(finished, synth,
                                                                         tmp_path, monkeypatch):
    """With nothing at ``out`` the disk check refuses before the pass over ``indices.bin``;
    the same run over its finished output needs no disk and returns its report."""
    from ooc.storage import IOFailure
    from ooc.storage.dataset import Dataset

    ds, x = synth
    real, check = shutil.disk_usage, Dataset.check_indices
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: type(real(path))(real(path).total, real(path).total, 0))
    passes = []

    def counted(self):
        passes.append(1)
        return check(self)

    monkeypatch.setattr(Dataset, "check_indices", counted)
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    with pytest.raises(IOFailure, match="of disk, 0 B is free"):
        layerwise_inference(ds, model, tmp_path / "o.zarr", order="degree", progress=False)
    assert passes == [] and list(tmp_path.iterdir()) == []
    out, _ = finished
    same = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    same.load_state_dict(torch.load(out.parent / "model.pt"))
    rep = layerwise_inference(ds, same, out, order="degree", keep_layers=True, progress=False)
    assert rep["resumed"] and rep["bytes_read"] == 0


def _flip(chunk: Path, at: int = 100) -> None:
    """Flip one byte of ``chunk`` in place (same size)."""
    data = bytearray(chunk.read_bytes())
    data[at] ^= 0xFF
    chunk.write_bytes(bytes(data))


def _kept(out: Path) -> dict:
    return {k: read_embeddings(out, k) for k in ("h1", "h2", "pred")}


CRC_RUN = dict(order="degree", chunk_rows=256, keep_layers=True, progress=False)


def test_a_reader_checks_each_chunk_once_and_reads_as_read_embeddings(synth, tmp_path,
                                                                     monkeypatch):
    """Many reads through one EmbeddingReader: every chunk's CRC is computed the first time
    a read touches it, not again; the rows equal read_embeddings'; an edited chunk is
    named by a new reader."""
    from ooc.executor.inference import chunk_crc
    from ooc.executor.inference.layerwise import EmbeddingReader
    from ooc.storage import DatasetError

    ds, x = synth
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    out = tmp_path / "o.zarr"
    layerwise_inference(ds, model, out, **CRC_RUN, layer_dtype="float16")
    whole = read_embeddings(out, "h2")
    assert read_embeddings(out, "h1").dtype == np.float16
    seen: list[Path] = []
    crc = chunk_crc.file_crc
    monkeypatch.setattr(chunk_crc, "file_crc", lambda p: seen.append(Path(p)) or crc(p))
    reader = EmbeddingReader(out, "h2")
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids = np.sort(rng.choice(ds.num_nodes, 300, replace=False))
        np.testing.assert_array_equal(reader.read(ids), whole[ids])
    h1 = read_embeddings(out, "h1")
    ids = np.sort(rng.choice(ds.num_nodes, 300, replace=False))
    got = EmbeddingReader(out, "h1").read(ids)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, h1[ids])
    data = [p for p in seen if p.parent.parent.parent.name == "h2"]
    chunks = [p for p in (out / "h2" / "c").rglob("*") if p.is_file()]
    assert len(data) == len(set(data)) == len(chunks) > 1     # every chunk, once
    _flip(out / "h2" / "c" / "3" / "0")
    with pytest.raises(DatasetError, match="does not match its checksum"):
        EmbeddingReader(out, "h2").read(np.arange(ds.num_nodes))


def test_an_edited_chunk_is_named_by_the_reader_and_made_again_by_infer(synth, tmp_path,
                                                                       capsys):
    """A chunk of ``h2`` with one byte flipped after the run: ``read_embeddings`` of ids
    in it is one line naming the chunk file and the array; ids in other chunks read as
    before; the same run makes the output again (a note says why) and it equals the first.
    An untouched output is reused (nothing read)."""
    import zarr

    from ooc.storage import DatasetError

    ds, x = synth
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    out = tmp_path / "o.zarr"
    layerwise_inference(ds, model, out, **CRC_RUN)
    first = _kept(out)
    rep = layerwise_inference(ds, model, out, **CRC_RUN)
    assert rep["resumed"] and rep["bytes_read"] == 0
    chunk = out / "h2" / "c" / "3" / "0"
    _flip(chunk)
    rows = np.asarray(zarr.open_array(str(out / "row_of_node"), mode="r")[:])
    inside, outside = np.flatnonzero(rows // 256 == 3), np.flatnonzero(rows // 256 != 3)
    with pytest.raises(DatasetError) as ei:
        read_embeddings(out, "h2", inside[:3])
    msg = str(ei.value)
    assert msg == (f"{chunk}: chunk of h2 does not match its checksum (edited or corrupted); "
                   f"run the same ooc.infer command with --overwrite to make it again")
    assert isinstance(ei.value, ValueError)
    np.testing.assert_array_equal(read_embeddings(out, "h2", outside), first["h2"][outside])
    np.testing.assert_array_equal(read_embeddings(out, "h1", inside), first["h1"][inside])
    capsys.readouterr()
    rep = layerwise_inference(ds, model, out, **CRC_RUN)
    assert not rep["resumed"] and rep["bytes_read"] > 0
    err = capsys.readouterr().err
    assert (f"ooc: note: {chunk}: chunk of h2 does not match its checksum (edited or "
            f"corrupted); making the output again") in err
    for name, arr in _kept(out).items():
        np.testing.assert_array_equal(arr, first[name])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.zarr"]


def test_every_chunk_size_is_checked_and_overwrite_checks_every_crc(synth, tmp_path):
    """Past the sampled chunks: a truncated chunk of ``pred`` is seen by its size, a
    same-size edit of one no sample checks by ``overwrite=True``, which reads every
    chunk's CRC; either output is made again, equal to the first."""
    from ooc.executor.inference.chunk_crc import sample

    ds, x = synth
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    out = tmp_path / "o.zarr"
    run = dict(CRC_RUN, chunk_rows=64)  # 32 chunks an array
    layerwise_inference(ds, model, out, **run)
    first = _kept(out)
    unsampled = min(set(range(32)) - set(sample(32)))
    pred = out / "pred" / "c" / str(unsampled)
    pred.write_bytes(pred.read_bytes()[:-8])
    rep = layerwise_inference(ds, model, out, **run)
    assert not rep["resumed"] and rep["bytes_read"] > 0
    _flip(out / "h1" / "c" / str(unsampled) / "0")
    rep = layerwise_inference(ds, model, out, overwrite=True, **run)
    assert not rep["resumed"] and rep["bytes_read"] > 0
    for name, arr in _kept(out).items():
        np.testing.assert_array_equal(arr, first[name])


def test_an_output_sealed_without_crcs_is_read_unchecked(synth, tmp_path):
    """An output of an ooc that recorded no CRCs (no ``crc32`` in the group's ``ooc``
    attributes) is read and reused as it is."""
    ds, x = synth
    model = build_model("sage", x.shape[1], 16, 5, num_layers=2)
    out = tmp_path / "o.zarr"
    layerwise_inference(ds, model, out, **CRC_RUN)
    meta = json.loads((out / "zarr.json").read_text())
    del meta["attributes"]["ooc"]["crc32"]
    (out / "zarr.json").write_text(json.dumps(meta))
    before = read_embeddings(out, "h2")
    _flip(out / "h2" / "c" / "0" / "0", 0)
    assert (read_embeddings(out, "h2") != before).sum() == 1  # the flipped value, as is
    rep = layerwise_inference(ds, model, out, **CRC_RUN)
    assert rep["resumed"] and rep["bytes_read"] == 0
