"""The memory planner charges what grows with the classes, the hidden size, the fanouts
and the batch: a step that cannot fit is refused in one line naming a batch size that
does (and that batch size then runs within the budget), the probe leaves the model as it
was, and the planned peak is close to the measured one."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_budget import _train  # ooc.train in a memory cgroup with a psutil RSS sampler

from ooc.executor.sizing.budget import plan_memory
from ooc.executor.sizing.step_memory import layer_work, step_bytes
from ooc.executor.training.models import build_model
from ooc.executor.training.trainer import TrainConfig
from ooc.storage import csc_from_edges, open_dataset, write_dataset

MiB = 1 << 20


def _many_classes(out: Path, classes: int, n: int = 2000) -> Path:
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, n, 16 * n), rng.integers(0, n, 16 * n)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    perm = rng.permutation(n)
    return write_dataset(out, indptr, indices, x, rng.integers(0, classes, n), perm[:1000],
                         perm[1000:1500], perm[1500:], num_classes=classes)


@pytest.fixture(scope="module")
def classes_64k(tmp_path_factory) -> Path:
    return _many_classes(tmp_path_factory.mktemp("c") / "d", 1 << 16)


def test_layer_work_follows_the_forward_pass():
    # hops: 4 seeds, 20 at hop 1, 60 at hop 2; edges 20 into the seeds, 60 into hop 1;
    # SAGE/GAT write the rows the next layer reads, GCN every row it reads
    assert layer_work([4, 20, 60], [20, 60], 2) == [(84, 24, 80), (24, 4, 20)]
    assert layer_work([4, 20, 60], [20, 60], 2, bipartite=False) == [(84, 84, 80), (24, 24, 20)]


def test_estimate_charges_the_output_layer_and_the_optimizer():
    m = build_model("sage", 32, 16, 1 << 16, 2)
    est = step_bytes(m, [64, 320, 1600], [320, 1600], 64)
    p = sum(t.numel() for t in m.parameters())
    big = max(t.numel() for t in m.parameters())
    assert est.optimizer == 4 * (3 * p + 2 * big)
    assert est.logits == 3 * 64 * (1 << 16) * 4        # rows the last layer writes (seeds) x C
    assert est.loss == 3 * 64 * (1 << 16) * 4
    ev = step_bytes(m, [64, 320, 1600], [320, 1600], 64, train=False)
    assert ev.optimizer == 0 and ev.total < est.total
    assert step_bytes(torch.nn.Linear(2, 2), [1], [], 1) is None


def test_probe_leaves_the_model_as_it_was(classes_64k):
    ds = open_dataset(classes_64k)
    config = TrainConfig(fanouts=[5, 5], batch_size=64, hidden=16, device="cpu",
                         mode="baseline")
    torch.manual_seed(0)
    model = build_model("sage", ds.feature_dim, 16, ds.num_classes, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    plan = plan_memory(ds, config, 2048 * MiB, model=model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert torch.equal(rng, torch.get_rng_state())
    assert plan.step_estimate["logits"] > 0
    assert plan.planned_peak_bytes == plan.working + plan.feature_cache_bytes \
        + plan.neighbor_cache_bytes


def test_huge_class_count_is_refused_with_a_batch_size_that_runs(classes_64k, tmp_path):
    rc, out, _, _ = _train(classes_64k, "--mode", "baseline", "--batch-size", "1024",
                           "--memory-budget", "1GiB")
    assert rc == 2, out
    line = out.strip().splitlines()[-1]
    assert line.startswith("ooc: --memory-budget 1.0 GiB is below") and "Traceback" not in out
    assert "one training step on a batch of 1024 seeds" in line and "logits" in line
    fit = int(re.search(r"--batch-size (\d+) would fit", line).group(1))
    assert 1 <= fit < 1024
    rep = tmp_path / "r.json"
    rc, out, sampled, cg = _train(classes_64k, "--mode", "baseline", "--batch-size", str(fit),
                                  "--memory-budget", "1GiB", "--epochs", "1",
                                  "--report", str(rep), cgroup_limit=1 << 30)
    assert rc == 0, out[-2000:]
    r = json.loads(rep.read_text())
    assert r["peak_rss_bytes"] <= 1 << 30 and sampled <= 1 << 30
    assert cg["max_usage_in_bytes"] <= 1 << 30, cg


def test_a_million_classes_at_two_gib_is_refused_in_one_line(tmp_path):
    data = _many_classes(tmp_path / "m", 1 << 20, n=600)
    rc, out, _, cg = _train(data, "--mode", "baseline", "--hidden", "128",
                            "--memory-budget", "2GiB", cgroup_limit=2 << 30)
    assert rc == 2, out[-2000:]
    line = out.strip().splitlines()[-1]
    assert line.startswith("ooc: --memory-budget 2.0 GiB is below") and "Traceback" not in out
    assert "one training step" in line and "the smallest budget that works is" in line
    assert cg["max_usage_in_bytes"] <= 2 << 30, cg


def test_planned_peak_is_close_to_the_measured_peak(classes_64k, tmp_path):
    rep = tmp_path / "r.json"
    rc, out, _, _ = _train(classes_64k, "--mode", "ooc", "--batch-size", "64", "--epochs", "1",
                           "--memory-budget", "1GiB", "--report", str(rep))
    assert rc == 0, out[-2000:]
    r = json.loads(rep.read_text())
    planned, peak = r["memory_plan"]["planned_peak_bytes"], r["peak_rss_bytes"]
    assert abs(planned - peak) <= 0.1 * peak, (planned / MiB, peak / MiB)


@pytest.fixture(scope="module")
def wide_graph(tmp_path_factory) -> Path:
    """200k nodes, 12 in-edges each, 64 dims: batches of tens of thousands of nodes."""
    rng = np.random.default_rng(1)
    n = 200_000
    src, dst = rng.integers(0, n, 12 * n), np.repeat(np.arange(n), 12)
    indptr, indices = csc_from_edges(src, dst, n)
    x = rng.standard_normal((n, 64)).astype(np.float32)
    perm = rng.permutation(n)
    return write_dataset(tmp_path_factory.mktemp("w") / "d", indptr, indices, x,
                         rng.integers(0, 8, n), perm[:20000], perm[20000:21000],
                         perm[21000:22000], num_classes=8)


@pytest.mark.parametrize("kind,batch", [("sage", 512), ("gcn", 512), ("gat", 128)])
def test_estimate_bounds_the_measured_step(wide_graph, kind, batch):
    """The estimate is at least the step's measured RSS peak above what the batch holds
    (the gate runs a step only when its estimate fits) and at most 2x it (a looser one
    refuses batches that fit)."""
    import gc

    from ooc.core.memory import current_rss_bytes, peak_rss_bytes, reset_peak_rss, trim_malloc
    from ooc.executor.sizing.budget import _probe_step
    from ooc.sampling.sampler import NeighborSampler, derive_seed, epoch_batches

    ds = open_dataset(wide_graph)
    torch.manual_seed(0)
    model = build_model(kind, ds.feature_dim, 256, ds.num_classes, 3)
    sampler = NeighborSampler(ds.node_offsets(), ds.indices, [15, 10, 5])
    seeds = epoch_batches(ds.train_idx, batch, 0, 1, shuffle=True)[:2]
    b = sampler.sample_many(seeds, [derive_seed(0, 1, i) for i in range(2)])
    rows = [ds.features.read(s.node_ids) for s in b]
    _probe_step(model, b[1], rows[1], ds)          # torch's first-call allocations
    gc.collect()
    trim_malloc()
    base = current_rss_bytes()
    assert reset_peak_rss(), "this kernel cannot reset the RSS high-water mark"
    _probe_step(model, b[0], rows[0], ds)
    measured = peak_rss_bytes() - base
    est = step_bytes(model, b[0].num_sampled_nodes, b[0].num_sampled_edges, batch).total
    assert measured > 20 * MiB, measured                # a step large enough to measure
    assert measured <= est <= 2 * measured, (kind, est / MiB, measured / MiB)
