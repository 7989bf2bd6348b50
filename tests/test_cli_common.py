import argparse

import pytest

from ooc.cli import format_size, parse_size


@pytest.mark.parametrize("text,value", [("512MiB", 512 << 20), ("8GiB", 8 << 30), ("1.5G", 3 << 29),
                                        ("4096", 4096), ("10k", 10240), ("2 TB", 2 << 40)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3G", "-5M", "5X"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_format_size():
    assert format_size(1536) == "1.5 KiB"
    assert format_size(12) == "12 B"
