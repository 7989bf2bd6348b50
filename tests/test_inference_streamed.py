"""Streamed aggregation (layers whose convolution is a plain reduction of its input rows):
the same outputs as the in-memory forward pass, in several groups and source chunks, on a
dataset stored in node order and in a locality order, resumed after a crash; the bytes it
reads; what it refuses."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import mapped_kib
from torch_geometric.nn import GraphSAGE

from ooc.executor.inference.layerwise import layerwise_inference, partial_path, read_embeddings
from ooc.executor.training.models import build_model
from ooc.infer import main as infer_main
from ooc.storage import OocError, csc_from_edges, open_dataset, write_dataset

TOL = 1e-4


def _graph(rng: np.random.Generator, n: int = 1500, e: int = 12000):
    """Skewed random edges with self loops and repeated edges; some nodes get no in-edge."""
    src = (rng.pareto(1.5, e) * 40).astype(np.int64) % n
    dst = rng.integers(0, n - 50, e)                  # the last 50 nodes: no in-edges
    src[:30] = dst[:30]
    src[30:60], dst[30:60] = src[60:90], dst[60:90]
    return csc_from_edges(src, dst, n)


@pytest.fixture(scope="module", params=["none", "locality"])
def data(tmp_path_factory, request):
    rng = np.random.default_rng(11)
    indptr, indices = _graph(rng)
    n = indptr.shape[0] - 1
    x = rng.standard_normal((n, 20)).astype(np.float32)   # 80-byte rows, 51 a page
    y = rng.integers(0, 4, n)
    path = write_dataset(tmp_path_factory.mktemp("streamed") / "ds", indptr, indices, x,
                         labels=y, num_classes=4, train_idx=np.arange(0, 700),
                         val_idx=np.arange(700, 1000), test_idx=np.arange(1000, n),
                         reorder=request.param)
    ds = open_dataset(path)
    assert (ds.row_of is not None) == (request.param == "locality")
    return ds, x


def _edge_index(ds) -> torch.Tensor:
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return torch.from_numpy(np.stack([np.asarray(ds.indices, dtype=np.int64), dst]))


def _reference(model, x: np.ndarray, ds) -> list[np.ndarray]:
    """Every layer's output of the stock in-memory forward pass, layer by layer."""
    model.eval()
    ei = _edge_index(ds)
    outs, h = [], torch.from_numpy(x)
    with torch.no_grad():
        for l, conv in enumerate(model.convs):
            h = conv(h, ei)
            if l < len(model.convs) - 1:
                h = torch.relu(h)
            outs.append(h.numpy().copy())
    return outs


def _models():
    torch.manual_seed(0)
    return {"ooc-sage": build_model("sage", 20, 24, 4, num_layers=3),
            "pyg-mean": GraphSAGE(20, 16, 3, 4),
            "pyg-max": GraphSAGE(20, 16, 2, 4, aggr="max"),
            "pyg-sum": GraphSAGE(20, 16, 2, 4, aggr="sum")}


@pytest.mark.parametrize("name", ["ooc-sage", "pyg-mean", "pyg-max", "pyg-sum"])
def test_streamed_layers_equal_the_forward_pass(data, tmp_path, name):
    ds, x = data
    model = _models()[name]
    ref = _reference(model, x, ds)
    out = tmp_path / "s.zarr"
    # 3 groups of 512 output rows, source chunks of about 200 rows: every edge kind is met
    rep = layerwise_inference(ds, model, out, chunk_rows=128, aggregate="streamed",
                              stream_rows=(512, 200), keep_layers=True, progress=False)
    for l, r in enumerate(ref):
        h = read_embeddings(out, f"h{l + 1}")
        assert np.abs(h - r).max() < TOL, f"layer {l + 1}: {np.abs(h - r).max()}"
    for la in rep["layers"]:
        reads = la["reads"]
        assert reads["mode"] == "streamed" and reads["groups"] == 3
        assert reads["source_chunks"] >= 6
        assert reads["reduction"] == {"pyg-max": "max", "pyg-sum": "sum"}.get(name, "mean")
        assert 0 < la["bytes_read"] <= reads["planned_stream_bytes"]
    assert not (out / "edge_buckets").exists()
    np.testing.assert_array_equal(read_embeddings(out, "pred"), ref[-1].argmax(1))


@pytest.mark.parametrize("aggregate", ["streamed", "blocks"])
def test_no_page_of_indptr_stays_mapped(data, tmp_path, monkeypatch, aggregate):
    """Every pass over ``indptr.npy`` and a locality-ordered dataset's row map (the order,
    the topology, the plans, the buckets, a group's degrees, a block's local graph) drops
    the pages it mapped: the layers start from the processing order's 4 bytes a node, and
    none of either file is resident when they end."""
    import os

    import ooc.executor.inference.layerwise as L
    from ooc.storage.dataset import ROW_MAP_FILE

    ds, _ = data
    files = [os.path.realpath(ds.path / "indptr.npy")]
    if ds.row_of is not None:
        files.append(os.path.realpath(ds.path / ROW_MAP_FILE))
    seen: list[int] = []
    measure = L.rss

    def rss_and_maps() -> int:
        seen.append(sum(mapped_kib(f) for f in files))
        return measure()

    monkeypatch.setattr(L, "rss", rss_and_maps)
    layerwise_inference(ds, _models()["ooc-sage"], tmp_path / "o.zarr", chunk_rows=128,
                        aggregate=aggregate, progress=False,
                        stream_rows=(512, 200) if aggregate == "streamed" else None)
    assert len(seen) >= 2 and seen[-1] == 0    # the layers' start RSS
    assert all(mapped_kib(f) == 0 for f in files)


def test_a_budget_that_streams_many_passes_names_the_one_that_streams_one(monkeypatch):
    """Where the budget makes a streamed layer read its input more than three times over,
    one note names the smallest whole-MiB budget whose plan holds every accumulator."""
    from ooc.core import notes
    from ooc.executor.inference import streamed as S
    from ooc.executor.inference.memory_plan import BlockCosts

    n, e, d_in, d_out = 2_000_000, 30_000_000, 128, 256
    table = n * d_in * 4

    def replan(budget: int):
        return S.plan_stream("mean", n, e, d_in, d_out, 4 * d_in, table, budget, 32768, 32768,
                             1, BlockCosts.estimate(d_in, d_out), rss0=500 << 20)

    budget = 1 << 30
    plan = replan(budget)
    assert plan.groups > 3 and plan.planned_bytes > 3 * table
    lines: list[str] = []
    monkeypatch.setattr(notes, "sink", lines.append)
    S.note_stream_reads(0, plan, budget, n, d_in, table, replan)
    enough = S.one_pass_budget(plan, budget, n, d_in, replan)
    assert enough % (1 << 20) == 0
    assert replan(enough).groups == 1 and replan(enough - (1 << 20)).groups == 2
    assert len(lines) == 1 and f"{plan.groups} groups" in lines[0]
    assert lines[0].endswith(f"; {enough >> 20}MiB streams it in one pass")
    few = replan(2 * enough)           # one pass: nothing to say
    S.note_stream_reads(0, few, 2 * enough, n, d_in, table, replan)
    assert len(lines) == 1


def test_float16_layers_and_a_resumed_crash(data, tmp_path):
    """float16 layers before the last; a run stopped after a chunk in the middle of a group
    (chunk 6 of layer 2: its second group is chunks 4-7) resumes there and writes the
    arrays of an uninterrupted run."""
    kw = dict(chunk_rows=128, aggregate="streamed", stream_rows=(512, 300))
    resumes_as_a_whole_run(data, tmp_path, kw)


def resumes_as_a_whole_run(data, tmp_path, kw: dict) -> None:
    """Run ``kw`` (float16 layers between) whole, and again stopped after chunk 6 of layer
    2 and resumed: the same arrays."""
    ds, x = data
    model = _models()["ooc-sage"]
    kw = dict(kw, layer_dtype="float16", keep_layers=True, progress=False)
    whole = tmp_path / "whole.zarr"
    layerwise_inference(ds, model, whole, **kw)
    ref = _reference(model, x, ds)
    assert np.abs(read_embeddings(whole, "h3") - ref[-1]).max() < 0.05  # float16 between

    class Crash(Exception):
        pass

    def crash(l, c):
        if (l, c) == (1, 5):
            raise Crash

    out = tmp_path / "crash.zarr"
    with pytest.raises(Crash):
        layerwise_inference(ds, model, out, on_chunk=crash, **kw)
    prog = json.loads((partial_path(out) / "progress.json").read_text())
    assert prog["layers_done"] == 1 and prog["chunks_done"] == 6
    rep = layerwise_inference(ds, model, out, **kw)
    assert rep["resumed"] and rep["resumed_chunks"] == 12 + 6
    for name in ("h1", "h2", "h3"):
        np.testing.assert_array_equal(read_embeddings(out, name), read_embeddings(whole, name))


def test_auto_takes_the_way_that_reads_less(data, tmp_path):
    """A layer the budget runs as one block reads each input page once: auto keeps the
    block. Where it takes several blocks (here capped by ``block_rows``, without a chunk
    cache), auto plans every way and takes the one planned to read the fewest bytes: on
    this graph, with edges all over, not the blocks."""
    ds, x = data
    model = _models()["pyg-mean"]
    rep = layerwise_inference(ds, model, tmp_path / "a.zarr", chunk_rows=128, block_rows=20,
                              cache_chunks=0, progress=False)
    for la in rep["layers"]:  # streamed, or column slices where they plan fewer bytes
        planned = {k: v + la["planned_written"][k] for k, v in la["planned_bytes"].items()}
        assert la["reads"]["mode"] == min(planned, key=planned.get) != "blocks"
        assert planned["blocks"] > planned["streamed"]
    rep = layerwise_inference(ds, model, tmp_path / "b.zarr", chunk_rows=128, progress=False)
    assert all(la["reads"]["mode"] == "rows" and la["blocks"] == 1 for la in rep["layers"])
    np.testing.assert_allclose(read_embeddings(tmp_path / "a.zarr", "h3"),
                               read_embeddings(tmp_path / "b.zarr", "h3"), atol=TOL)


def test_auto_keeps_blocks_that_read_less(tmp_path):
    """Communities of consecutive ids, every edge inside one: each block of 300 targets
    reads its own pages, about the table once in all, less than streaming's twice; auto
    runs the blocks."""
    rng = np.random.default_rng(5)
    n, size = 1500, 300
    dst = rng.integers(0, n, 15000)
    src = (dst // size) * size + rng.integers(0, size, dst.size)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, 20)).astype(np.float32)
    ds = open_dataset(write_dataset(tmp_path / "local", indptr, indices, x))
    model = _models()["pyg-mean"]
    rep = layerwise_inference(ds, model, tmp_path / "o.zarr", chunk_rows=128, block_rows=300,
                              order="natural", progress=False)
    for la in rep["layers"]:
        assert la["reads"]["mode"] in ("rows", "chunks") and la["blocks"] == 5
    ref = _reference(model, x, ds)
    assert np.abs(read_embeddings(tmp_path / "o.zarr", "h3") - ref[-1]).max() < TOL


def test_a_layer_that_cannot_stream_is_refused_in_one_line(data, tmp_path, capsys):
    ds, _ = data
    model = build_model("gcn", 20, 16, 4, num_layers=2)
    with pytest.raises(OocError, match="layer 1 cannot stream .*not a plain mean, sum or max"):
        layerwise_inference(ds, model, tmp_path / "g.zarr", aggregate="streamed",
                            progress=False)
    with pytest.raises(OocError, match=r"stream_rows\[0\] \(group rows\)"):
        layerwise_inference(ds, _models()["pyg-sum"], tmp_path / "s.zarr",
                            stream_rows=(0, None), progress=False)
    assert not (tmp_path / "s.zarr").exists()
    with pytest.raises(SystemExit) as e:
        infer_main(["--data", str(ds.path), "--checkpoint", str(tmp_path / "none.pt"),
                    "--out", str(tmp_path / "o.zarr"), "--aggregate", "sideways"])
    assert e.value.code == 2
    assert "--aggregate: invalid choice: 'sideways'" in capsys.readouterr().err


def test_the_disk_check_counts_the_edge_buckets(data, tmp_path, monkeypatch):
    """Free disk for the layers but not for the edge buckets as well: a run that may stream
    is refused before anything is written; one that reads by blocks runs."""
    import shutil

    from ooc.executor.inference.store import disk_bytes

    ds, _ = data
    model = _models()["pyg-sum"]
    layers = disk_bytes(ds.num_nodes, [20, 16, 4], [4, 4], False, ds.row_of is not None, 128)
    free = layers + 4 * ds.num_edges  # half the buckets' 8 bytes an edge
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: type(real(p))(real(p).total, real(p).total - free, free))
    out = tmp_path / "o.zarr"
    with pytest.raises(OocError, match="needs .* of disk"):
        layerwise_inference(ds, model, out, chunk_rows=128, progress=False)
    assert not out.exists() and not partial_path(out).exists()
    rep = layerwise_inference(ds, model, out, chunk_rows=128, aggregate="blocks", progress=False)
    assert rep["layers"][0]["reads"]["mode"] in ("rows", "chunks")


@pytest.mark.parametrize("in_row,copy", [(512, False), (256, True)])
def test_the_plan_gives_the_accumulators_what_the_chunk_and_sub_blocks_leave(
        monkeypatch, in_row, copy):
    """Out of a budget of 1 GiB at an RSS of 300 MiB: one source chunk of a tenth (at most
    SOURCE_MAX_BYTES), sub-blocks of at most SUB_ROWS targets within a tenth of what it
    leaves, and the rest to the accumulators; the planned
    peak adds them to the RSS and the output chunks and stays within the budget. A source
    stored as float32 (512-byte rows of 128 dims) is not copied; a float16 one is."""
    from ooc.executor.inference import streamed
    from ooc.executor.inference.memory_plan import SAFETY_BYTES, BlockCosts

    MiB = 1 << 20
    monkeypatch.setattr(streamed, "rss", lambda: 300 * MiB)
    n, d_in, d_out, chunk = 3_000_000, 128, 256, 32768
    costs = BlockCosts.estimate(d_in, d_out)
    plan = streamed.plan_stream("mean", n, 40 * n, d_in, d_out, in_row, n * in_row, 1 << 30,
                                chunk, 8, 8, costs)
    assert plan is not None
    free = (1 << 30) - 300 * MiB - 2 * chunk * d_out * 4 - SAFETY_BYTES
    assert plan.work == free
    src_row = in_row + (4 * d_in if copy else 0)
    source = plan.src_rows * src_row + plan.pair_piece * streamed.BUCKET_BYTES
    cap = min(0.1 * free, streamed.SOURCE_MAX_BYTES)
    assert 0.9 * cap <= source <= cap
    per_target = costs.target + 2 * costs.node + costs.edge + 3 * 4 * d_in
    assert plan.sub_rows == min(streamed.SUB_ROWS, int(0.1 * (free - source)) // per_target)
    acc = plan.group_rows * (4 * d_in + streamed.GROUP_ROW_EXTRA)
    used = acc + source + plan.sub_rows * per_target
    assert free - (4 * d_in + streamed.GROUP_ROW_EXTRA) < used <= free
    assert acc > 0.7 * free
    assert plan.groups == -(-n // plan.group_rows)
    assert plan.planned_peak_bytes == 300 * MiB + 2 * chunk * d_out * 4 + used
    assert plan.planned_peak_bytes <= (1 << 30) - SAFETY_BYTES
