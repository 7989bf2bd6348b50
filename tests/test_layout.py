import numpy as np
import pytest

from ooc.storage.layout import PAGE, FeatureLayout, index_dtype, padded_bytes


@pytest.mark.parametrize("dim,dtype", [(1, "float32"), (100, "float32"), (1024, "float32"),
                                       (1025, "float32"), (3000, "float16"), (7, "float16")])
def test_rows_never_straddle_a_page_and_round_trip(dim, dtype):
    n = 37
    lay = FeatureLayout(n, dim, dtype)
    offs = lay.row_offsets(np.arange(n))
    if lay.row_bytes <= PAGE:
        # a row that fits in a page starts and ends inside one page
        assert np.all(offs // PAGE == (offs + lay.row_bytes - 1) // PAGE)
    else:
        assert np.all(offs % PAGE == 0)
        assert lay.pages_per_row * PAGE >= lay.row_bytes
    assert len(np.unique(offs)) == n
    assert offs.max() + lay.row_bytes <= lay.file_bytes
    assert lay.file_bytes % PAGE == 0
    buf = np.zeros(lay.file_bytes, np.uint8)
    view = lay.view(buf)
    x = np.random.default_rng(0).standard_normal((n, dim)).astype(dtype)
    view[0:n] = x
    ids = np.array([5, 0, 36, 5, 17])
    np.testing.assert_array_equal(view[ids], x[ids])
    # each row's bytes sit exactly at its computed offset
    for r in (0, 11, 36):
        raw = buf[offs[r]:offs[r] + lay.row_bytes].view(dtype)
        np.testing.assert_array_equal(raw, x[r])


def test_index_dtype_and_padding():
    assert index_dtype(2**31 - 1) == np.int32
    assert index_dtype(2**31) == np.int64
    assert padded_bytes(0) == 0
    assert padded_bytes(1) == PAGE
    assert padded_bytes(PAGE) == PAGE
