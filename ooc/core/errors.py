"""ooc's errors: one hierarchy under :class:`OocError`, each class also the builtin
exception of its kind, so ``except ValueError`` or ``except FileNotFoundError`` works as
it does for Python's own errors.

Every error a user can cause with bad input is an :class:`OocError`; its message is one
line that names the file (or the setting) and the problem. CLIs turn it into
``ooc: <message>`` on stderr and exit code 2.

========================  ======================  ===============================================
class                     also a                  raised for
========================  ======================  ===============================================
:class:`InvalidValue`     ``ValueError``          a setting, an argument or an input ooc cannot use
:class:`UnknownSetting`   ``ValueError``,         a keyword argument no setting has (``epochz=3``)
                          ``TypeError``
:class:`BudgetError`      ``ValueError``          a memory or disk budget too small for the work
:class:`DatasetError`     ``ValueError``          a dataset folder or file missing, truncated, invalid
:class:`IdOutOfRange`     ``IndexError``          a node or row id outside ``[0, N)``
:class:`NotFound`         ``FileNotFoundError``   a file or folder named by the user is missing
:class:`OutputExists`     ``FileExistsError``     an output exists and may not be replaced
:class:`OutputBusy`       ``RuntimeError``        another ooc process is writing that output
:class:`IOFailure`        ``OSError``             the system refused a read or write (full, read-only)
:class:`TimedOut`         ``TimeoutError``        another process did not finish in time
========================  ======================  ===============================================

A setting is named the way its caller wrote it (:func:`setting`): ``--memory-budget`` from a
command line, ``memory_budget`` from Python.

Elsewhere: ``CheckpointError`` (``ValueError``), ``TrainingDiverged`` and
``NonFiniteOutput`` (``FloatingPointError``), ``SizeError`` (an :class:`InvalidValue`).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator

#: Whether the running code serves a command line (:func:`cli_names`).
_CLI_NAMES: contextvars.ContextVar[bool] = contextvars.ContextVar("ooc_cli_names", default=False)
#: CLI options whose Python keyword is not the option with ``-`` turned into ``_``.
_KEYWORDS = {"--checkpoint-dir": "checkpoint_dir",
             "--overwrite": "overwrite=True"}


def setting(option: str, keyword: str | None = None) -> str:
    """The name of the setting ``option`` (its CLI flag, e.g. ``--memory-budget``) the way
    the caller wrote it: the flag under a command line (:func:`cli_names`), else the Python
    keyword (``keyword``, or the flag as a keyword: ``memory_budget``), so an error names
    what the user can change."""
    if _CLI_NAMES.get() or not option.startswith("--"):
        return option
    return keyword or _KEYWORDS.get(option, option[2:].replace("-", "_"))


@contextlib.contextmanager
def cli_names() -> Iterator[None]:
    """Errors raised inside name settings by their CLI flags (the CLIs' ``main``)."""
    token = _CLI_NAMES.set(True)
    try:
        yield
    finally:
        _CLI_NAMES.reset(token)


class OocError(Exception):
    """A user-facing error with a one-line message (CLIs exit with code 2)."""


class InvalidValue(OocError, ValueError):
    """A setting, an argument or an input holds a value ooc cannot use."""


class UnknownSetting(InvalidValue, TypeError):
    """A keyword argument that names no setting: also the ``TypeError`` Python raises for
    an unexpected keyword (the message names the closest setting)."""


class BudgetError(InvalidValue):
    """A memory or disk budget is too small for the work asked of it (the message names
    the budget that works)."""


class IdOutOfRange(OocError, IndexError):
    """A node or row id outside ``[0, N)``."""


class NotFound(OocError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class OutputExists(OocError, FileExistsError):
    """An output exists and may not be replaced (no ``--overwrite``, or not ooc's)."""


class OutputBusy(OocError, RuntimeError):
    """Another ooc process holds the lock of that output."""


class IOFailure(OocError, OSError):
    """The system refused a read or a write (a full disk, a read-only folder)."""


class TimedOut(OocError, TimeoutError):
    """Another process did not finish its part within the time allowed."""


class DatasetError(OocError, ValueError):
    """A dataset folder or one of its files is missing, truncated or invalid."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
