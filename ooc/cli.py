"""Conventions shared by every ooc command line (DESIGN.md §8)."""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from typing import Callable, NoReturn, Sequence

from .memory import peak_rss_bytes  # noqa: F401  (re-exported for CLIs)
from .storage.errors import OocError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from a size such as ``512MiB``, ``8GiB``, ``1.5G``, ``4096``.

    K/M/G/T with or without ``i``/``B`` are all binary (powers of 1024).
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512MiB, 8GiB, 1.5G)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(value)


def format_size(nbytes: float) -> str:
    """Human-readable binary size, e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def fail(message: str) -> NoReturn:
    """Print ``ooc: message`` (one line) to stderr and exit with code 2."""
    print(f"ooc: {message}".splitlines()[0] if message else "ooc: error", file=sys.stderr)
    sys.exit(2)


def main_wrapper(fn: Callable[[Sequence[str] | None], int | None]) -> Callable[..., int]:
    """Decorate a CLI ``main(argv)``: user errors become one line and exit 2."""

    @functools.wraps(fn)
    def wrapped(argv: Sequence[str] | None = None) -> int:
        try:
            rc = fn(argv)
        except OocError as e:
            fail(str(e))
        except FileNotFoundError as e:
            fail(f"{e.filename}: not found")
        except KeyboardInterrupt:
            print("ooc: interrupted", file=sys.stderr)
            return 130
        return int(rc or 0)

    return wrapped


def add_report_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="PATH", help="write a JSON summary here")


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
