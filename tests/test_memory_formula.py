"""One memory formula (sizing/plan.compose_plan): plan_memory, a process budget's split and
the scale planner compose the same plan from a dataset's shape, the measured working memory
and the budget; the numbers are those of the formula before it was made one function."""
import numpy as np
import pytest

from ooc.executor.loader.presets import resolve_preset
from ooc.executor.loader.stack import ModeOptions
from ooc.executor.sizing import budget as B
from ooc.executor.sizing import plan as P
from ooc.executor.training.config import TrainConfig
from ooc.storage.layout import FeatureLayout

MiB = 1 << 20
SETUP, PEAK, MAPPED = 300 * MiB, 420 * MiB, 12 * MiB


class FakeDataset:
    """What the planner reads of a dataset, with no files: ``indptr`` in memory."""

    def __init__(self, n: int, degree: int, dim: int, dtype: str, train: int):
        self.num_nodes, self.feature_dim = n, dim
        self.layout = FeatureLayout(n, dim, dtype)
        self.feature_dtype = np.dtype(dtype)
        deg = np.arange(n, dtype=np.int64) % (2 * degree + 1)
        deg[::7] = 0                                    # some nodes list no neighbour
        self.indptr = np.zeros(n + 1, np.int64)
        np.cumsum(deg, out=self.indptr[1:])
        self.num_edges = int(self.indptr[-1])
        self.index_dtype = np.dtype(np.int32)
        self.train_idx = np.arange(train, dtype=np.int64)
        self.row_of = None

    def row_pages(self):
        rpp = self.layout.rows_per_page
        return (lambda ids: np.asarray(ids, dtype=np.int64) // rpp) if rpp >= 2 else None


def measured(monkeypatch, ids_per_batch: float, bpb: float) -> None:
    """Stand the measurement in: RSS ``SETUP`` once the kernels are loaded, a probe peak of
    ``PEAK``, ``MAPPED`` bytes of mapped file pages (for readers that map)."""
    probe = {"peaks": {"sample": SETUP + 10 * MiB, "train_loop": PEAK},
             "bytes_per_batch": bpb, "ids_per_batch": ids_per_batch, "max_edges": 1000,
             "step_estimate": {"total": 5 * MiB}, "too_large": ""}
    monkeypatch.setattr(B, "compile_kernels", lambda *a, **k: "test")
    monkeypatch.setattr(B, "warm_up_kernels", lambda *a, **k: None)
    monkeypatch.setattr(B, "rss_bytes", lambda: SETUP)
    monkeypatch.setattr(B, "_probe", lambda *a, **k: probe)
    for name in ("baseline", "static", "ooc"):
        readers = type(resolve_preset(name).readers)
        monkeypatch.setattr(readers, "mapped_bytes_bound",
                            lambda self, d, o, e: MAPPED if self.name == "mmap" else 0)


#: (nodes, degree, dim, dtype, train seeds, batch size, ids a batch, runtime bytes a batch)
SHAPES = {"small": (200_000, 6, 128, "float32", 20_000, 1024, 30_000.0, 400_000.0),
          "wide": (50_000, 3, 1100, "float16", 5_000, 512, 9_000.0, 90_000.0),
          "one-superbatch": (100_000, 4, 64, "float32", 500, 1024, 8_000.0, 70_000.0),
          "compact-ids": (5_000_000, 2, 32, "float32", 4096, 1024, 40_000.0, 500_000.0)}
OPTIONS = {"auto": {}, "explicit": {"feature_cache_size": 8 * MiB, "neighbor_cache_size": 2 * MiB},
           "superbatch": {"superbatch_size": 3}}

#: plan_memory's numbers before the formula was one function (commit 82f31de, the same
#: stand-in measurement): (working, superbatch_size, min_budget, feature rows, feature
#: bytes, neighbor bytes, planned peak), by (shape, preset, options, budget MiB)
EXPECTED = {
    ('small', 'baseline', 'auto', 400): 'BudgetError',
    ('small', 'baseline', 'auto', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'baseline', 'auto', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'baseline', 'auto', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'baseline', 'explicit', 400): 'BudgetError',
    ('small', 'baseline', 'explicit', 600): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('small', 'baseline', 'explicit', 1024): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('small', 'baseline', 'explicit', 4096): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('small', 'baseline', 'superbatch', 400): 'BudgetError',
    ('small', 'baseline', 'superbatch', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'baseline', 'superbatch', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'baseline', 'superbatch', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('small', 'static', 'auto', 400): 'BudgetError',
    ('small', 'static', 'auto', 600): (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'static', 'auto', 1024): (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'static', 'auto', 4096): (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'static', 'explicit', 400): 'BudgetError',
    ('small', 'static', 'explicit', 600): (440401920, None, 511705088, 16384, 8388608, 2097152, 450887680),
    ('small', 'static', 'explicit', 1024): (440401920, None, 511705088, 16384, 8388608, 2097152, 450887680),
    ('small', 'static', 'explicit', 4096): (440401920, None, 511705088, 16384, 8388608, 2097152, 450887680),
    ('small', 'static', 'superbatch', 400): 'BudgetError',
    ('small', 'static', 'superbatch', 600):
        (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'static', 'superbatch', 1024):
        (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'static', 'superbatch', 4096):
        (440401920, None, 500170752, 200000, 102400000, 5547180, 548349100),
    ('small', 'ooc', 'auto', 400): 'BudgetError',
    ('small', 'ooc', 'auto', 600): (448401920, 20, 503316480, 200000, 102400000, 5547180, 556349100),
    ('small', 'ooc', 'auto', 1024): (448401920, 20, 503316480, 200000, 102400000, 5547180, 556349100),
    ('small', 'ooc', 'auto', 4096): (448401920, 20, 503316480, 200000, 102400000, 5547180, 556349100),
    ('small', 'ooc', 'explicit', 400): 'BudgetError',
    ('small', 'ooc', 'explicit', 600): (448401920, 20, 515899392, 16384, 8388608, 2097152, 458887680),
    ('small', 'ooc', 'explicit', 1024): (448401920, 20, 515899392, 16384, 8388608, 2097152, 458887680),
    ('small', 'ooc', 'explicit', 4096): (448401920, 20, 515899392, 16384, 8388608, 2097152, 458887680),
    ('small', 'ooc', 'superbatch', 400): 'BudgetError',
    ('small', 'ooc', 'superbatch', 600): (448601920, 3, 508559360, 200000, 102400000, 5547180, 556549100),
    ('small', 'ooc', 'superbatch', 1024): (448601920, 3, 508559360, 200000, 102400000, 5547180, 556549100),
    ('small', 'ooc', 'superbatch', 4096): (448601920, 3, 508559360, 200000, 102400000, 5547180, 556549100),
    ('wide', 'baseline', 'auto', 400): 'BudgetError',
    ('wide', 'baseline', 'auto', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'auto', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'auto', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'explicit', 400): 'BudgetError',
    ('wide', 'baseline', 'explicit', 600): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'explicit', 1024): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'explicit', 4096): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'superbatch', 400): 'BudgetError',
    ('wide', 'baseline', 'superbatch', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'superbatch', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'baseline', 'superbatch', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('wide', 'static', 'auto', 400): 'BudgetError',
    ('wide', 'static', 'auto', 600): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'static', 'auto', 1024): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'static', 'auto', 4096): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'static', 'explicit', 400): 'BudgetError',
    ('wide', 'static', 'explicit', 600): (440401920, None, 511705088, 3813, 8388608, 2097152, 450887680),
    ('wide', 'static', 'explicit', 1024): (440401920, None, 511705088, 3813, 8388608, 2097152, 450887680),
    ('wide', 'static', 'explicit', 4096): (440401920, None, 511705088, 3813, 8388608, 2097152, 450887680),
    ('wide', 'static', 'superbatch', 400): 'BudgetError',
    ('wide', 'static', 'superbatch', 600): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'static', 'superbatch', 1024): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'static', 'superbatch', 4096): (440401920, None, 500170752, 50000, 110000000, 971416, 551373336),
    ('wide', 'ooc', 'auto', 400): 'BudgetError',
    ('wide', 'ooc', 'auto', 600): (441301920, 10, 501219328, 50000, 110000000, 971416, 552273336),
    ('wide', 'ooc', 'auto', 1024): (441301920, 10, 501219328, 50000, 110000000, 971416, 552273336),
    ('wide', 'ooc', 'auto', 4096): (441301920, 10, 501219328, 50000, 110000000, 971416, 552273336),
    ('wide', 'ooc', 'explicit', 400): 'BudgetError',
    ('wide', 'ooc', 'explicit', 600): (441301920, 10, 512753664, 3813, 8388608, 2097152, 451787680),
    ('wide', 'ooc', 'explicit', 1024): (441301920, 10, 512753664, 3813, 8388608, 2097152, 451787680),
    ('wide', 'ooc', 'explicit', 4096): (441301920, 10, 512753664, 3813, 8388608, 2097152, 451787680),
    ('wide', 'ooc', 'superbatch', 400): 'BudgetError',
    ('wide', 'ooc', 'superbatch', 600): (442541920, 3, 502267904, 50000, 110000000, 971416, 553513336),
    ('wide', 'ooc', 'superbatch', 1024): (442541920, 3, 502267904, 50000, 110000000, 971416, 553513336),
    ('wide', 'ooc', 'superbatch', 4096): (442541920, 3, 502267904, 50000, 110000000, 971416, 553513336),
    ('one-superbatch', 'baseline', 'auto', 400): 'BudgetError',
    ('one-superbatch', 'baseline', 'auto', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'auto', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'auto', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'explicit', 400): 'BudgetError',
    ('one-superbatch', 'baseline', 'explicit', 600): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'explicit', 1024): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'explicit', 4096): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'superbatch', 400): 'BudgetError',
    ('one-superbatch', 'baseline', 'superbatch', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'superbatch', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'baseline', 'superbatch', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('one-superbatch', 'static', 'auto', 400): 'BudgetError',
    ('one-superbatch', 'static', 'auto', 600):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'static', 'auto', 1024):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'static', 'auto', 4096):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'static', 'explicit', 400): 'BudgetError',
    ('one-superbatch', 'static', 'explicit', 600):
        (440401920, None, 511705088, 32768, 8388608, 2097152, 450887680),
    ('one-superbatch', 'static', 'explicit', 1024):
        (440401920, None, 511705088, 32768, 8388608, 2097152, 450887680),
    ('one-superbatch', 'static', 'explicit', 4096):
        (440401920, None, 511705088, 32768, 8388608, 2097152, 450887680),
    ('one-superbatch', 'static', 'superbatch', 400): 'BudgetError',
    ('one-superbatch', 'static', 'superbatch', 600):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'static', 'superbatch', 1024):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'static', 'superbatch', 4096):
        (440401920, None, 500170752, 100000, 25600000, 2076168, 468078088),
    ('one-superbatch', 'ooc', 'auto', 400): 'BudgetError',
    ('one-superbatch', 'ooc', 'auto', 600): (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('one-superbatch', 'ooc', 'auto', 1024): (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('one-superbatch', 'ooc', 'auto', 4096): (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('one-superbatch', 'ooc', 'explicit', 400): 'BudgetError',
    ('one-superbatch', 'ooc', 'explicit', 600): (440471920, 1, 511705088, 32768, 8388608, 2097152, 450957680),
    ('one-superbatch', 'ooc', 'explicit', 1024):
        (440471920, 1, 511705088, 32768, 8388608, 2097152, 450957680),
    ('one-superbatch', 'ooc', 'explicit', 4096):
        (440471920, 1, 511705088, 32768, 8388608, 2097152, 450957680),
    ('one-superbatch', 'ooc', 'superbatch', 400): 'BudgetError',
    ('one-superbatch', 'ooc', 'superbatch', 600):
        (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('one-superbatch', 'ooc', 'superbatch', 1024):
        (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('one-superbatch', 'ooc', 'superbatch', 4096):
        (440471920, 1, 500170752, 100000, 25600000, 2076168, 468148088),
    ('compact-ids', 'baseline', 'auto', 400): 'BudgetError',
    ('compact-ids', 'baseline', 'auto', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'auto', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'auto', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'explicit', 400): 'BudgetError',
    ('compact-ids', 'baseline', 'explicit', 600): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'explicit', 1024): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'explicit', 4096): (452984832, None, 523239424, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'superbatch', 400): 'BudgetError',
    ('compact-ids', 'baseline', 'superbatch', 600): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'superbatch', 1024): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'baseline', 'superbatch', 4096): (452984832, None, 513802240, 0, 0, 0, 452984832),
    ('compact-ids', 'static', 'auto', 400): 'BudgetError',
    ('compact-ids', 'static', 'auto', 600):
        (440401920, None, 500170752, 561737, 71902336, 31457280, 543761536),
    ('compact-ids', 'static', 'auto', 1024):
        (440401920, None, 500170752, 2725986, 348926208, 68000008, 857328136),
    ('compact-ids', 'static', 'auto', 4096):
        (440401920, None, 500170752, 5000000, 640000000, 68000008, 1148401928),
    ('compact-ids', 'static', 'explicit', 400): 'BudgetError',
    ('compact-ids', 'static', 'explicit', 600):
        (440401920, None, 511705088, 65536, 8388608, 2097152, 450887680),
    ('compact-ids', 'static', 'explicit', 1024):
        (440401920, None, 511705088, 65536, 8388608, 2097152, 450887680),
    ('compact-ids', 'static', 'explicit', 4096):
        (440401920, None, 511705088, 65536, 8388608, 2097152, 450887680),
    ('compact-ids', 'static', 'superbatch', 400): 'BudgetError',
    ('compact-ids', 'static', 'superbatch', 600):
        (440401920, None, 500170752, 561737, 71902336, 31457280, 543761536),
    ('compact-ids', 'static', 'superbatch', 1024):
        (440401920, None, 500170752, 2725986, 348926208, 68000008, 857328136),
    ('compact-ids', 'static', 'superbatch', 4096):
        (440401920, None, 500170752, 5000000, 640000000, 68000008, 1148401928),
    ('compact-ids', 'ooc', 'auto', 400): 'BudgetError',
    ('compact-ids', 'ooc', 'auto', 600): (442401920, 4, 504365056, 552808, 70759424, 30957280, 544118624),
    ('compact-ids', 'ooc', 'auto', 1024): (442401920, 4, 504365056, 2714081, 347402368, 68000008, 857804296),
    ('compact-ids', 'ooc', 'auto', 4096): (442401920, 4, 504365056, 5000000, 640000000, 68000008, 1150401928),
    ('compact-ids', 'ooc', 'explicit', 400): 'BudgetError',
    ('compact-ids', 'ooc', 'explicit', 600): (442401920, 4, 515899392, 65536, 8388608, 2097152, 452887680),
    ('compact-ids', 'ooc', 'explicit', 1024): (442401920, 4, 515899392, 65536, 8388608, 2097152, 452887680),
    ('compact-ids', 'ooc', 'explicit', 4096): (442401920, 4, 515899392, 65536, 8388608, 2097152, 452887680),
    ('compact-ids', 'ooc', 'superbatch', 400): 'BudgetError',
    ('compact-ids', 'ooc', 'superbatch', 600):
        (451621920, 3, 512753664, 511647, 65490816, 28652280, 545765016),
    ('compact-ids', 'ooc', 'superbatch', 1024):
        (451621920, 3, 512753664, 2659200, 340377600, 68000008, 859999528),
    ('compact-ids', 'ooc', 'superbatch', 4096):
        (451621920, 3, 512753664, 5000000, 640000000, 68000008, 1159621928),
}


def _plan(monkeypatch, shape, preset, options, budget_mib):
    n, degree, dim, dtype, train, bs, ids, bpb = SHAPES[shape]
    measured(monkeypatch, ids, bpb)
    ds = FakeDataset(n, degree, dim, dtype, train)
    return B.plan_memory(ds, TrainConfig(batch_size=bs, fanouts=[5, 5], mode=preset),
                         budget_mib * MiB, ModeOptions(**OPTIONS[options]))


def _row(plan):
    return (plan.working, plan.superbatch_size, plan.min_budget, plan.feature_cache_rows,
            plan.feature_cache_bytes, plan.neighbor_cache_bytes, plan.planned_peak_bytes)


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=lambda c: "-".join(map(str, c)))
def test_plan_memory_gives_the_numbers_of_before(monkeypatch, case):
    want = EXPECTED[case]
    if want == "BudgetError":
        with pytest.raises(B.BudgetError, match="the smallest budget that works is"):
            _plan(monkeypatch, *case)
    else:
        assert _row(_plan(monkeypatch, *case)) == want


def _working(**kw):
    return P.Working(setup_rss=SETUP, loop_peak=PEAK - SETUP, **kw)


def test_compose_plan_is_the_terms_computed_by_hand():
    """``static``: working = setup + loop; the neighbor cache a quarter of what is free
    (capped at the full cache), the feature cache the rest at row_cost a row."""
    from ooc.caches.feature_cache import row_cost

    n, row = 1_000_000, 512
    shape = P.DatasetShape(num_nodes=n, num_edges=10 * n, feature_dim=128, feature_itemsize=4,
                           index_itemsize=4, train_count=10_000,
                           full_neighbor_cache_bytes=30 * MiB)
    preset, opts, budget = resolve_preset("static"), ModeOptions(), 2048 * MiB
    plan = P.compose_plan(shape, _working(), budget, preset, opts, batch_size=1024)
    reserve = budget // 10
    from ooc.caches.neighbor_cache import build_bytes

    fill = (2 * 4 + 1) * n + 4 * min(10 * n, 1 << 24)   # the degree order, one chunk
    build = max(fill, build_bytes(n, 10 * n, 4))          # or the neighbor cache's build
    working = SETUP + max(PEAK - SETUP, build)
    free = budget - reserve - working
    nbytes = min(30 * MiB, int(0.25 * free))
    rows = min(n, (free - nbytes) // row_cost(row, n))
    assert (plan.reserve, plan.working, plan.neighbor_cache_bytes) == (reserve, working, nbytes)
    assert (plan.feature_cache_rows, plan.feature_cache_bytes) == (rows, rows * row)
    assert plan.planned_peak_bytes == working + rows * row + nbytes
    assert plan.min_budget == P.suggest_budget(working) and plan.superbatch_size is None
    assert plan.as_dict()["stages"] == {"setup_rss": SETUP, "loop_peak": PEAK - SETUP}
    assert "measured" not in plan.as_dict()
    # a build transient larger than the loop is what the working memory holds
    big = P.compose_plan(shape, P.Working(setup_rss=SETUP, loop_peak=MiB), budget, preset,
                         opts, batch_size=1024)
    assert big.working == SETUP + build
    assert big.stages["build_transient_above_loop"] == build - MiB


def test_a_group_split_shares_what_is_left_after_the_caches_built():
    """A process budget's group: the largest working memory of the loaders taking turns,
    the caches other groups built, the rest shared by the groups still to build."""
    shape = P.DatasetShape(num_nodes=400_000, num_edges=4_000_000, feature_dim=256,
                           feature_itemsize=4, index_itemsize=4, train_count=4_000)
    preset, opts, budget = resolve_preset("ooc"), ModeOptions(neighbor_cache_size=0), 4096 * MiB
    w = _working(bytes_per_batch=200_000.0, ids_per_batch=20_000.0)
    alone = P.compose_plan(shape, w, budget, preset, opts, batch_size=1024)
    group = P.compose_plan(shape, w, budget, preset, opts, batch_size=1024, built=300 * MiB,
                           shares=2, others_working=alone.working + 50 * MiB)
    assert group.working == alone.working + 50 * MiB
    assert (group.superbatch_size, group.min_budget) == (alone.superbatch_size, alone.min_budget)
    free = (budget - alone.reserve - group.working - 300 * MiB) // 2
    from ooc.caches.feature_cache import row_cost
    rows = min(shape.num_nodes, free // row_cost(1024, shape.num_nodes))
    assert group.feature_cache_rows == rows and group.neighbor_cache_bytes == 0
    assert group.planned_peak_bytes == group.working + 300 * MiB + rows * 1024
    # nothing left: no cache, and the plan says what the process then holds
    none = P.compose_plan(shape, w, budget, preset, opts, batch_size=1024, built=budget)
    assert none.feature_cache_bytes == 0 and none.planned_peak_bytes == none.working + budget


def test_an_automatic_neighbor_cache_needs_the_full_size_of_the_shape():
    shape = P.DatasetShape(num_nodes=1000, num_edges=5000, feature_dim=8, feature_itemsize=4,
                           index_itemsize=4, train_count=100)
    with pytest.raises(ValueError, match="full_neighbor_cache_bytes"):
        P.compose_plan(shape, _working(), 2048 * MiB, resolve_preset("static"), ModeOptions(),
                       batch_size=64)


def test_dataset_shape_of_a_dataset_reads_its_sizes():
    from ooc.caches.neighbor_cache import full_cache_bytes

    ds = FakeDataset(10_000, 3, 100, "float16", 700)
    shape = P.DatasetShape.of(ds, full_neighbor_cache=True)
    assert (shape.num_nodes, shape.num_edges, shape.row_bytes, shape.index_itemsize,
            shape.train_count) == (10_000, ds.num_edges, 200, 4, 700)
    assert shape.full_neighbor_cache_bytes == full_cache_bytes(ds.indptr, 4)
    assert P.DatasetShape.of(ds).full_neighbor_cache_bytes is None
    ids = np.arange(50)
    np.testing.assert_array_equal(shape.row_pages()(ids), ds.row_pages()(ids))
    assert P.DatasetShape.of(FakeDataset(100, 1, 1100, "float32", 10)).row_pages() is None
