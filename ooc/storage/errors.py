"""Errors raised by the storage layer.

Every error a user can cause with bad input is an :class:`OocError`; its
message is one line that names the file and the problem. CLIs turn it into
``ooc: <message>`` on stderr and exit code 2.
"""
from __future__ import annotations

import os


class OocError(Exception):
    """A user-facing error with a one-line message (CLIs exit with code 2)."""


class DatasetError(OocError):
    """A dataset folder or one of its files is missing, truncated or invalid."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
