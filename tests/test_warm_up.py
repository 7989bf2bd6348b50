"""The kernels a training run calls after its memory plan are compiled (or loaded) before
it: numba compiles a kernel once per argument type, read-only arrays apart, so the
warm-up must call each with the types the dataset's memmaps give."""
import numba
import numpy as np
import pytest

from ooc.caches import _neighbor_cache_kernels as NK
from ooc.caches.neighbor_cache import build_neighbor_cache, full_cache_bytes
from ooc.core.threading_layer import dispatcher_of
from ooc.executor.loader.presets import PRESETS
from ooc.executor.sizing.budget import _child_main
from ooc.storage import DirectFeatures, open_dataset
from ooc.storage import _direct_kernels as DK
from ooc.storage.ingest import generate_synthetic


def _signatures() -> dict[str, int]:
    """Specializations each kernel of the neighbor cache and the direct reader holds."""
    return {f"{m.__name__}.{k}": len(v.signatures) for m in (NK, DK)
            for k, v in vars(m).items()
            if isinstance(dispatcher_of(v), numba.core.registry.CPUDispatcher)}


def test_a_run_after_the_warm_up_compiles_nothing(tmp_path):
    ds = open_dataset(generate_synthetic(tmp_path / "d", nodes=3000, avg_degree=6,
                                         feature_dim=128, progress=False))
    p = PRESETS["ooc"]
    # compile_kernels' child, in this process: the warm-up, then a batch sampled and read
    _child_main([p.readers.name, p.policy.name, str(ds.path), "5,5", "0", "64", "16", "auto"])
    before = _signatures()
    # what the trainer does after its plan: build a neighbor cache that holds part of the
    # graph from the dataset's memmaps and check it (load_or_build_neighbor_cache), read a
    # batch's misses into the batch's rows
    cache = build_neighbor_cache(ds.indptr, ds.indices,
                                 full_cache_bytes(ds.indptr, ds.index_dtype.itemsize) // 3)
    assert 0 < cache.nodes.shape[0] < ds.num_nodes
    cache.check(ds.indptr, ds.file("indices.bin"))
    ids = np.arange(0, ds.num_nodes, 7, dtype=np.int64)
    with DirectFeatures(ds.file("features.bin"), ds.layout) as f:
        out = np.zeros((ids.shape[0] + 3, ds.feature_dim), ds.feature_dtype)
        f.read_into(ids, out, np.arange(ids.shape[0], dtype=np.int64) + 3)
    after = _signatures()
    assert after == before, {k: (before.get(k), v) for k, v in after.items()
                             if v != before.get(k)}


def _all_signatures() -> dict[str, int]:
    """Specializations of every kernel in every ooc kernel module loaded so far."""
    import sys

    return {f"{name}.{k}": len(v.signatures) for name, m in list(sys.modules.items())
            if name.startswith("ooc.") and name.endswith("kernels")
            for k, v in vars(m).items()
            if isinstance(dispatcher_of(v), numba.core.registry.CPUDispatcher)}


@pytest.mark.parametrize("algo,reorder", [("spring", "locality"), ("spring", "none"),
                                          ("greedy", "locality")])
def test_a_partition_run_after_its_child_compiles_nothing(tmp_path, algo, reorder):
    from ooc.partition import partition_dataset
    from ooc.partition.compile_child import main as partition_child

    data = generate_synthetic(tmp_path / "d", nodes=2000, avg_degree=6, feature_dim=16,
                              progress=False, reorder=reorder)
    # compile_partition_kernels' child, in this process: a tiny graph of these dtypes
    partition_child([algo, "int32", "float32", str(int(reorder == "locality")),
                     '{"parts": 3, "split": true, "halo_hops": 2, "refine_passes": 1, '
                     '"params": {}}'])
    before = _all_signatures()
    assert any(k.startswith("ooc.partition._kernels.") and v for k, v in before.items())
    partition_dataset(data, tmp_path / "p", 3, algo, halo_hops=2)
    after = _all_signatures()
    assert after == before, {k: (before.get(k), v) for k, v in after.items()
                             if v != before.get(k)}


@pytest.mark.parametrize("kind", ["files", "synthetic"])
def test_an_ingest_after_its_child_compiles_nothing(tmp_path, kind):
    """compile_ingest_kernels' child, run in this process, leaves no kernel for an ingest
    of another graph with the same options to compile: an .npy edge list with features and
    labels (placed in memory, then through bucket files), a CSV edge list, or a generated
    graph."""
    import json

    from ooc.storage.ingest import ingest_edgelist
    from ooc.storage.ingest.precompile import _child_main as ingest_child

    options = {"undirected": True, "dedup": True, "remove_self_loops": False,
               "dtype": "float16", "reorder": "locality"}
    ingest_child([kind, json.dumps(options)])
    before = _all_signatures()
    assert any(k.startswith("ooc.storage.ingest._kernels.") and v for k, v in before.items())
    common = dict(progress=False, reorder="locality")
    if kind == "synthetic":
        for out, buffer in ((tmp_path / "d", 1 << 30), (tmp_path / "r", 64 << 10)):
            st: dict = {}
            generate_synthetic(out, nodes=5000, avg_degree=8, feature_dim=24, dtype="float16",
                               community_size=50, buffer_bytes=buffer, stats=st, **common)
            assert st["routed"] is (buffer < 1 << 30)
    else:
        rng = np.random.default_rng(3)
        n = 3000
        np.save(tmp_path / "e.npy", rng.integers(0, n, (20_000, 2)))
        np.save(tmp_path / "x.npy", rng.standard_normal((n, 24)).astype(np.float32))
        np.save(tmp_path / "y.npy", rng.integers(0, 7, n))
        opts = dict(undirected=True, dedup=True, feature_dtype="float16", **common)
        ingest_edgelist(tmp_path / "e.npy", tmp_path / "d", features=tmp_path / "x.npy",
                        labels=tmp_path / "y.npy", **opts)
        st: dict = {}
        ingest_edgelist(tmp_path / "e.npy", tmp_path / "r", features=tmp_path / "x.npy",
                        buffer_bytes=64 << 10, stats=st, **opts)
        assert st["routed"]
        (tmp_path / "e.txt").write_text("".join(f"{i} {(i * 5) % n}\n" for i in range(n)))
        ingest_edgelist(tmp_path / "e.txt", tmp_path / "t", num_nodes=n, **opts)
    after = _all_signatures()
    assert after == before, {k: (before.get(k), v) for k, v in after.items()
                             if v != before.get(k)}


def test_a_kernel_stamp_is_for_this_cpu_and_this_key(monkeypatch):
    """numba keeps a kernel per CPU: a cache shared with a machine of another CPU is cold
    here, so the stamp that lets a run skip its compile child differs by CPU (and by key)."""
    import llvmlite.binding as ll

    from ooc.core.jit import kernels_stamp

    here = kernels_stamp("train|x")
    assert here is not None and here == kernels_stamp("train|x")
    assert kernels_stamp("train|y") != here
    monkeypatch.setattr(ll, "get_host_cpu_name", lambda: "another-cpu")
    assert kernels_stamp("train|x") != here


def test_a_failed_compile_child_says_so_and_leaves_no_stamp():
    """A child that fails (here: an entry that raises) is one note and a returned reason;
    no stamp, so the next run tries the child again."""
    from ooc.core import notes
    from ooc.core.jit import compile_in_child, kernels_stamp

    key = "test|a child that fails"
    lines: list[str] = []
    notes.reset()
    notes.sink = lines.append
    try:
        got = compile_in_child(key, "ooc.core.jit:no_such_function", [])
    finally:
        notes.sink = None
        notes.reset()
    assert got.startswith("child process failed (") and "no_such_function" in got, got
    assert len(lines) == 1 and "compiling the kernels in a child process failed" in lines[0]
    stamp = kernels_stamp(key)
    assert stamp is not None and not stamp.exists()


def test_a_compile_child_refusing_its_input_leaves_the_saying_to_the_run(capsys):
    """Input the run refuses anyway (an OocError in the child: a bad option) is no note:
    the run's own one-line error follows, and stays the only line (the partition CLI's
    bad-argument tests check that)."""
    from ooc.core.jit import compile_in_child

    got = compile_in_child("test|refused", "ooc.partition.compile_child:main",
                           ["spring", "int32", "float32", "0",
                            '{"parts": 2, "split": false, "halo_hops": 1, '
                            '"refine_passes": -1, "params": {}}'])
    assert got.startswith("child process refused its input (--refine-passes"), got
    assert capsys.readouterr().err == ""
