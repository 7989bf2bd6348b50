"""What ooc made, provably: a marker file with a random token in every folder ooc creates.

ooc deletes or replaces a folder only when it carries the marker of the right kind (an
output of ``--overwrite``, a temporary folder of a killed run, a runtime folder), never by
its name or by a ``meta.json`` alone: a user's folder that happens to look like one is
left alone. The marker is ``<folder>/.ooc-made``, JSON ``{"kind", "token", "pid"}``, plus
``what`` (which output it is: :data:`OUTPUTS`) and ``files`` (the names ooc wrote at the
folder's top level) once the output is complete; a symlink is never taken for a marked
folder.

An output is replaced only by an output of the same ``what`` (:func:`what_refusal`): a
partition run never replaces a dataset or an inference output, nor ``ooc.prepare`` a
partition set, and an output that lies inside another (one partition of a set) is not
replaced on its own.

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

from ooc.core.errors import NotFound

MARKER = ".ooc-made"

#: The outputs of ooc's commands (a marker's ``what``), as messages name them.
OUTPUTS = {"dataset": "a dataset (ooc.prepare)", "partitions": "a partition set (ooc.partition)",
           "inference": "an inference output (ooc.infer)",
           "neighbor_cache": "a neighbour cache (ooc.train)"}
#: A top-level file that tells an output written before markers recorded ``what``.
_TELLING_FILE = (("partition.json", "partitions"), ("progress.json", "inference"),
                 ("zarr.json", "inference"), ("cache_array.npy", "neighbor_cache"),
                 ("meta.json", "dataset"))
#: The output another output is made inside of (a neighbour cache lives in its dataset).
_LIVES_IN = {"neighbor_cache": "dataset"}


def mark(folder: str | os.PathLike, kind: str, what: str | None = None) -> str:
    """Write the marker of ``kind`` (and output ``what``, a key of :data:`OUTPUTS`) into
    ``folder`` (an existing folder); returns its token."""
    token = secrets.token_hex(16)
    path = Path(folder) / MARKER
    doc: dict = {"kind": kind, "token": token, "pid": os.getpid()}
    if what is not None:
        doc["what"] = what
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
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


def output_what(folder: str | os.PathLike) -> str | None:
    """Which output (a key of :data:`OUTPUTS`) the ooc output ``folder`` is: its marker's
    ``what``, or for an output marked before markers recorded it, the file that tells
    (:data:`_TELLING_FILE`); None when neither says."""
    doc = marker(folder)
    if doc is None or doc.get("kind") != "output":
        return None
    if isinstance(doc.get("what"), str):
        return doc["what"]
    return next((w for name, w in _TELLING_FILE if (Path(folder) / name).is_file()), None)


def enclosing_output(path: str | os.PathLike) -> Path | None:
    """The nearest folder above ``path`` that is an ooc output (e.g. the partition set
    holding one partition's dataset), or None."""
    for parent in Path(os.path.abspath(path)).parents:
        if made_by_ooc(parent, "output"):
            return parent
    return None


def what_refusal(final: str | os.PathLike, what: str) -> str | None:
    """Why a new output ``what`` may not replace the ooc output ``final``, or None: it must
    be an output of the same ``what`` and not lie inside another ooc output (but the one
    it lives in, :data:`_LIVES_IN`)."""
    theirs = output_what(final)
    if theirs != what:
        is_ = OUTPUTS.get(theirs or "", "an ooc output of another kind")
        return (f"is {is_}, not {OUTPUTS.get(what, what)}: --overwrite replaces only an "
                f"output of its own kind (remove it yourself or pick another --out)")
    outer = enclosing_output(final)
    if outer is not None and output_what(outer) != _LIVES_IN.get(what):
        return (f"lies inside {outer}, {OUTPUTS.get(output_what(outer) or '', 'an ooc output')}; "
                f"replacing it alone would break that output (pick another --out)")
    return None


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
