"""What ooc made, provably: a marker file with a random token in every folder ooc creates.

ooc deletes or replaces a folder only when it carries the marker of the right kind (an
output of ``--overwrite``, a temporary folder of a killed run, a runtime folder), never by
its name or by a ``meta.json`` alone: a user's folder that happens to look like one is
left alone. The marker is ``<folder>/.ooc-made``, JSON ``{"kind", "token", "pid"}``; a
symlink is never taken for a marked folder.

Kinds: ``output`` (a folder :func:`~.atomic.atomic_dir` built and renamed into place;
its temporary folder carries the same marker while it is written), ``runtime`` (a
training run's runtime folder).
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

MARKER = ".ooc-made"


def mark(folder: str | os.PathLike, kind: str) -> str:
    """Write the marker of ``kind`` into ``folder`` (an existing folder); returns its token."""
    token = secrets.token_hex(16)
    path = Path(folder) / MARKER
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump({"kind": kind, "token": token, "pid": os.getpid()}, f)
    return token


def marker(folder: str | os.PathLike) -> dict | None:
    """The marker of ``folder`` (a real folder, not a symlink, holding a regular marker
    file; a finished Zarr output keeps it in its group's attributes, ``ooc.made``), or
    None."""
    folder = Path(folder)
    path = folder / MARKER
    try:
        if folder.is_symlink() or not folder.is_dir() or path.is_symlink():
            return None
        if path.exists():
            doc = json.loads(path.read_text())
        else:
            doc = json.loads((folder / "zarr.json").read_text())["attributes"]["ooc"]["made"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("token"), str):
        return None
    return doc


def made_by_ooc(folder: str | os.PathLike, kind: str) -> bool:
    """Whether ``folder`` carries ooc's marker of ``kind``."""
    doc = marker(folder)
    return doc is not None and doc.get("kind") == kind
