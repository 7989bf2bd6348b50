"""Streamed aggregation: a layer whose convolution reduces its in-neighbours' rows (mean,
sum or max of the rows as they are, before any weight: ``SAGEConv``) computed from the
reduced rows, its input read front to back a few times instead of a page per in-edge.

The blocks of :mod:`.runner` hold every input row their targets need, so on a graph whose
edges leave the blocks (random edges, hubs) each block reads most pages of the input:
about one page per in-edge in all. A reduction needs less: each target's sum (or max) of
its in-neighbours' rows. So this layer keeps an accumulator row per target for a *group*
of consecutive output rows (as many as the memory holds), streams the input table from
disk in order, a *source chunk* at a time, and adds every edge's source row into its
target's accumulator. The layer itself then runs on each target with one virtual
in-neighbour whose row is the reduced one (divided by the in-degree for a mean): the
convolution's mean, sum or max over that single neighbour is the reduced row, so the
output equals the full neighbourhood's (to float rounding: the sum is taken in another
order).

Edges are first sorted into buckets by (target group, source chunk), one file each in
``<partial>/edge_buckets`` (8 bytes an edge: the source's row in its chunk and the
target's row in its group, int32), in one pass over ``indices.bin``; the folder is
removed when the layer ends. A layer then reads its input once per group, the buckets
once, and its targets' own rows once.

Memory (what :func:`.memory_plan.headroom` leaves the layer): the sub-blocks the layer runs
in (at most :data:`SUB_ROWS` targets, at their measured costs), one source chunk
(:data:`SOURCE_SHARE`, at most :data:`SOURCE_MAX_BYTES`; as read and as float32), and the
rest to the accumulators (float32 [group rows, d_in] and :data:`GROUP_ROW_EXTRA` bytes a
row), so that a layer takes as few groups, and reads its input as few times, as the budget
allows.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ooc.core.errors import setting
from ooc.core.notes import note
from ooc.core.sizes import format_size
from ooc.executor.inference._kernels import accumulate_rows, bucket_edges
from ooc.executor.inference.blocks import EXTRA_READS
from ooc.executor.inference.memory_plan import BlockCosts, MiB, headroom, output_buffers, rss
from ooc.storage.features import read_counted
from ooc.storage.layout import PAGE, FeatureLayout, read_rows
from ooc.storage.pagecache import release_mapped

if TYPE_CHECKING:
    from ooc.executor.inference.runner import LayerStats, Run, _ChunkWriter

#: One source chunk takes this share of a layer's free memory, at most
#: :data:`SOURCE_MAX_BYTES`; the accumulators take what the chunk and the sub-blocks leave.
SOURCE_SHARE = 0.1
#: Read in order, a source chunk of a few of the input's chunk files reads at the disk's
#: speed (Zarr reads the files of one request concurrently; one file at a time read a
#: layer slower); more only takes memory from the accumulators.
SOURCE_MAX_BYTES = 128 << 20
#: Most targets a sub-block runs through the layer at once (their rows, the reduced rows
#: and the layer's temporaries), within :data:`SUB_SHARE` of the free memory: more only
#: takes memory from the accumulators.
SUB_ROWS = 1 << 15
SUB_SHARE = 0.1
#: Bytes a group row needs besides its accumulator: its in-degree (int64) and the
#: temporaries that compute it and divide the mean by it.
GROUP_ROW_EXTRA = 40
#: CSC positions bucketed at once (int32 ids, bucket ids and pairs: 16 bytes each).
BUCKET_EDGES = 1 << 22
#: Pairs of a bucket read at once (8 bytes each), at most.
PAIR_PIECE = 1 << 21
#: The directory of the bucket files, inside the partial output folder.
BUCKET_DIR = "edge_buckets"
#: Bytes of an edge in the buckets (two int32).
BUCKET_BYTES = 8


@dataclass
class StreamPlan:
    """How a layer streams.

    Attributes:
        reduction: ``mean``, ``sum`` or ``max``.
        group_rows: output rows per group (accumulators held at once); ``groups`` their
            number.
        src_rows: input rows per source chunk; ``src_chunks`` their number; ``in_rows``
            the input's rows (the targets', or a linked feature file's).
        sub_rows: targets per sub-block the layer runs on.
        pair_piece: bucket pairs read at once.
        planned_bytes: the bytes it reads: the input table once per group and once more
            for the targets' own rows, the buckets once.
        work: the free memory the plan splits.
        planned_peak_bytes: the RSS the layer is planned to reach: the RSS at planning,
            two output chunks, the accumulators, a source chunk, a piece of pairs and a
            sub-block.
    """
    reduction: str
    group_rows: int
    groups: int
    src_rows: int
    src_chunks: int
    sub_rows: int
    pair_piece: int
    planned_bytes: int
    work: int
    planned_peak_bytes: int = 0
    in_rows: int = 0
    #: what it writes besides the layer's output: the edge buckets
    write_bytes: int = 0
    #: says, once, when the budget makes the layer read its input many times over (the
    #: runner sets it: :func:`note_stream_reads` with the layer's own re-planning)
    note_reads: Callable[[], None] = lambda: None

    def as_dict(self) -> dict:
        return {"mode": "streamed", "reduction": self.reduction, "groups": self.groups,
                "group_rows": self.group_rows, "source_chunks": self.src_chunks,
                "source_rows": self.src_rows, "sub_rows": self.sub_rows,
                "planned_stream_bytes": int(self.planned_bytes),
                "planned_write_bytes": int(self.write_bytes),
                "planned_peak_bytes": int(self.planned_peak_bytes)}


def _round_down(x: int, unit: int) -> int:
    return (x // unit) * unit


def plan_stream(reduction: str | None, n: int, num_edges: int, d_in: int, d_out: int,
                in_row_bytes: int, table_bytes: int, budget: int, chunk_rows: int,
                src_unit: int, src_align: int, costs: BlockCosts,
                group_rows: int | None = None, src_rows: int | None = None,
                rss0: int | None = None, n_in: int | None = None) -> StreamPlan | None:
    """The streamed plan of a layer, or None when its convolution is no plain reduction
    (``reduction`` None) or the budget cannot hold one output chunk of accumulators and one
    ``src_unit`` of source rows.

    ``in_row_bytes``: the memory an input row takes as read (a float32 copy is added
    where that is not one float32 row); ``table_bytes``: the whole input as read;
    ``src_unit``: source chunks are a multiple of it where one fits (the input's own chunk
    rows), and always of ``src_align`` (the rows of a page of ``features.bin``, else 1);
    ``group_rows``/``src_rows``: force the sizes (tests); ``rss0``: the RSS the layer
    starts from (default: this process's now); ``n_in``: the input's rows (default ``n``:
    more where the first layer reads a linked feature file's rows).
    """
    if reduction is None or n == 0:
        return None
    n_in = n if n_in is None else int(n_in)
    rows = min(chunk_rows, n)
    rss0 = rss() if rss0 is None else int(rss0)
    free = headroom(budget, rss0, rows, d_out)
    acc_row = d_in * 4
    source_share = int(min(free * SOURCE_SHARE, SOURCE_MAX_BYTES))
    # a quarter of the source share reads the buckets' pairs (8 bytes each)
    pair_piece = int(min(PAIR_PIECE, max(1024, source_share // 4 // BUCKET_BYTES)))
    # a source row as read, and its float32 copy where it is stored otherwise
    src_row = in_row_bytes + (acc_row if in_row_bytes != acc_row else 0)
    if src_rows is None:
        src_rows = (source_share - pair_piece * BUCKET_BYTES) // src_row
    # whole input chunks a source chunk where they fit; always whole pages of rows
    src_rows = _round_down(src_rows, src_unit if src_rows >= src_unit else src_align)
    src_rows = min(src_rows, -(-n_in // src_align) * src_align)
    source_bytes = src_rows * src_row + pair_piece * BUCKET_BYTES
    per_target = costs.target + 2 * costs.node + costs.edge + 3 * acc_row
    # sub-blocks of up to SUB_ROWS targets, within SUB_SHARE of what the source chunk leaves
    sub_rows = min(SUB_ROWS, n, int((free - source_bytes) * SUB_SHARE) // max(per_target, 1))
    if group_rows is None:
        group_rows = (free - source_bytes - sub_rows * per_target) // (acc_row + GROUP_ROW_EXTRA)
    group_rows = min(group_rows, n)
    sub_rows = min(sub_rows, group_rows)
    if group_rows < 1 or src_rows < 1 or sub_rows < 1:
        return None
    groups, chunks = -(-n // group_rows), -(-n_in // src_rows)
    # the table once per group, the buckets once, the targets' own rows once; a page more
    # where a read starts or ends inside one
    planned = (groups + 1) * table_bytes + BUCKET_BYTES * num_edges \
        + (groups * chunks + -(-n // sub_rows) + groups) * 2 * PAGE
    peak = rss0 + output_buffers(rows, d_out) + group_rows * (acc_row + GROUP_ROW_EXTRA) \
        + source_bytes + sub_rows * per_target
    return StreamPlan(reduction, int(group_rows), groups, int(src_rows), chunks,
                      int(sub_rows), pair_piece, planned, int(free), int(peak), n_in,
                      BUCKET_BYTES * num_edges)


def one_pass_budget(plan: StreamPlan, budget: int, n: int, d_in: int,
                    replan: Callable[[int], StreamPlan | None]) -> int:
    """The smallest whole-MiB budget (found from ``budget`` up) whose streamed plan holds
    every target's accumulator, so that the layer reads its input in one pass;
    ``replan(budget)`` plans the layer again under another budget (the same RSS)."""
    need, p = int(budget), plan  # type: int, StreamPlan | None
    for _ in range(16):
        rows = p.group_rows if p is not None else 0
        if p is not None and p.groups <= 1:
            break
        # what the missing accumulators take; the source chunk and the sub-blocks grow
        # with the free memory too, so the next plan says whether it is enough
        need += max(MiB, (n - rows) * (4 * d_in + GROUP_ROW_EXTRA))
        p = replan(need)
    lo, hi = int(budget) // MiB, -(-need // MiB)  # lo streams in several passes, hi in one
    while hi - lo > 1:
        mid = (lo + hi) // 2
        q = replan(mid * MiB)
        lo, hi = (lo, mid) if q is not None and q.groups <= 1 else (mid, hi)
    return hi * MiB


def note_stream_reads(l: int, plan: StreamPlan, budget: int, n: int, d_in: int,
                      table_bytes: int, replan: Callable[[int], StreamPlan | None]) -> None:
    """A one-line note when the budget makes streamed layer ``l`` read its input more
    than :data:`~.blocks.EXTRA_READS` times over, naming the budget that streams it in one
    pass (:func:`one_pass_budget`)."""

    if plan.groups <= 1 or plan.planned_bytes <= EXTRA_READS * table_bytes:
        return
    enough = one_pass_budget(plan, budget, n, d_in, replan)
    note(f"inference layer {l + 1} reads about {format_size(plan.planned_bytes)} "
         f"({plan.planned_bytes / max(table_bytes, 1):.0f}x its input: {plan.groups} groups of "
         f"targets, a pass each) at {setting('--memory-budget')} {format_size(budget)}; "
         f"{enough // MiB}MiB streams it in one pass")


class Source:
    """The input table read in stored order: ``features.bin``'s rows (layer 0) or the
    previous layer's array (rows in processing order); counts the bytes read."""

    def __init__(self, run: "Run", prev: Any):
        self.run, self.prev = run, prev
        self.bytes_read = 0
        self._f = None if prev is not None else open(run.dataset.features_file, "rb")

    def rows(self, a: int, b: int) -> np.ndarray:
        """Stored rows ``a .. b`` as float32 [b - a, d_in]."""
        if self.prev is not None:
            x = np.asarray(self.prev[a:b])
            self.bytes_read += x.nbytes
        else:
            lay = self.run.dataset.file_layout
            x = read_rows(self._f, lay, a, b)
            self.bytes_read += FeatureLayout(b - a, lay.dim, lay.dtype).file_bytes
        return np.asarray(x, dtype=np.float32)

    def own_rows(self, nodes: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """The input rows of ``nodes`` (int64, output rows ``r0 .. r1``) as float32."""
        if self.prev is not None:  # processing order: the same rows of the input
            x = np.asarray(self.prev[r0:r1])
            self.bytes_read += x.nbytes
            return np.asarray(x, dtype=np.float32)
        x, nbytes = read_counted(self.run.reader, nodes, self.run.dataset.layout.row_bytes)
        self.bytes_read += nbytes
        return np.asarray(x, dtype=np.float32)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def write_buckets(run: "Run", key_in: np.ndarray, folder: Path, group_rows: int, groups: int,
                  src_rows: int, src_chunks: int) -> np.ndarray:
    """Bucket every edge (one pass over ``indices.bin``) by (target group of ``group_rows``
    output rows, source chunk of ``src_rows`` input rows) into ``folder`` (see
    :func:`._kernels.bucket_edges`); returns int64 [groups * src_chunks], the pairs in
    each bucket."""
    topo = run.topo
    nb = groups * src_chunks
    sizes = np.zeros(nb, dtype=np.int64)
    e = int(topo.indptr[-1])
    step = min(BUCKET_EDGES, max(e, 1))
    bid = np.empty(step, dtype=np.int32)
    pairs = np.empty((step, 2), dtype=np.int32)
    files: dict[int, Any] = {}
    try:
        for a in range(0, e, step):
            b = min(e, a + step)
            run.dataset.check_mapped()  # a mapped file that shrank: an error, not SIGBUS
            src = np.asarray(topo.indices[a:b])
            first = int(np.searchsorted(topo.indptr, a, side="right")) - 1
            counts = bucket_edges(topo.indptr, src, a, first, topo.rowof, key_in,
                                  group_rows, src_rows, src_chunks, nb,
                                  bid[:b - a], pairs[:b - a])
            topo.release_pages()
            for k in np.flatnonzero(np.diff(counts)).tolist():
                f = files.get(k)
                if f is None:
                    f = files[k] = open(folder / f"{k}.bin", "ab")
                f.write(pairs[counts[k]:counts[k + 1]].data)
                sizes[k] += counts[k + 1] - counts[k]
            if len(files) > 256:  # open files stay few
                for f in files.values():
                    f.close()
                files.clear()
    finally:
        for f in files.values():
            f.close()
    return sizes


def _accumulate_group(src: Source, plan: StreamPlan, g: int, g_rows: int, d_in: int,
                      sizes: np.ndarray, folder: Path, stats: "LayerStats"
                      ) -> np.ndarray:
    """float32 [g_rows, d_in]: each target's sum (max) of its in-neighbours' rows."""
    use_max = plan.reduction == "max"
    acc = np.full((g_rows, d_in), -np.inf if use_max else 0.0, dtype=np.float32)
    for c in range(plan.src_chunks):
        k = g * plan.src_chunks + c
        if not sizes[k]:
            continue
        t0 = time.perf_counter()
        x = src.rows(c * plan.src_rows, min(plan.in_rows, (c + 1) * plan.src_rows))
        t_read, t_sum = time.perf_counter() - t0, 0.0
        with open(folder / f"{k}.bin", "rb") as f:
            left = int(sizes[k])
            while left:
                m = min(left, plan.pair_piece)
                t0 = time.perf_counter()
                pairs = np.fromfile(f, dtype=np.int32, count=2 * m).reshape(m, 2)
                t1 = time.perf_counter()
                src.bytes_read += pairs.nbytes
                accumulate_rows(acc, x, pairs, use_max)
                t_read += t1 - t0
                t_sum += time.perf_counter() - t1
                left -= m
        del x
        stats.time_s["read"] += t_read
        stats.time_s["aggregate"] = stats.time_s.get("aggregate", 0.0) + t_sum
    if use_max:
        acc[np.isneginf(acc)] = 0.0  # only targets without in-edges keep -inf: they get none
    return acc


def input_keys(run: "Run", prev: Any) -> np.ndarray:
    """[N] node -> row of the layer's input as stored: the processing order for a layer's
    array (``prev``), the dataset's row order for ``features.bin``."""
    row_of = run.dataset.row_of
    if prev is not None:
        return run.topo.rowof
    return np.asarray(row_of) if row_of is not None else \
        np.arange(run.topo.num_nodes, dtype=run.topo.perm.dtype)


def fresh_folder(folder: Path) -> Path:
    """``folder`` made empty (what a killed run left there removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder


def row_degrees(run: "Run", r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes of output rows ``r0 .. r1`` and their in-degrees (int64); the pages of
    ``indptr.npy`` the gather maps (all over it) are dropped."""
    topo = run.topo
    nodes = np.asarray(topo.perm[r0:r1])
    dg = topo.indptr[nodes + 1] - topo.indptr[nodes]
    topo.release_pages()
    return nodes, dg


def run_streamed(run: "Run", l: int, plan: StreamPlan, prev: Any, d_in: int, first_chunk: int,
                 writer: "_ChunkWriter", stats: "LayerStats", work: Path) -> int:
    """Layer ``l`` by streamed aggregation, output rows from ``first_chunk`` on handed to
    ``writer``; returns the bytes read."""
    topo, ch = run.topo, run.chunking
    n = topo.num_nodes
    key_in = input_keys(run, prev)
    folder = fresh_folder(work / BUCKET_DIR)
    src = Source(run, prev)
    try:
        t0 = time.perf_counter()
        sizes = write_buckets(run, key_in, folder, plan.group_rows, plan.groups, plan.src_rows,
                              plan.src_chunks)
        if run.dataset.row_of is not None:
            release_mapped(run.dataset.row_of)
        stats.time_s["bucket"] = time.perf_counter() - t0
        first_group = (first_chunk * ch.chunk_rows) // plan.group_rows
        for g in range(first_group, plan.groups if first_chunk < ch.num_chunks else 0):
            r0, r1 = g * plan.group_rows, min(n, (g + 1) * plan.group_rows)
            run.dataset.check_mapped()
            acc = _accumulate_group(src, plan, g, r1 - r0, d_in, sizes, folder, stats)
            nodes, dg = row_degrees(run, r0, r1)
            if plan.reduction == "mean":
                acc /= np.maximum(dg, 1).astype(np.float32)[:, None]
            run_targets(run, l, plan.sub_rows, src, acc, nodes, dg, r0, writer, stats)
            del acc
    finally:
        src.close()
        shutil.rmtree(folder, ignore_errors=True)
    return src.bytes_read


def run_targets(run: "Run", l: int, sub_rows: int, src: Any, acc: np.ndarray,
                nodes: np.ndarray, deg: np.ndarray, r0: int, writer: "_ChunkWriter",
                stats: "LayerStats") -> None:
    """The layer on consecutive targets (``nodes``, output rows ``r0 ..``; ``acc`` float32
    [len(nodes), d_in] their reduced rows, ``deg`` their in-degrees), ``sub_rows`` at a
    time: each target's own row (``src.own_rows``) and one virtual in-neighbour holding its
    reduced row."""
    for a in range(0, nodes.shape[0], sub_rows):
        z = min(nodes.shape[0], a + sub_rows)
        m = z - a
        t0 = time.perf_counter()
        own = src.own_rows(nodes[a:z], r0 + a, r0 + z)
        t1 = time.perf_counter()
        x = np.concatenate([own, acc[a:z]])
        del own
        has = np.flatnonzero(deg[a:z] > 0)
        ei = np.stack([has + m, has]).astype(np.int64)
        h = run.model.targets(l, torch.from_numpy(x), torch.from_numpy(ei), None, m).numpy()
        del x, ei
        stats.time_s["read"] += t1 - t0
        stats.time_s["compute"] += time.perf_counter() - t1
        writer.put(r0 + a, h)
        stats.sub_blocks += 1
