"""What ooc made, provably: a marker file with a random token in every folder ooc creates.

ooc deletes or replaces a folder only when it carries the marker of the right kind (an
output of ``--overwrite``, a temporary folder of a killed run, a runtime folder), never by
its name or by a ``meta.json`` alone: a user's folder that happens to look like one is
left alone. The marker is ``<folder>/.ooc-made``, JSON ``{"kind", "token", "pid"}``, plus
``files`` (the names ooc wrote at the folder's top level) once the output is complete; a
symlink is never taken for a marked folder.

Anything else in a finished output is the user's (:func:`user_entries`): ``--overwrite``
carries it into the new output, and the sweep of temporary folders leaves a folder
holding such entries alone.

Kinds: ``output`` (a folder :func:`~.atomic.atomic_dir` built and renamed into place;
its temporary folder carries the same marker while it is written), ``runtime`` (a
training run's runtime folder).
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from .errors import NotFound

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


def record_files(folder: str | os.PathLike) -> None:
    """Add ``files`` (the sorted names now at the top of ``folder``, the marker aside) to
    the marker of ``folder``: what is there now is ooc's. Written to a temporary name and
    renamed over the marker."""
    folder = Path(folder)
    doc = marker(folder)
    if doc is None or not (folder / MARKER).is_file():
        raise NotFound(f"{folder}: has no ooc marker to record its files in")
    doc["files"] = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    tmp = folder / f"{MARKER}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, folder / MARKER)


def _made_tree(p: Path) -> bool:
    """``p`` is a folder ooc made (any kind of marker), or a real folder holding only
    such folders (e.g. ``neighbor_cache/`` of a dataset)."""
    if p.is_symlink() or not p.is_dir():
        return False
    return marker(p) is not None or all(_made_tree(c) for c in p.iterdir())


def user_entries(folder: str | os.PathLike) -> list[str]:
    """Names at the top of the ooc output ``folder`` that ooc did not write: not in its
    marker's ``files``, not the marker, not a folder ooc made later (a neighbor cache).
    Empty when the marker records no ``files`` (an output still being written, or one
    written before ooc recorded them)."""
    folder = Path(folder)
    doc = marker(folder)
    files = doc.get("files") if doc is not None else None
    if not isinstance(files, list):
        return []
    known = set(files) | {MARKER}
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in known and not p.name.startswith(f"{MARKER}.tmp-")
                  and not _made_tree(p))
