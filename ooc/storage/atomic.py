"""Write-then-rename helpers so nothing half-written ever looks valid."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from ooc.core.errors import InvalidValue, OutputExists
from ooc.storage.locks import exclusive
from ooc.storage.ownership import MARKER, made_by_ooc, mark, record_files, user_entries, what_refusal


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a
    moment, in every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts; another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _temp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def remove_stale_temps(final: str | os.PathLike) -> list[Path]:
    """Remove the temporary folders :func:`atomic_dir` left beside ``final``
    in processes that no longer run (``.NAME.tmp-PID-*`` with PID dead, carrying ooc's
    marker), and ``.NAME.old-PID`` folders (the old output, marked) once ``final``
    exists; a folder holding entries of the user's (:func:`~.ownership.user_entries`,
    moved there by a run killed while replacing an output) is kept. Returns what was
    removed."""

    final = Path(final)
    removed: list[Path] = []
    prefix, old = _temp_prefix(final), f".{final.name}.old-"
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        if p.name.startswith(prefix):
            pid = p.name[len(prefix):].split("-", 1)[0]
        elif p.name.startswith(old) and final.exists():
            pid = p.name[len(old):]
        else:
            continue
        if (pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid))
                and made_by_ooc(p, "output") and not user_entries(p)):
            _remove(p)
            removed.append(p)
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``); False where the system or file system cannot."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, overwrite: bool = False,
               replaceable: Callable[[Path], str | None] | None = None,
               locked: str | None = None, inputs: tuple = (),
               what: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; rename it into place on success.

    The folder is ``.NAME.tmp-PID-XXXX``; those of processes that died are
    removed first (:func:`remove_stale_temps`). On any exception the
    temporary folder is removed and ``final`` is left as it was. With
    ``overwrite`` an existing ``final`` is replaced only after the new folder
    is complete, by an atomic exchange of the two names where the system
    supports it (so ``final`` never disappears), and only when
    ``replaceable(final)`` (if given) returns None; otherwise its return value
    says why not.

    ``locked`` (what the output is, for the error) holds :func:`~.locks.exclusive` on
    ``final`` throughout, so a second writer of the same output is refused naming the
    first one's pid. The temporary folder carries ooc's ``output`` marker
    (:mod:`~.ownership`), and so does ``final`` once renamed: an existing ``final`` is
    replaced only when it carries one, and never when it is, holds or lies inside one of
    ``inputs`` (paths). ``what`` (a key of :data:`~.ownership.OUTPUTS`) is recorded in the
    marker, and an existing ``final`` is then replaced only when it is an output of the same
    ``what`` (:func:`~.ownership.what_refusal`). The marker records the names the new output
    holds; entries of the user's in the old output (:func:`carry_user_files`) move into the
    new one.

    Raises:
        OutputExists: (a ``FileExistsError``) ``final`` exists and may not be replaced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if locked is None:
        yield from _atomic_dir(final, overwrite, replaceable, inputs, what)
        return

    with exclusive(final, locked):
        yield from _atomic_dir(final, overwrite, replaceable, inputs, what)


def carry_user_files(old: Path, new: Path) -> list[str]:
    """Move the entries of the user's in the ooc output ``old``
    (:func:`~.ownership.user_entries`) into ``new``, the output replacing it; returns
    their names.

    Raises:
        OutputExists: ``new`` has an entry of the same name (nothing is moved).
    """

    names = user_entries(old)
    clash = [n for n in names if os.path.lexists(new / n)]
    if clash:
        raise OutputExists(f"{old}: holds {clash[0]}, which ooc did not write and the new "
                              f"output also has; move it out of {old} first")
    for n in names:
        os.rename(old / n, new / n)
    return names


def within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (symlinks resolved; False when
    either cannot be resolved)."""
    try:
        real, top = Path(path).resolve(), Path(folder).resolve()
    except (OSError, RuntimeError):
        return False
    return real == top or top in real.parents


def replace_refusal(final: Path, inputs: tuple = (), what: str | None = None) -> str | None:
    """Why ``--overwrite`` may not replace ``final``, or None: it must carry ooc's output
    marker, be a real folder (not a symlink), neither be, hold nor lie inside one of
    ``inputs`` and, with ``what``, be an output of that kind that lies inside no other
    (:func:`~.ownership.what_refusal`)."""

    for p in inputs:
        if p is not None and os.path.lexists(p) and (within(final, p) or within(p, final)):
            return f"holds or lies inside the input {p}; --overwrite would delete it"
    if not made_by_ooc(final, "output"):
        return (f"was not made by ooc (no {MARKER} marker); --overwrite replaces only ooc's "
                f"own outputs (remove it yourself or pick another --out)")
    return what_refusal(final, what) if what is not None else None


def _atomic_dir(final: Path, overwrite: bool, replaceable: Callable[[Path], str | None] | None,
                inputs: tuple, what: str | None) -> Iterator[Path]:
    remove_stale_temps(final)
    if os.path.lexists(final):
        if not overwrite:
            raise OutputExists(f"{final}: already exists (pass --overwrite to replace it)")
        problem = (replaceable(final) if replaceable is not None else None) \
            or replace_refusal(final, inputs, what)
        if problem:
            raise OutputExists(f"{final}: {problem}")
    tmp = Path(tempfile.mkdtemp(prefix=f"{_temp_prefix(final)}{os.getpid()}-", dir=final.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the result from others
        mark(tmp, "output", what)
        yield tmp
        record_files(tmp)
        if os.path.lexists(final):
            carry_user_files(final, tmp)
            if not exchange(tmp, final):
                old = tmp.with_name(tmp.name + "-old")
                os.rename(final, old)
                os.rename(tmp, final)
                tmp = old
        else:
            os.rename(tmp, final)
            return
    except BaseException:
        _remove(tmp)
        raise
    _remove(tmp)  # now holds what ``final`` was


@contextlib.contextmanager
def atomic_file(final: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file beside ``final``; fsync and rename it on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from others
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically.

    Raises:
        InvalidValue: ``obj`` holds NaN or an infinity, which JSON has no number for
            (Python would write ``NaN``, which other readers refuse); nothing is written.
    """
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default,
                          allow_nan=False)
    except ValueError:
        key, value = _first_non_finite(obj)
        if value is None:  # not a number's fault (a circular reference)
            raise
        raise InvalidValue(f"{path}: {key or 'the value'} is {value}, which JSON cannot "
                           f"hold; nothing was written") from None
    with atomic_file(path, "w") as f:
        f.write(text + "\n")


def _first_non_finite(obj: Any, key: str = "") -> tuple[str, float | None]:
    """The dotted key of the first NaN or infinity in ``obj`` (numpy values included) and
    that value; ``("", None)`` when there is none."""
    import math

    if hasattr(obj, "tolist"):  # a numpy array or scalar
        obj = obj.tolist()
    if isinstance(obj, float):
        return (key, obj) if not math.isfinite(obj) else ("", None)
    if isinstance(obj, dict):
        children: Any = ((f"{key}.{k}" if key else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        children = ((f"{key}[{i}]", v) for i, v in enumerate(obj))
    else:
        return "", None
    for k, v in children:
        found = _first_non_finite(v, k)
        if found[1] is not None:
            return found
    return "", None


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
