"""drop_page_cache: a file, a folder, a missing path."""
from __future__ import annotations

from ooc.storage.pagecache import drop_page_cache


def test_drop_page_cache_counts_files(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("a.bin", "b.bin", "sub/c.bin"):
        (tmp_path / "d" / name).write_bytes(b"x" * 8192)
    assert drop_page_cache(tmp_path / "d" / "a.bin") == 1
    assert drop_page_cache(tmp_path / "d") == 3
    assert drop_page_cache(tmp_path / "missing") == 0
