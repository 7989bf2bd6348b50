"""Partitioning: ownership, full in-neighbour replication, L-hop halos,
feature split, metrics computed independently, the two-community split, bad
input."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import random_graph

from ooc.partition import ALGORITHMS, partition, partition_dataset, split
from ooc.partition.__main__ import main
from ooc.storage import csc_from_edges, entries, open_dataset, write_dataset


def _check_node_data(src, d, gids, n_own: int, owned_mask, s_x, s_y) -> None:
    """Partition ``d`` (local ids ``gids``, the first ``n_own`` owned): the
    features of every node, the labels of owned nodes (-1 elsewhere), the
    source splits restricted to owned nodes (``owned_mask`` [N])."""
    np.testing.assert_array_equal(d.features.read(np.arange(d.num_nodes)), s_x[gids])
    np.testing.assert_array_equal(np.asarray(d.labels)[:n_own], s_y[gids[:n_own]])
    assert np.all(np.asarray(d.labels)[n_own:] == -1)
    for name in ("train_idx", "val_idx", "test_idx"):
        local = getattr(d, name)
        assert np.all(local < n_own)
        glob = getattr(src, name)
        np.testing.assert_array_equal(gids[local], glob[owned_mask[glob]])


def _check_partitions(src_path: Path, out: Path, report: dict) -> None:
    """Every invariant of a partition output, checked against the source."""
    src = open_dataset(src_path)
    n = src.num_nodes
    s_indptr, s_indices = src.indptr, np.asarray(src.indices)
    s_x = src.features.read(np.arange(n))
    s_y = np.asarray(src.labels)
    p = report["p"]
    owner = np.load(out / "owner.npy")
    assert owner.dtype == np.int32 and owner.shape == (n,)
    assert owner.min() >= 0 and owner.max() < p
    meta = json.loads((out / "partition.json").read_text())
    assert meta["p"] == p and len(meta["parts"]) == p
    seen = np.zeros(n, dtype=np.int64)
    total_nodes = 0
    for q in range(p):
        d = open_dataset(out / f"part_{q:03d}", verify=True)
        gids = np.load(d.path / "global_ids.npy")
        n_own = d.meta["partition"]["num_owned"]
        assert gids.shape == (d.num_nodes,)
        assert len(np.unique(gids)) == gids.size
        owned, reps = gids[:n_own], gids[n_own:]
        assert np.all(owner[owned] == q)
        assert np.all(owner[reps] != q)
        seen[owned] += 1
        total_nodes += d.num_nodes
        # full in-neighbour list of every owned node, in source order
        for v in range(n_own):
            g = gids[v]
            local = np.asarray(d.indices[d.indptr[v]:d.indptr[v + 1]])
            np.testing.assert_array_equal(gids[local], s_indices[s_indptr[g]:s_indptr[g + 1]])
        # replicas have empty in-lists and are exactly the needed neighbours
        assert np.all(np.diff(d.indptr)[n_own:] == 0)
        needed = set()
        for g in owned:
            needed.update(s_indices[s_indptr[g]:s_indptr[g + 1]].tolist())
        assert set(reps.tolist()) == needed - set(owned.tolist())
        _check_node_data(src, d, gids, n_own, owner == q, s_x, s_y)
    assert np.all(seen == 1), "every node owned by exactly one partition"
    # replication factor, independently: distinct (node, partition) pairs
    dst = np.repeat(np.arange(n), np.diff(s_indptr))
    pairs = np.unique(np.stack([s_indices, owner[dst]]), axis=1)
    rep_pairs = int(np.count_nonzero(owner[pairs[0]] != pairs[1]))
    rf = (n + rep_pairs) / n
    assert report["replication_factor"] == pytest.approx(rf)
    assert report["replication_factor"] == pytest.approx(total_nodes / n)
    assert report["edge_cut"] == int(np.count_nonzero(owner[s_indices] != owner[dst]))
    owned_counts = np.bincount(owner, minlength=p)
    assert report["node_balance"] == pytest.approx(owned_counts.max() / (n / p))
    edges = np.bincount(owner[dst], minlength=p)
    assert report["edge_balance"] == pytest.approx(edges.max() / (src.num_edges / p))


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_all_algorithms_full_replication(small_dataset, tmp_path, algo):
    path, _ = small_dataset
    out = tmp_path / f"out_{algo}"
    report = partition_dataset(path, out, 3, algo, seed=1, chunk_edges=700)
    assert report["algo"] == algo
    for key in ("replication_factor", "node_balance", "edge_balance", "edge_cut", "time_s",
                "peak_rss_bytes"):
        assert key in report
    _check_partitions(path, out, report)


def _two_communities(tmp_path: Path) -> tuple[Path, int]:
    """Two dense random communities of 60 nodes, one edge between them (both
    directions), the bridge between the lowest-degree nodes."""
    rng = np.random.default_rng(5)
    m = 60
    src, dst = [], []
    for base in (0, m):
        a = rng.random((m, m)) < 0.3
        a = np.triu(a, 1)
        a = a | a.T
        s, d = np.nonzero(a)
        src.append(s + base)
        dst.append(d + base)
    src, dst = np.concatenate(src), np.concatenate(dst)
    deg = np.bincount(dst, minlength=2 * m)
    u = int(np.argmin(deg[:m]))
    v = m + int(np.argmin(deg[m:]))
    src = np.concatenate([src, [u, v]])
    dst = np.concatenate([dst, [v, u]])
    # shuffle node ids so the communities are not id ranges
    perm = rng.permutation(2 * m)
    indptr, indices = csc_from_edges(perm[src], perm[dst], 2 * m)
    x = rng.standard_normal((2 * m, 4)).astype(np.float32)
    path = write_dataset(tmp_path / "two", indptr, indices, x)
    return path, perm


@pytest.mark.parametrize("merge", ["vote", "richest"])
def test_spring_splits_two_communities(tmp_path, merge):
    path, perm = _two_communities(tmp_path)
    a = partition(path, 2, "spring", merge=merge)
    comm = np.empty(120, dtype=np.int64)
    comm[perm] = np.arange(120) // 60
    side0 = np.unique(a.owner[comm == 0])
    side1 = np.unique(a.owner[comm == 1])
    assert side0.size == 1 and side1.size == 1 and side0[0] != side1[0]
    report = partition_dataset(path, tmp_path / "out", 2, "spring", merge=merge)
    assert report["edge_cut"] == 2
    assert report["replication_factor"] == pytest.approx(122 / 120)
    _check_partitions(path, tmp_path / "out", report)


def test_spring_is_deterministic(small_dataset):
    path, _ = small_dataset
    a = partition(path, 4, "spring", seed=3)
    b = partition(path, 4, "spring", seed=3)
    np.testing.assert_array_equal(a.owner, b.owner)
    assert np.bincount(a.owner, minlength=4).min() > 0


def test_cli_writes_report(small_dataset, tmp_path, capsys):
    path, _ = small_dataset
    rep = tmp_path / "r.json"
    rc = main(["--data", str(path), "--parts", "2", "--algo", "hdrf", "--out",
               str(tmp_path / "o"), "--report", str(rep), "--quiet"])
    assert rc == 0
    r = json.loads(rep.read_text())
    for key in ("replication_factor", "node_balance", "edge_balance", "edge_cut", "time_s",
                "peak_rss_bytes"):
        assert key in r
    # stdout is one summary line with the figures of the report (JSON only with --report)
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and line.startswith("ooc.partition: hdrf -> 2 partitions in ")
    assert f"replication factor {r['replication_factor']:.3f}" in line
    # --no-split writes only the assignment
    rc = main(["--data", str(path), "--parts", "2", "--out", str(tmp_path / "o2"),
               "--no-split", "--quiet"])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "o2").iterdir()) == [".ooc-made", "owner.npy",
                                                                   "partition.json"]


def _fails(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1
    return err


@pytest.mark.parametrize("extra,needle", [
    (["--parts", "0"], "--parts"),
    (["--parts", "-3"], "--parts"),
    (["--parts", "501"], "exceeds"),
    (["--parts", "2", "--beta", "0.9"], "--beta"),
    (["--parts", "2", "--beta", "inf"], "--beta inf: must be a finite number >= 1"),
    (["--parts", "2", "--beta", "nan"], "--beta nan: must be a finite number >= 1"),
    (["--parts", "2", "--tau-factor", "-1"], "--tau-factor -1.0: must be a finite number > 0"),
    (["--parts", "2", "--tau-factor", "nan"], "--tau-factor nan: must be a finite number > 0"),
    (["--parts", "2", "--tau-vol", "-5"], "--tau-vol -5.0: must be a finite number > 0"),
    (["--parts", "2", "--tau-vol", "0"], "--tau-vol 0.0: must be a finite number > 0"),
    (["--parts", "2", "--stream-iters", "0"], "--stream-iters"),
    (["--parts", "2", "--halo-hops", "0"], "--halo-hops"),
    (["--parts", "2", "--refine-passes", "-1"], "--refine-passes"),
    (["--parts", "2", "--algo", "greedy", "--merge", "richest"], "--merge applies to --algo spring"),
    (["--parts", "2", "--algo", "hdrf", "--tau-factor", "0.2"], "--tau-factor applies"),
    (["--parts", "2", "--ownership", "last"], "--ownership applies to the edge partitioners"),
])
def test_bad_arguments(small_dataset, tmp_path, capsys, extra, needle):
    path, _ = small_dataset
    out = tmp_path / "o"
    err = _fails(["--data", str(path), "--out", str(out), "--quiet", *extra], capsys)
    assert needle in err
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".o")] == []


@pytest.mark.parametrize("kw,needle", [
    (dict(beta=float("inf")), "beta inf: must be a finite number >= 1"),
    (dict(tau_factor=-1.0), "tau_factor -1.0: must be a finite number > 0"),
    (dict(tau_factor=float("nan")), "tau_factor nan: must be a finite number > 0"),
    (dict(tau_vol=-5), "tau_vol -5: must be a finite number > 0"),
])
def test_springs_parameters_from_python(small_dataset, tmp_path, kw, needle):
    """SPRING's thresholds once took -1 or NaN (every node a singleton, ``NaN`` in
    partition.json) and ``beta=inf`` an OverflowError; each API refuses them naming the
    keyword."""
    from ooc.core.errors import InvalidValue
    from ooc.partition import spring

    path, _ = small_dataset
    for call in (lambda: partition(path, 2, **kw),
                 lambda: spring(open_dataset(path), 2, **kw),
                 lambda: partition_dataset(path, tmp_path / "o", 2, **kw)):
        with pytest.raises(InvalidValue, match=f"^{re.escape(needle)}$"):
            call()
    assert not (tmp_path / "o").exists()


def test_json_never_holds_nan(tmp_path):
    """A NaN that reaches a JSON file (partition.json, a report) is refused naming its key,
    not written as ``NaN``, which is not JSON; nothing is left behind."""
    from ooc.core.errors import InvalidValue
    from ooc.storage.atomic import write_json

    target = tmp_path / "partition.json"
    with pytest.raises(InvalidValue, match=r"partition.json: params.tau_vol is nan, which "):
        write_json(target, {"p": 2, "params": {"tau_vol": np.float64("nan")}})
    with pytest.raises(InvalidValue, match=r": x\[1\] is -inf, "):
        write_json(target, {"x": np.array([1.0, -np.inf])})
    assert list(tmp_path.iterdir()) == []
    write_json(target, {"x": np.array([1.5]), "y": None})
    assert json.loads(target.read_text()) == {"x": [1.5], "y": None}


def test_missing_and_invalid_dataset(tmp_path, capsys):
    out = tmp_path / "o"
    _fails(["--data", str(tmp_path / "nope"), "--parts", "2", "--out", str(out)], capsys)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    err = _fails(["--data", str(bad), "--parts", "2", "--out", str(out)], capsys)
    assert "meta.json" in err
    assert not out.exists()


def test_existing_output_refused_unless_overwrite(small_dataset, tmp_path, capsys):
    path, _ = small_dataset
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    err = _fails(["--data", str(path), "--parts", "2", "--out", str(out), "--quiet"], capsys)
    assert "exists" in err
    assert (out / "keep.txt").exists()
    # a folder ooc did not make is never replaced, --overwrite or not
    err = _fails(["--data", str(path), "--parts", "2", "--out", str(out), "--quiet",
                  "--overwrite"], capsys)
    assert "was not made by ooc" in err and (out / "keep.txt").exists()
    # nor the input dataset, or a folder holding it
    err = _fails(["--data", str(path), "--parts", "2", "--out", str(path.parent), "--quiet",
                  "--overwrite"], capsys)
    assert "input" in err and (path / "meta.json").exists()
    mine = tmp_path / "mine"
    assert main(["--data", str(path), "--parts", "2", "--out", str(mine), "--quiet"]) == 0
    assert main(["--data", str(path), "--parts", "2", "--out", str(mine), "--quiet",
                 "--overwrite"]) == 0                     # ooc's own output: replaced
    assert (mine / "partition.json").exists()


def test_spring_restreaming(small_dataset, tmp_path):
    """stream_iters > 1 (restreaming): deterministic, valid, the two
    communities still split cleanly, and a later pass really runs."""
    path, _ = small_dataset
    a = partition(path, 4, "spring", seed=2, stream_iters=3, chunk_edges=500)
    b = partition(path, 4, "spring", seed=2, stream_iters=3, chunk_edges=500)
    np.testing.assert_array_equal(a.owner, b.owner)
    assert a.params["stream_iters"] == 3
    assert np.bincount(a.owner, minlength=4).min() > 0
    report = partition_dataset(path, tmp_path / "o", 4, "spring", seed=2, stream_iters=3,
                               chunk_edges=500)
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "owner.npy"), a.owner)
    _check_partitions(path, tmp_path / "o", report)
    two, perm = _two_communities(tmp_path)
    comm = np.empty(120, dtype=np.int64)
    comm[perm] = np.arange(120) // 60
    owner = partition(two, 2, "spring", stream_iters=3).owner
    side0, side1 = np.unique(owner[comm == 0]), np.unique(owner[comm == 1])
    assert side0.size == 1 and side1.size == 1 and side0[0] != side1[0]


def test_spring_restream_pass_matches_reference():
    """One restreamed pass of the clustering kernel equals a plain-Python
    transcription of Algorithm 1 lines 3-17 run twice over the same edges."""
    from ooc.partition._spring_kernels import CLUSTER, RICH, cluster_edges, new_state

    rng = np.random.default_rng(7)
    n, m = 40, 300
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    deg = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    tau = 30.0
    st = new_state(deg.astype(np.int64))
    vol = np.zeros(n + 1, dtype=np.int64)
    k = np.ones(1, dtype=np.int64)
    for _ in range(2):
        cluster_edges(src, dst, st, vol, k, tau)
    c = [0] * n
    v = [0] * (n + 1)
    rich = [-1] * n
    kk = 1
    for _ in range(2):
        for u, w in zip(src.tolist(), dst.tolist(), strict=True):
            for x in (u, w):
                if c[x] == 0:
                    c[x] = kk
                    v[kk] += int(deg[x])
                    kk += 1
            if u != w and c[u] != c[w] and v[c[u]] <= tau and v[c[w]] <= tau:
                x, y = (u, w) if v[c[u]] <= v[c[w]] else (w, u)
                v[c[x]] -= int(deg[x])
                v[c[y]] += int(deg[x])
                c[x] = c[y]
            if u != w:
                if rich[u] < 0 or deg[rich[u]] < deg[w]:
                    rich[u] = w
                if rich[w] < 0 or deg[rich[w]] < deg[u]:
                    rich[w] = u
    np.testing.assert_array_equal(st[:, CLUSTER], c)
    np.testing.assert_array_equal(vol, v)
    np.testing.assert_array_equal(st[:, RICH], rich)


# -- L-hop halos ---------------------------------------------------------------------------
def _sparse_directed(tmp_path: Path) -> Path:
    """300 nodes, 700 random directed edges (self loops and repeats included),
    sparse enough that every hop of the halo adds nodes."""
    n = 300
    src, dst = random_graph(n, 700, seed=11)
    indptr, indices = csc_from_edges(src, dst, n)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    y = rng.integers(0, 3, n)
    perm = rng.permutation(n)
    return write_dataset(tmp_path / "sparse", indptr, indices, x, y, perm[:150], perm[150:220],
                         perm[220:], num_classes=3)


def _in_rows(indptr, indices, v) -> list[int]:
    return indices[indptr[v]:indptr[v + 1]].tolist()


def _neighbourhood(indptr, indices, v: int, hops: int) -> list[tuple[int, int]]:
    """The in-edges (src, dst) met by a BFS of ``hops`` hops from ``v``
    (each node's row once, repeated edges kept)."""
    edges, seen, frontier = [], {v}, [v]
    for _ in range(hops):
        nxt = set()
        for w in frontier:
            for u in _in_rows(indptr, indices, w):
                edges.append((u, w))
                if u not in seen:
                    nxt.add(u)
        seen |= nxt
        frontier = list(nxt)
    return edges


def _check_halo(src_path: Path, out: Path, report: dict, hops: int) -> None:
    """Every invariant of an ``hops``-hop halo partition output, against BFS
    layers and neighbourhoods computed here from the source."""
    src = open_dataset(src_path)
    n = src.num_nodes
    s_indptr, s_indices = src.indptr, np.asarray(src.indices)
    s_x = src.features.read(np.arange(n))
    s_y = np.asarray(src.labels)
    owner = np.load(out / "owner.npy")
    assert report["halo_hops"] == hops
    total = 0
    for q in range(report["p"]):
        d = open_dataset(out / f"part_{q:03d}", verify=True)
        gids = np.load(d.path / "global_ids.npy")
        pm = d.meta["partition"]
        # layers: BFS by in-edges from the owned nodes
        layer = {int(v): 0 for v in np.flatnonzero(owner == q)}
        layers = [sorted(layer)]
        for h in range(1, hops + 1):
            nxt = {u for w in layers[-1] for u in _in_rows(s_indptr, s_indices, w)
                   if u not in layer}
            layer.update((u, h) for u in nxt)
            layers.append(sorted(nxt))
        # local ids: owned ascending, then each layer ascending; every node once
        np.testing.assert_array_equal(gids, np.concatenate(layers).astype(np.int64))
        assert pm["halo_hops"] == hops
        assert pm["num_owned"] == len(layers[0])
        assert pm["num_replicas_per_hop"] == [len(lay) for lay in layers[1:]]
        assert pm["num_replicas"] == d.num_nodes - len(layers[0])
        summary = report["parts"][q]
        assert summary["num_replicas_per_hop"] == pm["num_replicas_per_hop"]
        assert summary["nodes"] == d.num_nodes and summary["halo_hops"] == hops
        # layers 0..H-1: full in-lists in source order; layer H: empty
        d_indptr, d_indices = d.indptr, np.asarray(d.indices)
        for v, g in enumerate(gids):
            local = d_indices[d_indptr[v]:d_indptr[v + 1]]
            if layer[int(g)] < hops:
                np.testing.assert_array_equal(gids[local], s_indices[s_indptr[g]:s_indptr[g + 1]])
            else:
                assert local.size == 0
        # every owned node's H-hop in-neighbourhood is the one of the whole graph
        for v in range(len(layers[0])):
            local = [(int(gids[u]), int(gids[w]))
                     for u, w in _neighbourhood(d_indptr, d_indices, v, hops)]
            assert sorted(local) == sorted(_neighbourhood(s_indptr, s_indices, int(gids[v]),
                                                          hops))
        _check_node_data(src, d, gids, len(layers[0]), owner == q, s_x, s_y)
        total += d.num_nodes
    assert report["halo_replication_factor"] == pytest.approx(total / n)


@pytest.mark.parametrize("graph,algo,parts,hops", [
    ("sparse", "hash", 4, 2),
    ("sparse", "spring", 3, 3),
    ("two", "spring", 3, 2),
    ("two", "hdrf", 4, 3),
    ("two", "spring", 2, 5),  # the halo stops growing before hop 5: passes skipped
])
def test_halo_hops_match_bfs(tmp_path, monkeypatch, graph, algo, parts, hops):
    """An H-hop halo holds exactly the BFS layers of the owned nodes; the
    nodes of layers < H keep their full in-lists (chunks of 97 edges, so rows
    straddle chunk borders; labels written 7 at a time, so a chunk straddles the owned
    nodes and the halo)."""
    import ooc.partition.split as split_mod

    monkeypatch.setattr(split_mod, "LABEL_CHUNK", 7)
    path = _sparse_directed(tmp_path) if graph == "sparse" else _two_communities(tmp_path)[0]
    out = tmp_path / "out"
    report = partition_dataset(path, out, parts, algo, seed=1, chunk_edges=97, halo_hops=hops)
    _check_halo(path, out, report, hops)
    # the assignment metrics stay the 1-hop ones; the halo only adds nodes
    assert report["halo_replication_factor"] >= report["replication_factor"]
    if graph == "sparse":
        assert all(min(pq["num_replicas_per_hop"]) > 0 for pq in report["parts"])


def test_halo_one_hop_is_the_plain_split(tmp_path, capsys):
    """halo_hops=1 writes the same bytes as a run without the parameter, and
    a 2-hop halo (through the CLI) extends it: same local ids and rows for the
    owned nodes and the first layer."""
    path = _sparse_directed(tmp_path)
    kw = dict(seed=4, chunk_edges=64)
    plain = partition_dataset(path, tmp_path / "plain", 3, "hash", **kw)
    one = partition_dataset(path, tmp_path / "one", 3, "hash", halo_hops=1, **kw)
    assert one["halo_hops"] == 1
    assert one["halo_replication_factor"] == pytest.approx(plain["replication_factor"])
    files = ("indptr.npy", "indices.bin", "features.bin", "labels.npy", "global_ids.npy",
             "train_idx.npy", "val_idx.npy", "test_idx.npy")
    for q in range(3):
        for f in files:
            a = (tmp_path / "plain" / f"part_{q:03d}" / f).read_bytes()
            assert a == (tmp_path / "one" / f"part_{q:03d}" / f).read_bytes(), f
    _check_halo(path, tmp_path / "one", one, 1)
    rep = tmp_path / "r.json"
    assert main(["--data", str(path), "--parts", "3", "--algo", "hash", "--seed", "4",
                 "--chunk-edges", "64", "--halo-hops", "2", "--out", str(tmp_path / "two"),
                 "--report", str(rep), "--quiet"]) == 0
    capsys.readouterr()
    two = json.loads(rep.read_text())
    assert two["halo_hops"] == 2
    for key in ("replication_factor", "edge_cut", "node_balance", "edge_balance"):
        assert two[key] == one[key]
    for q in range(3):
        d1 = open_dataset(tmp_path / "one" / f"part_{q:03d}")
        d2 = open_dataset(tmp_path / "two" / f"part_{q:03d}")
        n1 = d1.num_nodes
        np.testing.assert_array_equal(np.load(d2.path / "global_ids.npy")[:n1],
                                      np.load(d1.path / "global_ids.npy"))
        n_own = d1.meta["partition"]["num_owned"]
        e1 = int(d1.indptr[n_own])
        np.testing.assert_array_equal(d2.indptr[:n_own + 1], d1.indptr[:n_own + 1])
        np.testing.assert_array_equal(np.asarray(d2.indices)[:e1], np.asarray(d1.indices))


def test_partitions_of_a_dataset_ingested_with_nonfinite_features(tmp_path):
    """A dataset kept with --allow-nonfinite partitions; its NaN rows go to the partitions."""
    from ooc.storage import csc_from_edges, open_dataset, write_dataset

    rng = np.random.default_rng(0)
    n = 200
    indptr, indices = csc_from_edges(rng.integers(0, n, 1500), rng.integers(0, n, 1500), n)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    x[7, 2] = np.nan
    path = write_dataset(tmp_path / "d", indptr, indices, x, rng.integers(0, 2, n),
                         np.arange(100), np.arange(100, 150), np.arange(150, 200),
                         num_classes=2, allow_nonfinite=True)
    assert open_dataset(path).meta["nonfinite_features"] == 1
    assert main(["--data", str(path), "--parts", "2", "--out", str(tmp_path / "p"),
                 "--quiet"]) == 0
    total = 0
    for part in sorted(p for p in (tmp_path / "p").iterdir() if p.is_dir()):
        d = open_dataset(part)
        total += int(np.isnan(d.features.read(np.arange(d.num_nodes))).sum())
    assert total >= 1


def test_partitions_inherit_the_sources_locality_order(tmp_path, monkeypatch):
    """A source stored in a locality order: each partition stores its rows in the order of
    their source rows (so the copy reads the source front to back), says so in its meta,
    and still reads every node's own row; reading the entries a few ids at a time writes
    the same bytes."""
    rng = np.random.default_rng(3)
    n, size = 2400, 24  # 100 communities hidden by a permutation of the ids
    comm = np.arange(n) // size
    src = rng.integers(0, n, 12 * n)
    dst = comm[src] * size + rng.integers(0, size, src.size)
    perm = rng.permutation(n)
    indptr, indices = csc_from_edges(perm[src], perm[dst], n)
    x = rng.standard_normal((n, 32)).astype(np.float32)  # 128-byte rows, 32 a page
    path = write_dataset(tmp_path / "d", indptr, indices, x, rng.integers(0, 3, n),
                         np.arange(0, n, 2), np.arange(1, n, 4), np.arange(3, n, 4),
                         num_classes=3, reorder="locality")
    source = open_dataset(path)
    assert source.row_of is not None
    out = tmp_path / "p"
    report = partition_dataset(path, out, 4, "spring")
    _check_partitions(path, out, report)
    for q in range(4):
        d = open_dataset(out / f"part_{q:03d}", verify=True)
        assert d.meta["feature_order"]["kind"] == "inherited"
        gids = np.load(d.path / "global_ids.npy")
        node_at_row = np.empty(d.num_nodes, dtype=np.int64)
        node_at_row[np.asarray(d.row_of)] = np.arange(d.num_nodes)
        assert np.all(np.diff(np.asarray(source.row_of)[gids[node_at_row]]) > 0)
        raw = np.fromfile(d.path / "features.bin", dtype=np.float32)[:d.num_nodes * 32]
        np.testing.assert_array_equal(raw.reshape(-1, 32), x[gids[node_at_row]])
    monkeypatch.setattr(split, "ID_PIECE", 37)
    monkeypatch.setattr(entries, "IDS_PER_READ", 37)
    partition_dataset(path, tmp_path / "pieces", 4, "spring")
    for q in range(4):
        for f in ("indptr.npy", "indices.bin", "features.bin", "feature_rows.npy",
                  "labels.npy", "global_ids.npy"):
            a = (out / f"part_{q:03d}" / f).read_bytes()
            assert a == (tmp_path / "pieces" / f"part_{q:03d}" / f).read_bytes(), f


@pytest.mark.parametrize("n, top", [(0, 1), (1, 9), (7, 3), (5000, 1 << 31), (3000, 3000)])
def test_ascending_order_is_numpys_stable_argsort(n, top):
    """The split's int32 sort order (least significant digit first) equals numpy's stable
    argsort, repeats and the largest int32 values included."""
    rng = np.random.default_rng(n)
    values = rng.integers(0, top, n).astype(np.int64 if top > 1 << 30 else np.int32)
    if n == 3000:
        values = rng.permutation(n).astype(np.int32)  # distinct, as source rows are
    order = split.ascending_order(values)
    assert order.dtype == np.int32
    np.testing.assert_array_equal(order, np.argsort(values, kind="stable"))


@pytest.mark.parametrize("tie_break", ["id", "random"])
def test_spring_in_int32_equals_int64(small_dataset, monkeypatch, tie_break):
    """SPRING's state in int32 (16 bytes a node) assigns every node as the int64 state does."""
    from ooc.partition import _spring_kernels

    path, _ = small_dataset
    a32 = partition(path, 4, "spring", tie_break=tie_break, seed=3, refine_passes=0)
    monkeypatch.setattr(_spring_kernels, "state_dtype", lambda n, d: np.dtype(np.int64))
    a64 = partition(path, 4, "spring", tie_break=tie_break, seed=3, refine_passes=0)
    np.testing.assert_array_equal(a32.owner, a64.owner)
    assert a32.info["clusters"] == a64.info["clusters"]
    assert _spring_kernels.new_state(np.array([3, 1])).dtype == np.int64  # the patch held
    monkeypatch.undo()
    assert _spring_kernels.new_state(np.array([3, 1])).dtype == np.int32
    assert _spring_kernels.state_dtype(2**31 - 2, 5) == np.int32  # cluster counts reach n + 1
    assert _spring_kernels.state_dtype(2**31 - 1, 5) == np.int64
    assert _spring_kernels.state_dtype(10, 2**31) == np.int64
