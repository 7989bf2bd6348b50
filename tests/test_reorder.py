"""storage.reorder.locality_order: planted communities hidden by a random permutation come
back as contiguous groups; the order is a permutation; windows do not change the result."""
import numpy as np
import pytest
from conftest import assert_same_batches

from ooc.storage import csc_from_edges
from ooc.storage.reorder import VOTES, OrderStats, locality_order


def _planted(k: int = 40, size: int = 24, p_out: float = 0.05, seed: int = 0, per: int = 8):
    """k communities of ``size`` nodes (``per`` edges from each node inside, a few edges
    across), ids permuted; returns (indptr, indices, community of every node id)."""
    rng = np.random.default_rng(seed)
    n = k * size
    comm = np.repeat(np.arange(k), size)
    src, dst = [], []
    for c in range(k):
        members = np.arange(c * size, (c + 1) * size)
        for v in members:
            nb = rng.choice(members[members != v], per, replace=False)
            src += [v] * len(nb)
            dst += nb.tolist()
    m = int(p_out * len(src))
    src += rng.integers(0, n, m).tolist()
    dst += rng.integers(0, n, m).tolist()
    perm = rng.permutation(n)
    src, dst = perm[np.array(src)], perm[np.array(dst)]
    keep = src != dst
    both = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    indptr, indices = csc_from_edges(both[0], both[1], n)
    comm_of = np.empty(n, np.int64)
    comm_of[perm] = comm
    return indptr, indices, comm_of


def _contiguity(order: np.ndarray, comm: np.ndarray) -> float:
    """Share of neighbouring positions of the order that hold the same community."""
    c = comm[order]
    return float((c[1:] == c[:-1]).mean())


def test_planted_communities_become_contiguous():
    indptr, indices, comm = _planted()
    st = OrderStats(0, [], 0, 0)
    order = locality_order(indptr, indices, cap=64, stats=st)
    assert order.dtype == np.int32
    np.testing.assert_array_equal(np.sort(order), np.arange(len(comm)))
    assert _contiguity(np.arange(len(comm)), comm) < 0.1       # the ids hide them
    assert _contiguity(order, comm) > 0.9, st
    assert st.largest_group <= 64 and st.sweeps >= 1
    assert st.longest == int(np.diff(indptr).max())
    # the sweeps stop at the first that moves under 1% of the nodes or gains under 1% of
    # the entries counted (at most VOTES a list), and not before
    n, e = len(comm), int(np.minimum(np.diff(indptr), VOTES).sum())
    assert len(st.moved) == len(st.gained) == st.sweeps
    for m, g in zip(st.moved[:-1], st.gained[:-1], strict=True):
        assert m >= n // 100 and g >= e // 100
    if st.sweeps < 5:
        assert st.moved[-1] < n // 100 or st.gained[-1] < e // 100
    assert all(g >= m for m, g in zip(st.moved, st.gained, strict=True))  # a move gains a vote at least


def test_long_lists_vote_through_spaced_entries():
    """Lists of ~80 entries counted through ``VOTES`` (32) of them still find the planted
    communities; ``votes`` at the longest list or above is every entry counted."""
    indptr, indices, comm = _planted(k=16, size=64, per=40, p_out=0.3, seed=2)
    assert np.diff(indptr).min() > VOTES
    st = OrderStats(0, [], 0, 0)
    order = locality_order(indptr, indices, cap=64, stats=st)
    assert _contiguity(order, comm) > 0.9, st
    every = locality_order(indptr, indices, cap=64, votes=0)
    np.testing.assert_array_equal(
        locality_order(indptr, indices, cap=64, votes=int(np.diff(indptr).max())), every)
    assert not np.array_equal(order, every)  # the spaced entries did decide some votes


def test_the_plan_charges_a_long_list_only_when_there_is_one():
    """With every entry counted, the propagation gathers the labels of a list longer than
    ``HASHED`` in one array: planned at the longest list when it is known, at a window
    when it is not. Counting ``VOTES`` of a long list needs no such array."""
    from ooc.storage import FeatureLayout
    from ooc.storage import _reorder_kernels as K
    from ooc.storage.reorder import VOTES, reorder_phases

    lay = FeatureLayout(100_000, 128, "float32")
    buf = 64 << 20
    short = reorder_phases(lay, buf, longest=K.HASHED, votes=0)["propagate"]
    long = reorder_phases(lay, buf, longest=1_000_000, votes=0)["propagate"]
    unknown = reorder_phases(lay, buf, votes=0)["propagate"]
    assert long - short == 4 * 1_000_000
    assert unknown - short == buf // 4
    assert 0 < VOTES <= K.HASHED
    assert reorder_phases(lay, buf, longest=1_000_000)["propagate"] == short
    assert reorder_phases(lay, buf)["propagate"] == short


def test_cap_bounds_every_group():
    indptr, indices, comm = _planted(k=10, size=40)
    st = OrderStats(0, [], 0, 0)
    locality_order(indptr, indices, cap=16, stats=st)
    assert st.largest_group <= 16


@pytest.mark.parametrize("window", [8, 256, 1 << 20])
def test_window_size_does_not_change_the_order(window):
    indptr, indices, _ = _planted(k=12, size=20, seed=3)
    ref = locality_order(indptr, indices, cap=64)
    np.testing.assert_array_equal(locality_order(indptr, indices, cap=64, window_bytes=window),
                                  ref)


def _sweep_reference(indptr, indices, label, size, cap, block=1, votes=0) -> tuple[int, int]:
    """One sweep in plain Python: in blocks of ``block`` nodes, each node of a block picks
    the most frequent label of its in-neighbours (of a list of ``d > votes > 0``, entries
    ``j * d // votes`` for ``j < votes``) whose group has room (ties: its own, then
    the smallest) as labels stood when the block began; then, in id order, each moves to
    its pick if that group still has room. Returns the nodes moved and the sum over them
    of (in-neighbours holding the new label - those holding the old), at block start."""
    moved = gain = 0
    n = len(indptr) - 1
    for b0 in range(0, n, block):
        picks = []
        for v in range(b0, min(n, b0 + block)):
            nbrs = indices[indptr[v]:indptr[v + 1]]
            if 0 < votes < len(nbrs):
                nbrs = nbrs[[j * len(nbrs) // votes for j in range(votes)]]
            cur = int(label[v])
            labs, counts = np.unique(label[nbrs], return_counts=True)
            ok = [(int(c), int(lab) == cur, -int(lab)) for lab, c in zip(labs, counts, strict=True)
                  if lab == cur or size[lab] < cap]
            best = -max(ok)[2] if ok else cur
            tally = dict(zip(labs.tolist(), counts.tolist(), strict=True))
            picks.append((best, tally.get(best, 0) - tally.get(cur, 0)))
        for v, (best, g) in zip(range(b0, min(n, b0 + block)), picks, strict=True):
            cur = int(label[v])
            if best != cur and size[best] < cap:
                size[cur] -= 1
                size[best] += 1
                label[v] = best
                moved += 1
                gain += g
    return moved, gain


@pytest.mark.parametrize("cap", [2, 5, 1 << 20])
@pytest.mark.parametrize("block", [1, 7, 64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("votes", [0, 4, 40])
def test_a_sweep_matches_a_plain_reference(cap, block, threads, votes):
    """The kernel's sweep (hash-table tallies; lists longer than ``HASHED`` sorted unless
    ``votes`` spaced entries stand for them) moves exactly the nodes a plain
    count-and-compare sweep does, with the same labels, sweep after sweep (many ties: few
    labels, small groups), on one thread or two, and with the nodes cut into windows that
    end inside blocks; with ``votes`` (4: most lists; 40: the long one) every list
    longer than that counts that many of its entries."""
    from ooc.storage import _reorder_kernels as K

    rng = np.random.default_rng(cap + block)
    n = 300
    src, dst = rng.integers(0, n, 2000), rng.integers(0, n, 2000)
    src = np.concatenate([src, rng.integers(0, n, K.HASHED + 50)])  # node 3: a long list
    dst = np.concatenate([dst, np.full(K.HASHED + 50, 3)])
    indptr, indices = csc_from_edges(src, dst, n)
    label = (np.arange(n) % 7 * 11).astype(np.int32)  # few labels: ties everywhere
    size = np.bincount(label, minlength=n).astype(np.int32)
    ref_label, ref_size = label.copy(), size.copy()
    prop, gains = np.empty(block, np.int32), np.empty(block, np.int64)
    cuts = [0, 5, 6, 100, 257, n]
    for _ in range(4):
        moved = gain = 0
        for v0, v1 in zip(cuts[:-1], cuts[1:], strict=True):
            ptr = np.ascontiguousarray(indptr[v0:v1 + 1])
            window = np.ascontiguousarray(indices[ptr[0]:ptr[-1]])
            m, g = K.propagate_window(ptr, window, v0, label, size, cap, block, prop, gains,
                                      threads, votes)
            moved, gain = moved + m, gain + g
        assert (moved, gain) == _sweep_reference(indptr, indices, ref_label, ref_size, cap,
                                                 block, votes)
        np.testing.assert_array_equal(label, ref_label)
        np.testing.assert_array_equal(size, ref_size)


def test_the_order_does_not_depend_on_the_cores():
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:  # type: ignore[attr-defined]
        pytest.skip("numba has one thread here: one and two threads cannot be compared "
                    "(the sweep test runs the kernel with two thread slices anyway)")
    indptr, indices, _ = _planted(k=12, size=20, seed=5)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = locality_order(indptr, indices, cap=64, block=16)
        numba.set_num_threads(2)
        two = locality_order(indptr, indices, cap=64, block=16)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(one, two)


def test_isolated_nodes_and_empty_graph():
    indptr = np.zeros(6, np.int64)
    order = locality_order(indptr, np.zeros(0, np.int32))
    np.testing.assert_array_equal(order, np.arange(5))


# -- features stored in a locality order (ingest's --reorder) -----------------------------

from ooc.core.errors import DatasetError, IdOutOfRange  # noqa: E402
from ooc.storage import open_dataset, write_dataset  # noqa: E402
from ooc.storage.dataset import ROW_MAP_FILE  # noqa: E402
from ooc.storage.features import FeatureWrapper  # noqa: E402
from ooc.storage.layout import FeatureLayout  # noqa: E402
from ooc.storage.reorder import permute_rows, rows_of  # noqa: E402


def _layout_file(path, x: np.ndarray) -> FeatureLayout:
    lay = FeatureLayout(x.shape[0], x.shape[1], x.dtype.name)
    buf = np.zeros(lay.file_bytes, np.uint8)
    lay.view(buf)[0:x.shape[0]] = x
    buf.tofile(path)
    return lay


@pytest.mark.parametrize("dim,dtype", [(32, "float32"), (100, "float16"), (1500, "float32")])
@pytest.mark.parametrize("buffer", [1 << 30, 64 << 10])
@pytest.mark.parametrize("remove_src", [False, True])
def test_permute_rows_places_every_row(tmp_path, dim, dtype, buffer, remove_src):
    """Row v of the source lands at row row_of[v], in memory and through bucket files
    (a small buffer), for rows sharing pages, rows with page padding and multi-page rows;
    the buckets are gone afterwards."""
    rng = np.random.default_rng(dim)
    n = 997
    x = rng.standard_normal((n, dim)).astype(dtype)
    lay = _layout_file(tmp_path / "src.bin", x)
    row_of = rng.permutation(n).astype(np.int32)
    buckets = permute_rows(tmp_path / "src.bin", tmp_path / "dst.bin", lay, row_of, buffer,
                           remove_src=remove_src)
    assert (buckets == 1) == (buffer == 1 << 30)
    assert (tmp_path / "dst.bin").stat().st_size == lay.file_bytes
    got = lay.view(np.fromfile(tmp_path / "dst.bin", np.uint8))[0:n]
    want = np.empty_like(x)
    want[row_of] = x
    np.testing.assert_array_equal(got, want)
    # every byte, the padding between rows and after the last one included (zero)
    _layout_file(tmp_path / "want.bin", want)
    assert (tmp_path / "dst.bin").read_bytes() == (tmp_path / "want.bin").read_bytes()
    (tmp_path / "want.bin").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst.bin"] + ([] if remove_src
                                                                      else ["src.bin"])


@pytest.mark.parametrize("dim", [32, 100])
def test_a_row_map_that_is_not_a_permutation_is_refused(tmp_path, dim):
    """A destination repeated within a bucket (so another row of it stays empty) is
    refused when the bucket is placed, one outside the file when the row arrives; no
    bucket file is left either way."""
    from ooc.core.errors import InvalidValue
    from ooc.storage.reorder import RowPlacer

    rng = np.random.default_rng(dim)
    n = 997
    x = rng.standard_normal((n, dim)).astype(np.float32)
    lay = _layout_file(tmp_path / "src.bin", x)
    row_of = rng.permutation(n).astype(np.int64)
    twice = row_of.copy()
    twice[np.flatnonzero(row_of == 1)[0]] = 0  # rows 0 and 1 share bucket 0
    with pytest.raises(InvalidValue, match=r"does not hold each of rows 0 \.\. .* once"):
        permute_rows(tmp_path / "src.bin", tmp_path / "dst.bin", lay, twice, 64 << 10)
    outside = row_of.copy()
    outside[5] = n
    with pytest.raises(InvalidValue, match=rf"node 5 is placed at row {n}, outside"):
        permute_rows(tmp_path / "src.bin", tmp_path / "dst.bin", lay, outside, 64 << 10)
    placer = RowPlacer(tmp_path / "dst.bin", lay, row_of, 64 << 10)
    placer.close()
    assert not any(p.name.startswith(".bucket") for p in tmp_path.iterdir())


def test_rows_of_inverts_an_order():
    order = np.random.default_rng(0).permutation(1000).astype(np.int32)
    row_of = rows_of(order)
    np.testing.assert_array_equal(row_of[order], np.arange(1000))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One planted-community graph written twice: rows in node order and in a locality
    order (32 float32 = 128 B rows: 32 a page)."""
    indptr, indices, comm = _planted(k=40, size=24, p_out=0.02)
    n = len(comm)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    y = comm % 5
    tmp = tmp_path_factory.mktemp("stored")
    kw = dict(labels=y, num_classes=5, train_idx=np.arange(0, n, 2), val_idx=np.arange(1, n, 4),
              test_idx=np.arange(3, n, 4))
    plain = write_dataset(tmp / "plain", indptr, indices, x, reorder="none", **kw)
    local = write_dataset(tmp / "local", indptr, indices, x, reorder="locality",
                          buffer_bytes=16 << 10, **kw)
    return open_dataset(plain), open_dataset(local), x, comm


def test_a_reordered_dataset_reads_the_same_rows_by_node_id(stored):
    plain, local, x, _ = stored
    assert plain.row_of is None and ROW_MAP_FILE not in plain.meta["files"]
    assert local.meta["feature_order"]["kind"] == "locality"
    assert local.meta["feature_order"]["buckets"] > 1       # the bounded two-pass path ran
    assert local.meta["feature_order"]["votes"] == VOTES
    np.testing.assert_array_equal(np.sort(np.asarray(local.row_of)), np.arange(len(x)))
    assert not np.array_equal(np.asarray(local.row_of), np.arange(len(x)))
    ids = np.random.default_rng(1).integers(0, len(x), 500)
    np.testing.assert_array_equal(local.features.read(ids), x[ids])
    np.testing.assert_array_equal(plain.features.read(ids), x[ids])
    for name in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(np.asarray(getattr(local, name)),
                                      np.asarray(getattr(plain, name)))
    with pytest.raises(IdOutOfRange, match="features.bin: node id 960 out of range"):
        local.features.read(np.array([0, len(x)]))


def test_a_community_is_read_in_few_pages_from_a_reordered_dataset(stored):
    """The O_DIRECT reader reads the pages of the rows asked for: one community's 24 rows
    span about 24 pages in node order and a couple in the locality order."""
    from ooc.storage.direct import DirectFeatures

    plain, local, x, comm = stored
    pages = {}
    for name, ds in (("plain", plain), ("local", local)):
        f = DirectFeatures(ds.file("features.bin"), ds.layout)
        reader = ds.by_node(f)
        total = 0
        for c in range(40):
            ids = np.flatnonzero(comm == c)
            before = f.reader.stats.pages
            np.testing.assert_array_equal(reader.read(ids), x[ids])
            total += f.reader.stats.pages - before
        f.close()
        pages[name] = total / 40
    assert pages["plain"] > 15, pages
    assert pages["local"] < 4, pages


@pytest.mark.parametrize("preset", ["ooc", "static", "baseline"])
def test_a_loader_gives_the_same_batches_from_either_order(stored, preset):
    """NodeLoader batches (n_id, x, y, edges) do not depend on the order the rows are stored
    in: the caches and readers are addressed by node id."""
    import ooc

    plain, local, x, _ = stored
    out = []
    for ds in (plain, local):
        with ooc.NodeLoader(ds, num_neighbors=[4, 3], batch_size=64, input_nodes="train",
                            shuffle=True, preset=preset, seed=5, superbatch_size=3) as loader:
            out.append([list(loader) for _ in range(2)])
    assert_same_batches(*out, lambda ids: x[ids])


def test_inference_over_a_reordered_dataset_writes_rows_by_node_id(stored, tmp_path):
    """Layer-wise inference's output rows are node ids whatever the stored order (it
    processes targets in the stored order)."""
    import torch

    from ooc.executor.inference.layerwise import layerwise_inference, read_embeddings
    from ooc.executor.training.models import build_model

    plain, local, x, _ = stored
    torch.manual_seed(0)
    model = build_model("sage", 32, 16, 5, num_layers=2)
    outs = []
    for name, ds in (("plain", plain), ("local", local)):
        rep = layerwise_inference(ds, model, tmp_path / f"{name}.zarr", chunk_rows=64)
        outs.append((read_embeddings(tmp_path / f"{name}.zarr", "h2"), rep))
    assert outs[1][1]["order"] == "locality"
    np.testing.assert_allclose(outs[0][0], outs[1][0], atol=1e-5)


def test_a_damaged_row_map_is_refused(stored, tmp_path):
    """A row map that is not a permutation is refused at open, naming the file (the
    checksum in meta.json catches it first when present)."""
    import json
    import shutil

    from ooc.storage.dataset import meta_checksum

    _, local, _, _ = stored
    copy = tmp_path / "copy"
    shutil.copytree(local.path, copy)
    row_of = np.load(copy / ROW_MAP_FILE)
    row_of[5] = row_of[6]
    np.save(copy / ROW_MAP_FILE, row_of)
    with pytest.raises(DatasetError, match=f"{ROW_MAP_FILE}: checksum does not match"):
        open_dataset(copy)
    meta = json.loads((copy / "meta.json").read_text())
    del meta["files"][ROW_MAP_FILE]["sha256"]
    meta["checksum"] = meta_checksum(meta)
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"entry 6 .* repeated: not a permutation"):
        open_dataset(copy)


def test_the_order_holds_12_bytes_a_node():
    """locality_order holds a label, a count and the order per node (int32 each below 2^31
    nodes) plus one window, however sparse the graph (a window is bounded in nodes too);
    rows_of then holds the order and its inverse."""
    import tracemalloc

    from ooc.storage import csc_from_edges

    rng = np.random.default_rng(0)
    small = csc_from_edges(np.arange(10), np.arange(1, 11) % 10, 10)
    rows_of(locality_order(*small))  # numba's typing and imports are not the order's
    n = 2_000_000
    indptr, indices = csc_from_edges(rng.integers(0, n, 5000), rng.integers(0, n, 5000), n)
    tracemalloc.start()
    try:
        order = locality_order(indptr, indices, window_bytes=1 << 20)
        peak_order = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        row_of = rows_of(order)
        peak_rows = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_order < 12 * n + (3 << 20), peak_order / n
    assert peak_rows < 8 * n + (1 << 20), peak_rows / n
    np.testing.assert_array_equal(row_of[order], np.arange(n))


def test_a_cache_fill_reads_each_page_once_in_chunks(stored):
    """A cache fill larger than one read chunk reads the rows in their stored order, so
    each page is read once, but for a page split between two chunks (in node order, the
    chunks of a reordered file each read pages all over it, many of them again)."""
    from ooc.caches.feature_cache import FeatureCache
    from ooc.storage.direct import DirectFeatures

    _, local, x, comm = stored
    ids = np.flatnonzero(comm < 20)                       # half the communities
    # only wanted pages read (no gap read through): the pages counted are the rows'
    f = DirectFeatures(local.file("features.bin"), local.layout, max_gap_bytes=0)
    cache = FeatureCache(len(x), len(ids), 32, np.float32)
    cache.switch_chunk = 50
    cache.switch(ids, local.by_node(f))
    pages = len(np.unique(np.asarray(local.row_of)[ids] // local.layout.rows_per_page))
    chunks = -(-len(ids) // 50)
    assert pages <= f.reader.stats.pages <= pages + chunks - 1
    np.testing.assert_array_equal(cache.gather(ids, local.by_node(f))[0], x[ids])

    class NodeOrder(FeatureWrapper):  # the same rows, chunks in node id order
        def storage_order(self, ids):
            return np.arange(len(ids))

    g = DirectFeatures(local.file("features.bin"), local.layout, max_gap_bytes=0)
    other = FeatureCache(len(x), len(ids), 32, np.float32)
    other.switch_chunk = 50
    other.switch(ids, NodeOrder(local.by_node(g)))
    assert g.reader.stats.pages > 1.5 * f.reader.stats.pages, (g.reader.stats.pages, f.reader.stats.pages)
    f.close()
    g.close()


def _traced_peak(write, folder) -> int:
    """Peak bytes Python allocates while ``write(path)`` runs, after a first call to
    ``folder/warm.bin`` (imports and first-call allocations are not counted)."""
    import tracemalloc

    write(folder / "warm.bin")
    tracemalloc.start()
    try:
        write(folder / "dst.bin")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dim,buffer", [(32, 4 << 20), (32, 1 << 30), (100, 4 << 20)])
def test_permute_rows_stays_within_its_planned_memory(tmp_path, dim, buffer):
    """permute_rows' allocations stay under what ingest plans for it (the inverse, two
    buckets of rows, 24 B a row), and that plan is not loose by more than a third (through
    bucket files with a small buffer, and in memory with a large one)."""
    from ooc.storage.reorder import permute_rows, reorder_phases

    rng = np.random.default_rng(1)
    n = 200_000
    x = rng.standard_normal((n, dim)).astype(np.float32)
    lay = _layout_file(tmp_path / "src.bin", x)
    row_of = rng.permutation(n).astype(np.int32)
    peak = _traced_peak(lambda dst: permute_rows(tmp_path / "src.bin", dst, lay, row_of, buffer),
                        tmp_path) + row_of.nbytes  # the inverse, held before
    plan = reorder_phases(lay, buffer)["permute"]
    assert peak <= plan <= 1.34 * peak, (peak, plan)


def test_a_sweep_over_a_mapped_file_leaves_its_pages(tmp_path):
    """locality_order over memmapped indptr/indices (as ingest runs it) lets each window's
    pages go: the process's file-backed RSS does not grow by the adjacency's size."""
    from ooc.storage import csc_from_edges

    def rss_file() -> int:
        for line in open("/proc/self/status"):
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
        pytest.skip("no RssFile in /proc/self/status on this kernel")

    rng = np.random.default_rng(2)
    n = 400_000
    indptr, indices = csc_from_edges(rng.integers(0, n, 4_000_000), rng.integers(0, n, 4_000_000),
                                     n)
    np.save(tmp_path / "indptr.npy", indptr)
    indices.astype(np.int32).tofile(tmp_path / "indices.bin")
    size = indptr.nbytes + 4 * indices.shape[0]                   # 19 MB
    ip = np.load(tmp_path / "indptr.npy", mmap_mode="r")
    ix = np.memmap(tmp_path / "indices.bin", dtype=np.int32, mode="r")
    locality_order(*csc_from_edges(np.arange(10), np.arange(1, 11) % 10, 10))  # compile
    before = rss_file()
    locality_order(ip, ix, window_bytes=1 << 20, sweeps=2)
    assert rss_file() - before < size // 4, (rss_file() - before, size)


@pytest.mark.parametrize("buffer", [1 << 30, 64 << 10])
def test_rows_streamed_in_uneven_chunks_land_where_permute_puts_them(tmp_path, buffer):
    """A RowPlacer fed node rows in chunks of any size (as ingest streams them) writes the
    file permute_rows writes; a bucket missing rows is refused; no bucket file is left."""
    from ooc.core.errors import InvalidValue
    from ooc.storage.reorder import RowPlacer

    rng = np.random.default_rng(4)
    n = 1501
    x = rng.standard_normal((n, 32)).astype(np.float32)
    lay = _layout_file(tmp_path / "src.bin", x)
    row_of = rng.permutation(n).astype(np.int32)
    permute_rows(tmp_path / "src.bin", tmp_path / "want.bin", lay, row_of, buffer)
    (tmp_path / "out").mkdir()
    placer = RowPlacer(tmp_path / "out" / "got.bin", lay, row_of, buffer)
    a = 0
    for k in (1, 700, 33, 767):
        placer.add(a, x[a:a + k])
        a += k
    assert placer.finish() == (1 if buffer == 1 << 30 else placer.buckets) and a == n
    placer.close()
    assert (tmp_path / "out" / "got.bin").read_bytes() == (tmp_path / "want.bin").read_bytes()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["got.bin"]
    if buffer == 64 << 10:
        placer = RowPlacer(tmp_path / "out" / "short.bin", lay, row_of, buffer)
        placer.add(0, x[:n - 1])
        with pytest.raises(InvalidValue, match="bucket holds"):
            placer.finish()
        placer.close()
        assert not any(p.name.startswith(".bucket") for p in (tmp_path / "out").iterdir())


def test_ingest_places_streamed_rows_in_the_locality_order(tmp_path):
    """A streamed ingest (synthetic) stores its rows in the locality order as they arrive,
    through buckets with a small buffer: every node reads its own row, as from the same
    graph stored in node order."""
    from ooc.storage.ingest.synthetic import generate_synthetic

    kw = dict(nodes=3000, avg_degree=8, feature_dim=32, classes=6, seed=2, progress=False,
              community_size=40)
    plain = open_dataset(generate_synthetic(tmp_path / "plain", reorder="none", **kw))
    local = open_dataset(generate_synthetic(tmp_path / "local", reorder="locality",
                                            buffer_bytes=64 << 10, **kw))
    assert local.meta["feature_order"]["buckets"] > 1
    ids = np.arange(3000)
    np.testing.assert_array_equal(local.features.read(ids), plain.features.read(ids))
    assert not np.array_equal(np.asarray(local.row_of), ids)
    assert not any(p.name.startswith(".bucket") for p in (tmp_path / "local").iterdir())


@pytest.mark.parametrize("buffer", [4 << 20, 1 << 30])
def test_placing_streamed_rows_stays_within_its_planned_memory(tmp_path, buffer):
    """Ingest's streamed placement (a float32 chunk read and placed as stored), then its
    last pass, stay under the plan's ``place`` and ``permute`` phases, the larger of which
    is not loose by more than half (in memory, ``place`` also counts a converted copy of
    the chunk, which a float32 source does not make)."""
    from ooc.storage.reorder import RowPlacer, reorder_phases

    rng = np.random.default_rng(1)
    n, dim = 200_000, 32
    x = rng.standard_normal((n, dim)).astype(np.float32)
    lay = FeatureLayout(n, dim, "float32")
    row_of = rng.permutation(n).astype(np.int32)
    step = max(1, (buffer // 4) // lay.row_bytes)

    def stream(path):
        placer = RowPlacer(path, lay, row_of, buffer)
        for a in range(0, n, step):
            chunk = x[a:a + step].copy()                           # as read
            placer.add(a, np.ascontiguousarray(chunk, np.float32))  # as converted
            del chunk
        placer.finish()
        placer.close()

    peak = _traced_peak(stream, tmp_path) + row_of.nbytes  # the inverse, held before
    phases = reorder_phases(lay, buffer)
    plan = max(phases["place"], phases["permute"])
    assert peak <= plan <= 1.5 * peak, (peak, phases)


def test_write_array_writes_every_byte(tmp_path):
    from ooc.storage.reorder import write_array

    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    with open(tmp_path / "a.bin", "wb", buffering=0) as f:  # unbuffered, as the buckets are
        write_array(f, x[:, ::2])                            # not contiguous
        write_array(f, np.zeros((0, 4), np.float32))          # nothing
        write_array(f, x[2])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "a.bin", np.int64),
                                  np.concatenate([x[:, ::2].ravel(), x[2]]))
