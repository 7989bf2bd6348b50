"""Edge splits for link prediction at ingest (ooc.storage.link_split)."""
import gzip

import numpy as np
import pytest
import torch

from ooc.prepare import main as prepare_main
from ooc.storage import open_dataset
from ooc.storage.ingest import ingest_edgelist, ingest_ogb
from ooc.storage.link_split import LinkSplitSpec

N = 200


def _pairs(ds):
    """Every (source, target) of the stored adjacency, from the CSC arrays."""
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return np.asarray(ds.indices, dtype=np.int64), dst


def _edges(tmp_path, rng, m=1500):
    s, d = rng.integers(0, N, m), rng.integers(0, N, m)
    f = tmp_path / "edges.npy"
    np.save(f, np.stack([s, d]))
    return f, s, d


@pytest.mark.parametrize("buffer", [1 << 20, 2048])
def test_fraction_split_no_leak(tmp_path, buffer):
    rng = np.random.default_rng(1)
    f, s, d = _edges(tmp_path, rng)
    spec = LinkSplitSpec(val=0.1, test=0.2, seed=3, num_neg=4)
    out = ingest_edgelist(f, tmp_path / "ds", undirected=True, dedup=True, progress=False,
                          buffer_bytes=max(buffer, 1 << 16), link_split=spec)
    ds = open_dataset(out, verify=True)
    ls = ds.link_split
    # reference: the undirected, deduplicated pair set without self-loops
    full = {(min(a, b), max(a, b)) for a, b in zip(s.tolist(), d.tolist(), strict=True) if a != b}
    val = {(int(a), int(b)) for a, b in ls.val_edges.T}
    test = {(int(a), int(b)) for a, b in ls.test_edges.T}
    assert val and test and not (val & test)
    assert val | test <= full
    assert all(a < b for a, b in val | test)
    src, dst = _pairs(ds)
    kept = set(zip(src.tolist(), dst.tolist(), strict=True))
    for a, b in val | test:  # held out in both directions
        assert (a, b) not in kept and (b, a) not in kept
    kept_pairs = {(min(a, b), max(a, b)) for a, b in kept if a != b}
    assert kept_pairs | val | test == full  # nothing else removed
    assert abs(len(val) / len(full) - 0.1) < 0.05 and abs(len(test) / len(full) - 0.2) < 0.06
    assert ls.val_neg.shape == (len(val), 4) and ls.test_neg.shape == (len(test), 4)
    assert ls.test_neg.min() >= 0 and ls.test_neg.max() < N
    assert ds.meta["link_split"]["num_test"] == len(test)
    assert ds.num_edges == len(src)
    # seeded: the same split again, another seed another
    again = open_dataset(ingest_edgelist(f, tmp_path / "ds2", undirected=True, dedup=True,
                                         progress=False, link_split=LinkSplitSpec(
                                             val=0.1, test=0.2, seed=3, num_neg=4)))
    np.testing.assert_array_equal(again.link_split.test_edges, ls.test_edges)
    np.testing.assert_array_equal(again.link_split.test_neg, ls.test_neg)
    other = open_dataset(ingest_edgelist(f, tmp_path / "ds3", undirected=True, dedup=True,
                                         progress=False, link_split=LinkSplitSpec(
                                             val=0.1, test=0.2, seed=4)))
    assert not np.array_equal(other.link_split.test_edges, ls.test_edges)


def test_given_edges_and_negatives(tmp_path):
    rng = np.random.default_rng(2)
    f, s, d = _edges(tmp_path, rng)
    val = np.stack([s[:20], d[:20]])
    test = np.stack([d[20:50], s[20:50]])  # given reversed: still removed both ways
    neg = rng.integers(0, N, (30, 5))
    for name, a in (("v", val), ("t", test), ("tn", neg)):
        np.save(tmp_path / f"{name}.npy", a)
    rc = prepare_main(["edgelist", str(f), "--out", str(tmp_path / "ds"), "--undirected",
                       "--val-edges", str(tmp_path / "v.npy"), "--test-edges",
                       str(tmp_path / "t.npy"), "--test-neg", str(tmp_path / "tn.npy"),
                       "--num-neg", "2", "--no-progress"])
    assert rc == 0
    ds = open_dataset(tmp_path / "ds")
    ls = ds.link_split
    np.testing.assert_array_equal(ls.val_edges, val)
    np.testing.assert_array_equal(ls.test_edges, test)
    np.testing.assert_array_equal(ls.test_neg, neg)
    assert ls.val_neg.shape == (20, 2)
    src, dst = _pairs(ds)
    held = {(min(a, b), max(a, b)) for a, b in np.concatenate([val, test], 1).T.tolist()}
    assert not any((min(a, b), max(a, b)) in held for a, b in zip(src.tolist(), dst.tolist(),
                                                                   strict=True))
    # every other input edge stays, both ways
    kept = set(zip(src.tolist(), dst.tolist(), strict=True))
    for a, b in zip(s.tolist(), d.tolist(), strict=True):
        if (min(a, b), max(a, b)) not in held:
            assert (a, b) in kept and (b, a) in kept


def test_bad_split_options(tmp_path, capsys):
    rng = np.random.default_rng(3)
    f, s, d = _edges(tmp_path, rng)
    np.save(tmp_path / "bad.npy", np.zeros((3, 4), np.int64))
    np.save(tmp_path / "far.npy", np.full((2, 3), N + 5, np.int64))
    for extra, says in ((["--link-split", "0.6,0.5"], "VAL + TEST"),
                        (["--val-edges", str(tmp_path / "bad.npy")], "[2, k]"),
                        (["--val-edges", str(tmp_path / "far.npy")], "out of range"),
                        (["--val-edges", str(tmp_path / "nope.npy")], "not found"),
                        (["--link-split", "x"], "VAL,TEST")):
        with pytest.raises(SystemExit) as e:
            prepare_main(["edgelist", str(f), "--out", str(tmp_path / "ds"), "--no-progress",
                          "--num-nodes", str(N), *extra])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def _gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def test_ogb_link_layout_replica(tmp_path):
    """A replica of an ogbl-citation2 folder: the graph holds the training edges, the split
    dicts (source_node, target_node, target_node_neg) hold validation and test."""
    rng = np.random.default_rng(4)
    root = tmp_path / "ogbl_tiny"
    s, d = rng.integers(0, N, 800), rng.integers(0, N, 800)
    _gz(root / "raw" / "edge.csv.gz", [f"{a},{b}" for a, b in zip(s, d, strict=True)])
    _gz(root / "raw" / "node-feat.csv.gz", [",".join(["0.5", "1.0"]) for _ in range(N)])
    _gz(root / "raw" / "num-node-list.csv.gz", [str(N)])
    parts = {}
    for k, (a, b) in (("train", (0, 600)), ("valid", (600, 700)), ("test", (700, 800))):
        parts[k] = {"source_node": torch.from_numpy(s[a:b]), "target_node": torch.from_numpy(d[a:b]),
                    "target_node_neg": torch.from_numpy(rng.integers(0, N, (b - a, 7)))}
        (root / "split" / "time").mkdir(parents=True, exist_ok=True)
        torch.save(parts[k], root / "split" / "time" / f"{k}.pt")
    ds = open_dataset(ingest_ogb(root, tmp_path / "ds", undirected=True, progress=False))
    ls = ds.link_split
    for part, k in (("val", "valid"), ("test", "test")):
        e, g = ls.edges(part)
        np.testing.assert_array_equal(e, np.stack([parts[k]["source_node"].numpy(),
                                                   parts[k]["target_node"].numpy()]))
        np.testing.assert_array_equal(g, parts[k]["target_node_neg"].numpy())
    assert ls.info["method"] == "given"
    held = {(min(a, b), max(a, b)) for a, b in zip(s[600:].tolist(), d[600:].tolist(), strict=True)}
    src, dst = _pairs(ds)
    assert not any((min(a, b), max(a, b)) in held for a, b in zip(src.tolist(), dst.tolist(),
                                                                   strict=True))
    assert len(ds.train_idx) == 0


def test_a_corrupted_split_file_is_one_line(tmp_path):
    from ooc.storage import DatasetError

    rng = np.random.default_rng(5)
    f, _, _ = _edges(tmp_path, rng)
    out = ingest_edgelist(f, tmp_path / "ds", undirected=True, progress=False,
                          link_split=LinkSplitSpec(val=0.1, test=0.1))
    p = out / "test_edges.npy"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="test_edges.npy: checksum does not match"):
        open_dataset(out).link_split  # noqa: B018 - the property loads and checks
