"""Column-sliced aggregation (layers whose convolution is a plain reduction of its input
rows): every layer equal to the in-memory forward pass, in one slice and in several, on a
dataset stored in node order and in a locality order, in another processing order, resumed
after a crash; the bytes it reads against its plan; the planner taking the way planned to
read the fewest bytes; what it refuses."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_inference_streamed import TOL, _graph, _models, _reference, resumes_as_a_whole_run

from ooc.executor.inference.layerwise import layerwise_inference, read_embeddings
from ooc.executor.inference.memory_plan import BlockCosts
from ooc.executor.inference import sliced
from ooc.executor.inference.sliced import SLICE_DIR, plan_sliced
from ooc.executor.inference.streamed import plan_stream
from ooc.executor.training.models import build_model
from ooc.storage import OocError, open_dataset, write_dataset


@pytest.fixture(scope="module", params=["none", "locality"])
def data(tmp_path_factory, request):
    rng = np.random.default_rng(12)
    indptr, indices = _graph(rng)
    n = indptr.shape[0] - 1
    x = rng.standard_normal((n, 20)).astype(np.float32)
    y = rng.integers(0, 4, n)
    path = write_dataset(tmp_path_factory.mktemp("sliced") / "ds", indptr, indices, x,
                         labels=y, num_classes=4, train_idx=np.arange(0, 700),
                         val_idx=np.arange(700, 1000), test_idx=np.arange(1000, n),
                         reorder=request.param)
    return open_dataset(path), x


def _moved(la: dict) -> dict:
    """Every way's planned bytes read plus written besides the output (what auto compares)."""
    return {k: v + la["planned_written"][k] for k, v in la["planned_bytes"].items()}


def _check_layers(out, ref) -> None:
    for l, r in enumerate(ref):
        h = read_embeddings(out, f"h{l + 1}")
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(h - r).max() < TOL * scale, f"layer {l + 1}: {np.abs(h - r).max()}"


@pytest.mark.parametrize("slice_cols", [None, 7])
@pytest.mark.parametrize("name", ["ooc-sage", "pyg-mean", "pyg-max", "pyg-sum"])
def test_sliced_layers_equal_the_forward_pass(data, tmp_path, name, slice_cols):
    ds, x = data
    model = _models()[name]
    ref = _reference(model, x, ds)
    out = tmp_path / "s.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=128, aggregate="sliced",
                              slice_cols=slice_cols, keep_layers=True, progress=False)
    _check_layers(out, ref)
    for la in rep["layers"]:
        reads = la["reads"]
        assert reads["mode"] == "sliced"
        assert reads["slices"] == (1 if slice_cols is None else -(-la["in_dim"] // 7))
        assert reads["sorted_edges"] == (ds.row_of is not None)
        # a locality-ordered dataset's rows are the processing order's: the later layers
        # read the edges the first one sorted
        assert reads["edges_reused"] == (ds.row_of is not None and la["layer"] > 1)
        # a later layer's column files come from the layer before, which wrote them with
        # its output
        assert reads["columns_ready"] == (slice_cols is not None and la["layer"] > 1)
        assert reads["reduction"] == {"pyg-max": "max", "pyg-sum": "sum"}.get(name, "mean")
        assert 0 < la["bytes_read"] <= reads["planned_sliced_bytes"]
    assert not (out / SLICE_DIR).exists()
    np.testing.assert_array_equal(read_embeddings(out, "pred"), ref[-1].argmax(1))


@pytest.mark.parametrize("width", [3, 9])
def test_column_files_of_another_width_are_taken_where_they_fit(data, tmp_path, monkeypatch,
                                                               width):
    """The layer before wrote slices of ``width`` columns: narrower than the 7 the layer
    plans, it takes them; wider, it writes its own; the layers equal the forward pass."""
    from ooc.executor.inference import runner

    ds, x = data
    model = _models()["ooc-sage"]
    made = runner._next_columns

    def other_width(run, l, d_out, first_chunk, scratch):
        got = made(run, l, d_out, first_chunk, scratch)
        if got is not None:
            got.bounds = [(c, min(d_out, c + width)) for c in range(0, d_out, width)]
        return got

    monkeypatch.setattr(runner, "_next_columns", other_width)
    out = tmp_path / "s.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=128, aggregate="sliced",
                              slice_cols=7, keep_layers=True, progress=False)
    _check_layers(out, _reference(model, x, ds))
    for la in rep["layers"][1:]:
        assert la["reads"]["columns_ready"] == (width < 7)
        assert la["reads"]["slices"] == -(-la["in_dim"] // min(width, 7))
    assert not (out / SLICE_DIR).exists()


@pytest.mark.parametrize("slice_cols", [None, 6])
def test_another_processing_order_sorts_the_edges(data, tmp_path, slice_cols):
    """Rows in degree order: every layer's edges are sorted into row order first."""
    ds, x = data
    model = _models()["pyg-mean"]
    out = tmp_path / "d.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=100, order="degree",
                              aggregate="sliced", slice_cols=slice_cols, keep_layers=True,
                              progress=False)
    assert all(la["reads"]["sorted_edges"] for la in rep["layers"])
    _check_layers(out, _reference(model, x, ds))


def test_a_crash_between_chunks_resumes(data, tmp_path):
    """A run stopped after a chunk of a sliced layer (4 slices) resumes there and writes
    the arrays of an uninterrupted run; float16 layers between."""
    resumes_as_a_whole_run(data, tmp_path, dict(chunk_rows=128, aggregate="sliced",
                                                slice_cols=5))


def test_auto_takes_the_way_planned_to_read_the_fewest_bytes(data, tmp_path):
    """Blocks of at most 20 targets without a chunk cache, streamed groups of 100 rows:
    both plan to read the input many times over; one slice reads it once, and auto takes
    the way planned to move the fewest bytes (read, and scratch written), every layer
    reporting every way's. Against one group of accumulators, slices of one column (the
    edges read once a column, the columns and aggregates written) lose."""
    ds, x = data
    model = _models()["pyg-mean"]
    out = tmp_path / "a.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=128, block_rows=20, cache_chunks=0,
                              stream_rows=(100, 200), keep_layers=True, progress=False)
    for la in rep["layers"]:
        planned = _moved(la)
        assert set(planned) == {"blocks", "streamed", "sliced"}
        assert la["reads"]["mode"] == "sliced" == min(planned, key=planned.get)
    _check_layers(out, _reference(model, x, ds))
    # one group of accumulators against slices of one column (the edges read per column)
    rep = layerwise_inference(ds, model, tmp_path / "b.zarr", chunk_rows=128, block_rows=20,
                              cache_chunks=0, stream_rows=(1500, 200), slice_cols=1,
                              progress=False)
    for la in rep["layers"]:
        planned = _moved(la)
        assert la["reads"]["mode"] == "streamed" == min(planned, key=planned.get)


def test_at_papers100m_shape_slices_read_far_less_than_groups():
    """papers100M's shape at 4 GiB: the streamed plan reads the input once per group of
    targets (tens of times); the sliced plan reads it about once, the edges once a slice."""
    n, e, d_in, d_out = 111_059_956, 2 * 1_615_685_872, 256, 256
    table = 4 * n * d_in
    costs = BlockCosts.estimate(d_in, d_out)
    common = dict(budget=4 << 30, chunk_rows=32768, costs=costs, rss0=(1 << 30))
    stream = plan_stream("mean", n, e, d_in, d_out, 4 * d_in, table, src_unit=32768,
                         src_align=1, **common)
    sliced = plan_sliced("mean", n, e, d_in, d_out, 4 * d_in, table, table,
                         sorted_edges=True, **common)
    assert stream is not None and sliced is not None
    assert sliced.slices > 1 and stream.groups > 10
    assert sliced.planned_bytes < stream.planned_bytes / 3
    assert sliced.planned_peak_bytes <= 4 << 30
    # the input 4 times (columns, slices, aggregate, own rows), the edges once a slice
    per_slice = 4 * e + 4 * n
    assert sliced.planned_bytes == 4 * table + sliced.slices * per_slice + 8 * e


def test_a_layer_that_cannot_slice_is_refused_in_one_line(data, tmp_path):
    ds, _ = data
    torch.manual_seed(0)
    model = build_model("gcn", 20, 16, 4, num_layers=2)
    with pytest.raises(OocError, match=r"--aggregate sliced: layer 1 cannot run in column "
                                       r"slices \(its convolution is not a plain"):
        layerwise_inference(ds, model, tmp_path / "g.zarr", aggregate="sliced", progress=False)
    with pytest.raises(OocError, match=r"slice_cols"):
        layerwise_inference(ds, _models()["pyg-mean"], tmp_path / "h.zarr",
                            aggregate="sliced", slice_cols=0, progress=False)



@pytest.mark.parametrize("local_rows", [256, 8])
@pytest.mark.parametrize("name", ["ooc-sage", "pyg-max", "pyg-sum"])
def test_edges_local_to_a_block_are_reduced_in_the_rows_pass(data, tmp_path, monkeypatch,
                                                             name, local_rows):
    """A dataset stored in the order it is processed in: the rows pass goes in blocks of
    ``local_rows`` rows (monkeypatched small, so that some edges are local and some are
    not), reduces the edges whose source lies in its block's rows or halo, and combines
    them with the slices' reduction of the others; every layer equals the forward pass."""
    ds, x = data
    if ds.row_of is None:
        pytest.skip("node id order: the edges are read as indices.bin holds them, unsorted")
    monkeypatch.setattr(sliced, "LOCAL_ROWS", local_rows)
    model = _models()[name]
    out = tmp_path / "l.zarr"
    rep = layerwise_inference(ds, model, out, chunk_rows=128, aggregate="sliced",
                              slice_cols=7, keep_layers=True, progress=False)
    _check_layers(out, _reference(model, x, ds))
    for la in rep["layers"]:
        reads = la["reads"]
        assert reads["local_rows"] == local_rows
        assert 0 < la["local_edges"] < ds.num_edges
        assert 0 < reads["planned_local_share"] < 1
        assert 0 < la["bytes_read"] <= reads["planned_sliced_bytes"]


def test_a_crash_resumes_inside_a_block_of_local_edges(data, tmp_path, monkeypatch):
    """Blocks of 200 rows and output chunks of 128: the resumed rows pass starts inside a
    block, past its first local edges."""
    if data[0].row_of is None:
        pytest.skip("node id order: no local edges")
    monkeypatch.setattr(sliced, "LOCAL_ROWS", 200)
    resumes_as_a_whole_run(data, tmp_path, dict(chunk_rows=128, aggregate="sliced",
                                                slice_cols=5))


def test_forced_slices_check_the_disk_before_anything_is_written(data, tmp_path, monkeypatch):
    """``aggregate="sliced"`` adds the sliced scratch (sorted edges, column files and
    aggregates) to what the run needs before it starts, one line where the disk has not
    that much free, nothing written; ``auto`` needs only a streamed layer's buckets (it
    takes slices only where their scratch fits)."""
    import re
    import shutil as sh
    from collections import namedtuple

    from ooc.core.sizes import parse_size

    ds, _ = data
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda p: usage(1 << 40, 1 << 40, 0))
    need = {}
    for way in ("sliced", "auto"):
        out = tmp_path / f"{way}.zarr"
        with pytest.raises(OocError, match="of disk") as e:
            layerwise_inference(ds, _models()["pyg-mean"], out, aggregate=way, progress=False)
        assert not out.exists() and not (tmp_path / f".{way}.zarr.partial").exists()
        need[way] = parse_size(re.search(r"needs ([0-9.]+ ?[KMG]iB)", str(e.value))
                               .group(1).replace(" ", ""))
    e, n = ds.num_edges, ds.num_nodes
    assert need["sliced"] - need["auto"] >= 4 * e + 8 * n + 4 * 20 * n


@pytest.mark.parametrize("use_max", [False, True])
def test_reduce_rows_matches_numpy(use_max):
    from ooc.executor.inference._kernels import reduce_rows, reduce_rows_half

    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    deg = rng.integers(0, 5, 300)
    deg[::7] = 0
    src = rng.integers(0, 50, int(deg.sum()))
    out = np.full((300, 6), np.nan, np.float32)
    reduce_rows(x, src, deg, out, use_max)
    k = 0
    for r, m in enumerate(deg):
        rows = x[src[k:k + m]]
        want = np.zeros(6, np.float32) if m == 0 else rows.max(0) if use_max else rows.sum(0)
        np.testing.assert_allclose(out[r], want, rtol=1e-6, atol=1e-6)
        k += m
    # float16 values held as their bits (subnormals, -0, the largest and infinities among
    # them) reduce to what their float32 values do, bit for bit
    x16 = (x * 1e3).astype(np.float16)
    x16[0, :6] = [6e-8, -0.0, 65504, -65504, np.inf, 1e-5]
    value = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    half = np.full((300, 6), np.nan, np.float32)
    reduce_rows_half(x16.view(np.uint16), value, src, deg, half, use_max)
    want = np.full((300, 6), np.nan, np.float32)
    reduce_rows(x16.astype(np.float32), src, deg, want, use_max)
    np.testing.assert_array_equal(half, want)


def test_float16_columns_hold_twice_the_columns_a_slice():
    """A float16 input's column files and slices keep its dtype: at one budget a slice
    holds twice the columns, so the edges are walked half as often and fewer bytes read."""
    kw = dict(reduction="mean", n=1 << 22, num_edges=1 << 26, d_in=256, d_out=256,
              in_row_bytes=512, table_bytes=(1 << 22) * 512, own_bytes=(1 << 22) * 512,
              budget=1 << 30, chunk_rows=1024, costs=BlockCosts.estimate(256, 256),
              sorted_edges=True, rss0=200 << 20)
    p32 = plan_sliced(**kw, col_dtype="float32")
    p16 = plan_sliced(**kw, col_dtype="float16")
    assert p32 is not None and p16 is not None
    assert p16.col_dtype == "float16" and p32.slices > 2
    assert p16.slice_cols in (2 * p32.slice_cols - 1, 2 * p32.slice_cols,
                              2 * p32.slice_cols + 1)
    assert p16.planned_bytes < p32.planned_bytes and p16.write_bytes < p32.write_bytes
    assert p16.planned_peak_bytes <= (1 << 30) and p32.planned_peak_bytes <= (1 << 30)


@pytest.mark.parametrize("features", ["float32", "float16"])
def test_float16_layers_slice_in_float16(data, tmp_path, features):
    """float16 layers (and float16 features) are sliced as float16: the column files the
    layer before writes are float16, and every layer equals the streamed float16 run's
    within float16's rounding (both round each layer once)."""
    ds, x = data
    if features == "float16":
        x = x.astype(np.float16)
        path = write_dataset(tmp_path / "ds16", ds.indptr, np.asarray(ds.indices), x,
                             labels=np.asarray(ds.labels), num_classes=4,
                             train_idx=np.arange(0, 700), val_idx=np.arange(700, 1000),
                             test_idx=np.arange(1000, x.shape[0]),
                             reorder="locality" if ds.row_of is not None else "none")
        ds = open_dataset(path)
    model = _models()["ooc-sage"]
    kw = dict(chunk_rows=128, keep_layers=True, progress=False, layer_dtype="float16")
    rep = layerwise_inference(ds, model, tmp_path / "s.zarr", aggregate="sliced",
                              slice_cols=7, **kw)
    layerwise_inference(ds, model, tmp_path / "t.zarr", aggregate="streamed", **kw)
    for la in rep["layers"]:
        reads = la["reads"]
        assert reads["mode"] == "sliced" and reads["slices"] == -(-la["in_dim"] // 7)
        assert reads["col_dtype"] == (features if la["layer"] == 1 else "float16")
        assert reads["columns_ready"] == (la["layer"] > 1)
    ref = _reference(model, x.astype(np.float32), ds)
    for l in range(len(ref)):
        got = read_embeddings(tmp_path / "s.zarr", f"h{l + 1}").astype(np.float32)
        other = read_embeddings(tmp_path / "t.zarr", f"h{l + 1}").astype(np.float32)
        scale = max(1.0, float(np.abs(ref[l]).max()))
        assert np.abs(got - other).max() <= 2e-3 * scale, l
        assert np.abs(got - ref[l]).max() <= 1e-2 * scale, l
    assert not (tmp_path / "s.zarr" / SLICE_DIR).exists()


def test_column_files_are_whole_or_absent(tmp_path):
    """Chunks in row order make whole column files with their meta; a chunk out of order
    drops them all (the next layer then writes its own)."""
    h = np.arange(40, dtype=np.float32).reshape(10, 4)
    bounds = [(0, 1), (1, 4)]
    cols = sliced.ColumnFiles(tmp_path / "a", bounds, 10)
    cols.put(0, h[:6])
    cols.put(6, h[6:])
    cols.finish()
    assert (tmp_path / "a" / sliced.COLUMNS_META).exists()
    for j, (c0, c1) in enumerate(bounds):
        got = np.fromfile(tmp_path / "a" / f"cols{j}.bin", dtype=np.float32)
        np.testing.assert_array_equal(got.reshape(10, c1 - c0), h[:, c0:c1])
    bad = sliced.ColumnFiles(tmp_path / "b", bounds, 10)
    bad.put(0, h[:3])
    bad.put(6, h[6:])
    bad.finish()
    assert bad.failed and not (tmp_path / "b").exists()
