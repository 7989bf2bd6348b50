"""python -m bench loader's preset names."""
from __future__ import annotations

from bench import loader as bench_loader


def test_bench_loader_names_a_read_gap_variant_by_its_kib():
    """``<preset>-gap<N>k`` is the preset reading through gaps of N KiB; other names are
    refused (None) rather than run as the plain preset."""
    assert bench_loader.variant("ooc-gap2k") == ("ooc", {}, {"read_gap": 2048})
    assert bench_loader.variant("static-gap12k") == ("static", {}, {"read_gap": 12288})
    assert bench_loader.variant("ooc-nogap") == ("ooc", {}, {"read_gap": 0})
    assert bench_loader.variant("ooc") == ("ooc", {}, {})
    for bad in ("ooc-gapk", "ooc-gap2", "fast-gap2k", "ooc-gap2k-pages"):
        assert bench_loader.variant(bad) is None
