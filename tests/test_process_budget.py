"""One memory budget per process (``ooc.memory_budget``) and the loader's worker threads."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
import torch
from conftest import budget_above, community_graph, require_cora

import ooc
from ooc.storage import BudgetError, OocError

MiB = 1 << 20


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = community_graph(tmp_path_factory.mktemp("budget") / "g", n=20000, dim=64)
    return ooc.open_dataset(path)


def _epochs(loader, n=2):
    return [[(d.n_id.clone(), d.edge_index.clone(), d.x.clone(), d.y.clone(), d.input_id.clone())
             for d in loader] for _ in range(n)]


def _same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for x, y in zip(ea, eb, strict=True):
            assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True))


KW = dict(num_neighbors=[4, 3], seed=3, superbatch_size=2)


@pytest.mark.parametrize("preset", ["baseline", "static", "ooc"])
def test_loaders_under_one_budget_share_one_stack_and_give_their_own_batches(graph, preset):
    """Three loaders under one budget: one set of readers and caches (the training loader
    runs the preset's schedule, the others read its caches), each loader's batches equal
    those it gives alone, and the caches fit what the budget leaves."""
    alone = {}
    for split, bs, shuffle in (("train", 64, True), ("val", 200, False), ("test", 200, False)):
        with ooc.NodeLoader(graph, input_nodes=split, batch_size=bs, shuffle=shuffle,
                            preset=preset, **KW) as loader:
            alone[split] = _epochs(loader)
    with ooc.memory_budget(budget_above(1 << 30)) as budget:
        val = ooc.NodeLoader(graph, input_nodes="val", batch_size=200, preset=preset, **KW)
        train = ooc.NodeLoader(graph, input_nodes="train", batch_size=64, shuffle=True,
                               preset=preset, **KW)
        test = ooc.NodeLoader(graph, input_nodes="test", batch_size=200, preset=preset, **KW)
    try:
        assert ooc.executor.loader.process_budget.current_budget() is None  # the block ended
        got = {"train": [], "val": [], "test": []}
        for _ in range(2):  # taking turns, as a training script does
            for split, loader in (("train", train), ("val", val), ("test", test)):
                got[split].append(_epochs(loader, 1)[0])
        for split in got:
            _same(got[split], alone[split])
        group = next(iter(budget._groups.values()))
        assert len(budget._groups) == 1 and len(group.members) == 3
        assert group.owner.shuffle  # the training loader runs the schedule
        assert train._source.pipeline() is group.stack.train
        assert val._source.pipeline() is not group.stack.train
        assert val._source.pipeline().cache is group.stack.train.cache
        assert val._source.pipeline().sampler.source is train._source.pipeline().sampler.source
        plan = train.memory_plan
        assert plan is val.memory_plan
        caches = plan.feature_cache_bytes + plan.neighbor_cache_bytes
        working = max(m.plan.working for m in group.members)
        assert plan.working == working
        assert caches <= budget.total - budget.reserve - working
        if preset != "baseline":
            assert caches > 0
    finally:
        for loader in (val, train, test):
            loader.close()
    assert not budget._groups and not list((graph.path / "runtime").glob("run*"))


@pytest.fixture(scope="module")
def wide_graph(tmp_path_factory):
    path = community_graph(tmp_path_factory.mktemp("budget") / "w", n=60000, dim=256)
    return ooc.open_dataset(path)


def test_the_budget_is_split_not_refused(wide_graph):
    """A budget that leaves room for a small cache: three loaders made under it all run, and
    their one feature cache is what the budget leaves (no more), where each loader given
    that budget on its own would plan a cache of the same room for itself alone."""
    graph = wide_graph
    with ooc.NodeLoader(graph, input_nodes="train", batch_size=64, preset="static",
                        memory_budget=budget_above(2 << 30), **KW) as probe:
        working = probe.memory_plan.working
    from ooc.executor.sizing.budget import default_reserve

    room = 32 * MiB  # the full caches take ~80 MiB; RSS moves by a few MiB between plans
    budget_bytes = working + room + 48 * MiB
    while budget_bytes - default_reserve(budget_bytes) < working + room:
        budget_bytes += MiB
    with ooc.memory_budget(budget_bytes) as budget:
        loaders = [ooc.NodeLoader(graph, input_nodes=s, batch_size=64, shuffle=s == "train",
                                  preset="static", **KW) for s in ("train", "val", "test")]
    try:
        for loader in loaders:
            assert sum(d.batch_size for d in loader) == len(loader.seeds)
        plan = loaders[0].memory_plan
        room = budget.total - budget.reserve - plan.working
        assert 0 < plan.feature_cache_bytes + plan.neighbor_cache_bytes <= room
        assert plan.feature_cache_bytes < graph.num_nodes * graph.layout.row_bytes  # not all
        assert plan.planned_peak_bytes <= budget.total - budget.reserve
    finally:
        for loader in loaders:
            loader.close()


def test_a_loader_that_alone_does_not_fit_is_refused_with_the_budget_that_works(graph):
    with ooc.memory_budget("64MiB"):
        with pytest.raises(BudgetError, match="smallest budget that works is"):
            ooc.NodeLoader(graph, input_nodes="train", batch_size=64, preset="static", **KW)


def test_epochs_at_once_warn_and_stay_correct(graph):
    """Two loaders iterating at once (the ``ooc`` owner changing the cache while the other
    reads hits from it): a warning says the split did not plan for it, and both loaders'
    batches are still exactly their own."""
    with ooc.NodeLoader(graph, input_nodes="val", batch_size=50, preset="ooc", **KW) as lone:
        ref_val = _epochs(lone, 1)[0]
    with ooc.memory_budget(budget_above(2 << 30)):
        train = ooc.NodeLoader(graph, input_nodes="train", batch_size=32, shuffle=True,
                               preset="ooc", **KW)
        val = ooc.NodeLoader(graph, input_nodes="val", batch_size=50, preset="ooc", **KW)
    with train, val, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(train)
        next(it)
        got = []
        for d in val:  # interleaved with the training epoch
            got.append((d.n_id.clone(), d.edge_index.clone(), d.x.clone(), d.y.clone(),
                        d.input_id.clone()))
            next(it, None)
        for _ in it:
            pass
    assert any("epochs at once" in str(w.message) for w in caught)
    _same([got], [ref_val])
    feats = np.asarray(graph.features.read(np.arange(graph.num_nodes)))
    for n_id, _, x, *_ in got:
        np.testing.assert_array_equal(x.numpy(), feats[n_id.numpy()])


@pytest.mark.parametrize("preset", ["static", "ooc"])
def test_num_workers_give_the_same_batches_on_that_many_threads(graph, preset):
    def gather_threads():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("ooc-gather"))

    ref = None
    for workers in (0, 1, 3):
        with ooc.NodeLoader(graph, input_nodes="train", batch_size=32, shuffle=True,
                            preset=preset, num_workers=workers, **KW) as loader:
            it = iter(loader)
            first = next(it)
            names = gather_threads()
            rest = list(it)
            batches = [first, *rest]
            got = [[(d.n_id, d.edge_index, d.x, d.y, d.input_id) for d in batches]]
        want = {0: 0, 1: 1, 3: 3 if preset == "static" else 1}[workers]
        assert len(names) == want, (workers, names)
        if ref is None:
            ref = got
        _same(got, ref)
    assert not gather_threads()


def test_worker_arguments_as_pyg_checks_them(graph):
    with pytest.raises(OocError, match="persistent_workers needs num_workers > 0"):
        ooc.NodeLoader(graph, input_nodes="train", num_workers=0, persistent_workers=True,
                       preset="baseline")
    for bad in (-1, 1.5, True):
        with pytest.raises(OocError, match="num_workers"):
            ooc.NodeLoader(graph, input_nodes="train", num_workers=bad, preset="baseline")
    with pytest.raises(OocError, match="memory budget"):
        ooc.memory_budget("lots").__enter__()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ooc.NodeLoader(graph, input_nodes="train", batch_size=64, pin_memory=True,
                            preset="baseline") as loader:
            data = next(iter(loader))
    if torch.cuda.is_available():
        assert data.x.is_pinned() and data.edge_index.is_pinned()
    else:
        assert any("pin_memory=True but no CUDA" in str(w.message) for w in caught)


def test_set_memory_budget_applies_until_removed(graph):
    try:
        assert ooc.set_memory_budget("1GiB").total == 1 << 30
        b = ooc.set_memory_budget(budget_above(1 << 30))
        assert b is not None and ooc.executor.loader.process_budget.current_budget() is b
        with ooc.memory_budget(budget_above(2 << 30)) as inner:
            loader = ooc.NodeLoader(graph, input_nodes="val", preset="baseline", **KW)
        assert loader._source.budget is inner
        loader.close()
        loader = ooc.NodeLoader(graph, input_nodes="val", preset="baseline", **KW)
        assert loader._source.budget is b
        loader.close()
    finally:
        ooc.set_memory_budget(None)
    assert ooc.executor.loader.process_budget.current_budget() is None


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ooc
    ooc.configure_process()
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GraphSAGE

    ds = ooc.open_dataset(sys.argv[1])
    torch.manual_seed(0)
    model = GraphSAGE(ds.feature_dim, 128, num_layers=2, out_channels=ds.num_classes,
                      dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    kw = dict(num_neighbors=[10, 10], num_workers=2, persistent_workers=True)
    labels = torch.as_tensor(np.array(ds.labels, dtype=np.int64))
    checks = 0

    def accuracy(loader):
        global checks
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for data in loader:
                assert torch.equal(data.y, labels[data.n_id])            # every node's label
                assert np.array_equal(loader.seeds[data.input_id.numpy()],
                                      data.n_id[:data.batch_size].numpy())  # PyG's input_id
                checks += 1
                pred = model(data.x, data.edge_index)[:data.batch_size].argmax(-1)
                correct += int((pred == data.y[:data.batch_size]).sum())
                total += data.batch_size
        return correct / total

    with ooc.memory_budget(sys.argv[2]):
        train = ooc.NodeLoader(ds, input_nodes="train", batch_size=128, shuffle=True, **kw)
        val = ooc.NodeLoader(ds, input_nodes="val", batch_size=512, **kw)
        test = ooc.NodeLoader(ds, input_nodes="test", batch_size=512, **kw)
    with train, val, test:
        for epoch in range(40):
            model.train()
            for data in train:
                opt.zero_grad()
                out = model(data.x, data.edge_index)[:data.batch_size]
                F.cross_entropy(out, data.y[:data.batch_size]).backward()
                opt.step()
            val_acc = accuracy(val)
        test_acc = accuracy(test)
        plan = train.memory_plan
        print(json.dumps({"val": val_acc, "test": test_acc, "checks": checks,
                          "planned_peak": plan.planned_peak_bytes,
                          "feature_cache_bytes": plan.feature_cache_bytes,
                          "peak_rss": ooc.core.memory.peak_rss_bytes()}))
""")


def test_a_users_script_with_three_loaders_under_one_budget(tmp_path):
    """The script a new user writes: training, validation and test loaders under one
    ``ooc.memory_budget``, two persistent workers each, stock GraphSAGE on Cora: test
    accuracy >= 0.78, ``data.y``/``n_id``/``input_id`` as in PyG, peak RSS in the budget."""
    from ooc.storage.ingest import ingest_planetoid

    raw = require_cora()
    ingest_planetoid(raw.parent.parent, "Cora", tmp_path / "cora")
    (tmp_path / "script.py").write_text(SCRIPT)
    budget = 1536 * MiB
    r = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path / "cora"),
                        str(budget)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["test"] >= 0.78, out
    assert out["checks"] > 0 and out["feature_cache_bytes"] > 0
    assert out["peak_rss"] <= budget, out
    assert not list((tmp_path / "cora" / "runtime").glob("run*"))
