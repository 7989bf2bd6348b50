"""Sizes (``512MiB``, ``8GiB``) and value ranges: parsing and one-line refusals."""
from __future__ import annotations

import re

from ooc.core.errors import InvalidValue, setting

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class SizeError(InvalidValue):
    """Not a size (also a ``ValueError``; argparse reports it as an invalid size)."""


def parse_size(text: str | int) -> int:
    """Bytes from a size such as ``512MiB``, ``8GiB``, ``1.5G``, ``200MB``, ``4096``.

    ``KiB``/``MiB``/``GiB``/``TiB`` and the bare letters ``K``/``M``/``G``/``T`` are powers
    of 1024; ``KB``/``MB``/``GB``/``TB`` are powers of 1000, as storage vendors count.

    Raises:
        SizeError: not a size.
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise SizeError(f"not a size: {text!r} (use e.g. 512MiB, 8GiB, 1.5G)")
    letter, suffix = m.group(2).lower(), (m.group(3) or "").lower()
    unit = _UNITS[letter] if suffix != "b" or not letter else 1000 ** "kmgt".index(letter) * 1000
    return int(float(m.group(1)) * unit)


parse_size.__name__ = "size"  # argparse's message: "invalid size value: 'x'"


def format_size(nbytes: float) -> str:
    """Human-readable binary size, e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def check_range(option: str, value: float | int | None, lo: float | None = None,
                hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
                integer: bool = False) -> None:
    """Refuse an option value outside ``[lo, hi]`` (open ends with ``lo_open``/``hi_open``).

    ``None`` (an option left out) passes; NaN and infinities never do. Raises
    :class:`OocError` with one line naming the option, e.g. ``--lr inf: must
    be a finite number > 0``.
    """
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer and not float(value).is_integer():
        ok = False
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond float's range
            v = float("inf") if value > 0 else float("-inf")
        ok = v == v and abs(v) != float("inf")
        ok = ok and (lo is None or (v > lo if lo_open else v >= lo))
        ok = ok and (hi is None or (v < hi if hi_open else v <= hi))
    if ok:
        return
    kind = "an integer" if integer else "a finite number"
    num = (lambda x: str(int(x))) if integer else (lambda x: f"{x:g}")
    lo_s = None if lo is None else f"{'>' if lo_open else '>='} {num(lo)}"
    hi_s = None if hi is None else f"{'<' if hi_open else '<='} {num(hi)}"
    if lo_s and hi_s:
        rng = (f" in [{num(lo)}, {num(hi)}]" if not (lo_open or hi_open)
               else f" {lo_s} and {hi_s}")
    else:
        rng = f" {lo_s or hi_s}" if (lo_s or hi_s) else ""
    raise InvalidValue(f"{setting(option)} {value}: must be {kind}{rng}")
