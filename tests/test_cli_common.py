import argparse

import pytest

from ooc.core.sizes import format_size, parse_size


@pytest.mark.parametrize("text,value", [("512MiB", 512 << 20), ("8GiB", 8 << 30), ("1.5G", 3 << 29),
                                        ("4096", 4096), ("10k", 10240), ("2 TiB", 2 << 40),
                                        ("200MB", 200_000_000), ("2 TB", 2 * 10**12),
                                        ("3kB", 3000), ("12B", 12)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3G", "-5M", "5X"])
def test_parse_size_rejects(text):
    from ooc.core.errors import OocError

    with pytest.raises(ValueError) as e:         # also an OocError, not an argparse type
        parse_size(text)
    assert isinstance(e.value, OocError) and not isinstance(e.value, argparse.ArgumentTypeError)


def test_format_size():
    assert format_size(1536) == "1.5 KiB"
    assert format_size(12) == "12 B"


@pytest.mark.parametrize("argv", [
    ["-m", "ooc.train", "--threads", "abc"],
    ["-m", "ooc.prepare", "synthetic", "--nodes", "x", "--out", "unused"],
    ["-m", "ooc.partition", "--data", "d"],
    ["-m", "ooc.infer", "--data", "d"],
    ["-m", "ooc.size", "--bogus"],
])
def test_argument_errors_are_one_line(argv):
    """argparse's own errors (a bad type, a missing option) are one line too, exit 2."""
    import subprocess
    import sys

    from conftest import REPO, assert_one_line_error

    r = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert_one_line_error(r.stderr, "--help")
    assert not (REPO / "unused").exists()
