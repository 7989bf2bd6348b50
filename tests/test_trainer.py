"""The training loop: learns a separable graph, resumes exactly, checkpoints load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ooc.executor import CheckpointError, TrainConfig, Trainer, load_model, to_data
from ooc.executor.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from ooc.sampling.sampler import NeighborSampler
from ooc.storage import OocError, csc_from_edges, open_dataset, write_dataset


def community_graph(path, n=600, classes=3, d=8, seed=0):
    """Edges mostly inside a class; features carry a weak class signal."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    src, dst = rng.integers(0, n, 24 * n), rng.integers(0, n, 24 * n)
    keep = (y[src] == y[dst]) | (rng.random(src.size) < 0.05)
    indptr, indices = csc_from_edges(src[keep], dst[keep], n)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[np.arange(n), y] += 1.0
    perm = rng.permutation(n)
    return write_dataset(path, indptr, indices, x, y, np.sort(perm[: n // 2]),
                         np.sort(perm[n // 2: 3 * n // 4]), np.sort(perm[3 * n // 4:]),
                         num_classes=classes)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return open_dataset(community_graph(tmp_path_factory.mktemp("g") / "g"))


def cfg(**kw):
    base = dict(model="sage", fanouts=[5, 5], batch_size=64, hidden=32, lr=0.01, epochs=4,
                seed=3, progress=False, device="cpu")
    return TrainConfig(**(base | kw))


def quiet(_msg):
    pass


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_learns_separable_graph(graph, kind):
    t = Trainer(graph, cfg(model=kind, epochs=8, lr=0.03), log=quiet)
    t.fit()
    losses = [r["loss"] for r in t.history]
    assert losses[-1] < losses[0] * 0.7
    assert t.evaluate(graph.test_idx) > 0.9
    assert all(r["val_acc"] is not None for r in t.history)
    for r in t.history:
        assert set(r["timers"]) >= {"sample", "gather", "transfer", "compute"}


def test_same_seed_same_losses(graph):
    a = Trainer(graph, cfg(), log=quiet)
    b = Trainer(graph, cfg(), log=quiet)
    a.fit()
    b.fit()
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]
    c = Trainer(graph, cfg(seed=4), log=quiet)
    c.fit()
    assert [r["loss"] for r in a.history] != [r["loss"] for r in c.history]


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_resume_equals_uninterrupted(graph, tmp_path, kind):
    full = Trainer(graph, cfg(model=kind, epochs=5), log=quiet)
    full.fit(checkpoint_dir=tmp_path / "full")
    assert [e for e, _ in list_checkpoints(tmp_path / "full")] == [1, 2, 3, 4, 5]

    first = Trainer(graph, cfg(model=kind, epochs=5), log=quiet)
    first.fit(epochs=2, checkpoint_dir=tmp_path / "part")
    # a fresh process-like start: other RNG use before resuming must not matter
    torch.manual_seed(999)
    np.random.seed(5)
    second = Trainer(graph, cfg(model=kind, epochs=5, seed=3), log=quiet)
    second.resume(latest_checkpoint(tmp_path / "part"))
    assert second.epoch == 2
    second.fit(checkpoint_dir=tmp_path / "part")
    assert [r["loss"] for r in second.history] == [r["loss"] for r in full.history]
    for p, q in zip(full.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert second.evaluate(graph.test_idx) == full.evaluate(graph.test_idx)


def test_checkpoint_contents_and_load_model(graph, tmp_path):
    t = Trainer(graph, cfg(epochs=1), log=quiet)
    t.fit(checkpoint_dir=tmp_path)
    path = tmp_path / "epoch_0001.pt"
    state = load_checkpoint(path)
    assert state["epoch"] == 1
    assert state["model_config"] == t.model.config
    assert state["optimizer_state"]["state"]
    assert {"torch", "numpy", "python"} <= set(state["rng"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    m = load_model(path)
    assert not m.training
    for k, v in t.model.state_dict().items():
        assert torch.equal(m.state_dict()[k], v)
    assert load_model(tmp_path).config == t.model.config  # a folder: the newest


def test_foreign_and_missing_checkpoints(graph, tmp_path):
    with pytest.raises(CheckpointError):
        latest_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError):
        latest_checkpoint(tmp_path)
    (tmp_path / "epoch_0001.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "epoch_0001.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "epoch_0002.pt")
    with pytest.raises(CheckpointError):
        load_model(tmp_path)
    # a real checkpoint of a different model does not resume into this one
    Trainer(graph, cfg(hidden=16, epochs=1), log=quiet).fit(checkpoint_dir=tmp_path / "o")
    t = Trainer(graph, cfg(), log=quiet)
    with pytest.raises(OocError, match="different model"):
        t.resume(latest_checkpoint(tmp_path / "o"))


def test_to_data_conventions(graph):
    sampler = NeighborSampler(graph.indptr, graph.indices, [3, 2])
    batch = sampler.sample(np.asarray(graph.train_idx[:16]), 1)
    x = graph.features.read(batch.node_ids)
    data = to_data(batch, x, np.asarray(graph.labels)[batch.node_ids])
    assert data.batch_size == batch.num_seeds == 16
    assert data.x.dtype == torch.float32 and data.x.shape == (len(batch.node_ids), 8)
    assert data.y.shape == (len(batch.node_ids),)          # every node's, seeds first
    assert torch.equal(data.n_id[:16], torch.as_tensor(batch.node_ids[:16]))
    assert sum(data.num_sampled_nodes) == data.num_nodes
    assert sum(data.num_sampled_edges) == data.edge_index.size(1)


def test_config_errors(graph):
    for bad in (dict(fanouts=[]), dict(fanouts=[0, 3]), dict(batch_size=0), dict(lr=0.0),
                dict(mode="nope")):
        with pytest.raises(OocError):
            Trainer(graph, cfg(**bad), log=quiet)


def test_unknown_setting_names_the_closest():
    """``TrainConfig(epochz=3)`` once raised a bare TypeError where NodeLoader raised
    InvalidValue: both are now an UnknownSetting (an InvalidValue and a TypeError) naming
    the keyword and the closest setting."""
    from ooc import NodeLoader
    from ooc.core.errors import InvalidValue, UnknownSetting
    from ooc.executor.loader.stack import ModeOptions

    for make, msg in ((lambda: TrainConfig(epochz=3),
                       r"^TrainConfig: no setting 'epochz' \(did you mean epochs\?\)$"),
                      (lambda: ModeOptions(read_gapp=0),
                       r"^ModeOptions: no setting 'read_gapp' \(did you mean read_gap\?\)$"),
                      (lambda: NodeLoader(None, [5], batchsize=8),
                       r"^NodeLoader: no setting 'batchsize' \(did you mean batch_size\?\)$"),
                      (lambda: NodeLoader(None, [5], zzzz=8),
                       r"^NodeLoader: no setting 'zzzz' \(the settings: dataset, num_neigh")):
        with pytest.raises(UnknownSetting, match=msg) as e:
            make()
        assert isinstance(e.value, InvalidValue) and isinstance(e.value, TypeError)


def test_trainer_takes_a_folder_as_nodeloader_does(graph):
    """``Trainer("path", cfg)`` once failed on ``str.num_classes``; a folder is opened, as
    NodeLoader opens one, and anything else is one line saying what to pass."""
    t = Trainer(str(graph.path), cfg(epochs=1), log=quiet)
    try:
        assert t.dataset.path == graph.path and t.dataset.num_nodes == graph.num_nodes
        t.train_epoch()
    finally:
        t.close()
    with pytest.raises(OocError, match=r"^Trainer: dataset must be a dataset folder or an "
                                       r"opened dataset \(ooc.open_dataset\(path\)\), not int$"):
        Trainer(42, cfg(), log=quiet)
    with pytest.raises(OocError, match=r"^Trainer: config must be a TrainConfig, not dict$"):
        Trainer(graph, {"epochs": 1}, log=quiet)


def test_no_labelled_training_node_is_refused_before_training(tmp_path):
    """Training nodes all labelled -1 once trained to a NaN loss and blamed non-finite
    features or --lr; refused up front naming the training split."""
    path = community_graph(tmp_path / "g", n=60)
    ds = open_dataset(path)
    y = np.asarray(ds.labels).copy()
    y[np.asarray(ds.train_idx)] = -1
    bare = write_dataset(tmp_path / "u", ds.indptr, np.asarray(ds.indices),
                         ds.features.read(np.arange(60)), y, ds.train_idx, ds.val_idx,
                         ds.test_idx, num_classes=3)
    with pytest.raises(OocError, match=r"u: no labelled node in the training split \(its 30 "
                                       r"nodes are all labelled -1 in labels.npy\)"):
        Trainer(bare, cfg(), log=quiet)
