"""Synthetic generator: valid, deterministic, power-law, homophilous, bounded."""
import numpy as np
import pytest

from ooc.storage import OocError, open_dataset
from ooc.storage.ingest import generate_synthetic


def _files(path):
    """Every file's bytes but meta.json's and the ownership marker's (its token is random)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())
            if p.name not in ("meta.json", ".ooc-made")}


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    out = tmp_path_factory.mktemp("syn") / "g"
    return generate_synthetic(out, nodes=3000, avg_degree=12, feature_dim=16, classes=4, seed=3,
                              progress=False)


def test_valid_and_shaped(syn):
    ds = open_dataset(syn, verify=True)
    assert ds.num_nodes == 3000 and ds.feature_dim == 16 and ds.num_classes == 4
    assert 0.8 * 3000 * 12 < ds.num_edges <= 3000 * 12
    assert ds.meta["directed"] is False
    deg = ds.in_degrees()
    assert deg.min() >= 1                     # no isolated nodes
    assert deg.max() > 8 * deg.mean()         # skewed (power-law-like) degrees
    dst = np.repeat(np.arange(ds.num_nodes), deg)
    src = np.asarray(ds.indices, dtype=np.int64)
    assert not np.any(src == dst)             # no self loops
    key = dst * ds.num_nodes + src
    assert np.all(np.diff(key) > 0)           # sorted, no duplicates
    assert np.array_equal(np.sort(key), np.sort(src * ds.num_nodes + dst))  # symmetric
    y = np.asarray(ds.labels)
    assert np.array_equal(np.bincount(y), [750] * 4)
    assert (y[src] == y[dst]).mean() > 0.75   # community structure
    n_tr, n_va, n_te = len(ds.train_idx), len(ds.val_idx), len(ds.test_idx)
    assert abs(n_tr - 300) < 60 and abs(n_va - 150) < 45 and n_tr + n_va + n_te == 3000
    assert not set(ds.train_idx) & set(ds.test_idx)


def test_features_weak_alone_strong_with_neighbours(syn):
    ds = open_dataset(syn)
    x = ds.features.read(np.arange(ds.num_nodes)).astype(np.float64)
    y = np.asarray(ds.labels)
    deg = ds.in_degrees()
    dst = np.repeat(np.arange(ds.num_nodes), deg)
    agg = np.zeros_like(x)
    np.add.at(agg, dst, x[np.asarray(ds.indices)])
    agg /= deg[:, None]
    tr, te = ds.train_idx, ds.test_idx

    def ncm(f):  # nearest class mean, fitted on train
        mu = np.stack([f[tr][y[tr] == c].mean(0) for c in range(4)])
        return (np.argmin(((f[te][:, None] - mu[None]) ** 2).sum(-1), 1) == y[te]).mean()

    alone, with_nb = ncm(x), ncm(x + agg)
    assert 0.3 < alone < 0.8
    assert with_nb > alone + 0.1


def test_deterministic(tmp_path, syn, monkeypatch):
    """The same seed gives the same files whatever the windows and the chunks in which the
    labels and the splits are made."""
    import ooc.storage.ingest.synthetic as synthetic

    monkeypatch.setattr(synthetic, "LABEL_STEP", 7)
    a = generate_synthetic(tmp_path / "a", nodes=3000, avg_degree=12, feature_dim=16, classes=4,
                           seed=3, progress=False, buffer_bytes=16 << 10)  # many windows, same result
    assert _files(a) == _files(syn)
    monkeypatch.undo()
    b = generate_synthetic(tmp_path / "b", nodes=3000, avg_degree=12, feature_dim=16, classes=4,
                           seed=4, progress=False)
    assert _files(b)["indices.bin"] != _files(syn)["indices.bin"]


def test_directed_float16(tmp_path):
    p = generate_synthetic(tmp_path / "d", nodes=1000, avg_degree=5, feature_dim=130, classes=3,
                           dtype="float16", undirected=False, train_fraction=0.5, val_fraction=0.2,
                           test_fraction=0.1, progress=False)
    ds = open_dataset(p, verify=True)
    assert ds.meta["directed"] is True and ds.feature_dtype == np.float16
    assert 0.9 * 5000 < ds.num_edges <= 5000
    assert abs(len(ds.test_idx) - 100) < 40


@pytest.mark.parametrize("kw,match", [({"nodes": 1}, "nodes"), ({"classes": 0}, "classes"),
                                      ({"dtype": "int8"}, "dtype"), ({"train_fraction": 0.9,
                                                                      "val_fraction": 0.3}, "fractions")])
def test_bad_arguments(tmp_path, kw, match):
    with pytest.raises(OocError, match=match):
        generate_synthetic(tmp_path / "x", **{"nodes": 100, **kw}, progress=False)
    assert not (tmp_path / "x").exists()


def test_many_small_communities(tmp_path):
    """``community_size``: ~N/K communities hidden by the id permutation; most edges stay
    inside one (p_in), a label is the community modulo the classes, and the ids carry no
    trace of the communities (neighbouring ids are not in one community more than chance)."""
    from ooc.storage.ingest.synthetic import SyntheticEdges, communities_of

    n, k, classes = 6000, 50, 7
    ds = open_dataset(generate_synthetic(tmp_path / "c", nodes=n, avg_degree=10, feature_dim=8,
                                         classes=classes, community_size=k, p_in=0.8, seed=5,
                                         progress=False))
    ncomm = communities_of(n, classes, k)
    assert ncomm == n // k == ds.meta["source"]["communities"]
    perm = SyntheticEdges(n, 1, classes, 0.8, 5, communities=ncomm).perm
    rank = np.empty(n, dtype=np.int64)
    rank[perm] = np.arange(n)
    comm = rank % ncomm                                      # community of every output id
    assert np.bincount(comm, minlength=ncomm).max() <= k     # ~K members each
    np.testing.assert_array_equal(ds.labels, comm % classes)
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    dst = np.repeat(np.arange(n), np.diff(indptr))
    inside = (comm[indices] == comm[dst]).mean()
    assert inside > 0.6, inside                             # chance would be 1 / 120
    assert (comm[:-1] == comm[1:]).mean() < 0.05             # ids hide the communities


def test_bad_community_size(tmp_path):
    with pytest.raises(OocError, match="^community_size must be"):
        generate_synthetic(tmp_path / "x", nodes=100, community_size=0, progress=False)
    assert not (tmp_path / "x").exists()
