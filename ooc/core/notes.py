"""One-line notes on stderr: ``ooc: note: <text>``.

A note says something the user should know that is not an error (a reader
fell back to a slower backend, a one-off compile is running). Each distinct
note is printed once per process, flushed at once so it always comes before
a later error line, which CLIs print last (``ooc: <error>``).
"""
from __future__ import annotations

import sys
from typing import Callable

_seen: set[str] = set()
#: Where notes go; tests and embedding applications may replace it.
sink: Callable[[str], None] | None = None


def note(text: str, key: str | None = None) -> None:
    """Print ``ooc: note: text`` on stderr once per process per ``key`` (default: the text)."""
    k = text if key is None else key
    if k in _seen:
        return
    _seen.add(k)
    line = "ooc: note: " + " ".join(str(text).split())
    if sink is not None:
        sink(line)
        return
    print(line, file=sys.stderr, flush=True)


def reset() -> None:
    """Forget which notes were printed (tests)."""
    _seen.clear()
