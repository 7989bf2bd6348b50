"""ooc.storage.read_cost: the read-cost line and the gap it recommends."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import backend_or_skip

from ooc.storage import PAGE
from ooc.storage.read_cost import MAX_GAP_PAGES, RUN_PAGES, fit_read_cost, measure_read_cost


def _rates(op_s: float, page_s: float) -> dict[int, float]:
    return {k: 1.0 / (op_s + page_s * k) for k in RUN_PAGES}


@pytest.mark.parametrize("op_us,page_us,gap", [(9.5, 3.0, 3), (2.5, 1.0, 2), (1.0, 3.0, 0),
                                               (30.0, 0.5, MAX_GAP_PAGES)])
def test_fit_recovers_the_line_and_the_gap(op_us, page_us, gap):
    """Exact times of a + b k: the fit gives a and b back and floor(a / b) pages, capped."""
    c = fit_read_cost(_rates(op_us * 1e-6, page_us * 1e-6), "x")
    assert c.op_s == pytest.approx(op_us * 1e-6) and c.page_s == pytest.approx(page_us * 1e-6)
    assert c.gap_pages == gap and c.gap_bytes == gap * PAGE and c.backend == "x"
    assert c.as_dict()["gap_bytes"] == gap * PAGE


def test_fit_of_noise():
    """Reads that cost no more with more pages: the largest gap; times that fall to zero
    at one page (no fixed cost): none."""
    assert fit_read_cost({1: 1e5, 2: 1e5, 4: 1e5, 8: 1.1e5}).gap_pages == MAX_GAP_PAGES
    assert fit_read_cost({1: 1e6, 2: 4e5, 4: 2e5, 8: 1e5}).gap_pages == 0


@pytest.mark.parametrize("backend", ["io_uring", "preadv"])
def test_measured_on_a_file(tmp_path, backend):
    """A real measurement through the O_DIRECT reader: every size timed, a cost per read
    and per page that are numbers, a gap within the bounds (no timing asserted)."""
    path = tmp_path / "features.bin"
    np.random.default_rng(0).integers(0, 255, 400 * PAGE, dtype=np.uint8).tofile(path)
    backend_or_skip(backend, path)
    c = measure_read_cost(path, seconds=0.2, backend=backend)
    if c is None:
        pytest.skip(f"{tmp_path} takes no O_DIRECT reads")
    assert c.backend == backend and sorted(c.reads_per_s) == list(RUN_PAGES)
    assert all(v > 0 for v in c.reads_per_s.values())
    assert np.isfinite(c.op_s) and np.isfinite(c.page_s)
    assert 0 <= c.gap_pages <= MAX_GAP_PAGES


def test_not_measured_through_the_page_cache_or_on_a_tiny_file(tmp_path):
    path = tmp_path / "features.bin"
    np.zeros(400 * PAGE, np.uint8).tofile(path)
    assert measure_read_cost(path, seconds=0.1, backend="mmap") is None
    small = tmp_path / "small.bin"
    np.zeros(10 * PAGE, np.uint8).tofile(small)
    assert measure_read_cost(small, seconds=0.1) is None
