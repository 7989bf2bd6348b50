"""Conventions shared by every ooc command line (DESIGN.md §8)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, Mapping, NoReturn, Sequence

from ooc.core.errors import InvalidValue, IOFailure, NotFound, OocError, OutputExists, cli_names
from ooc.core.jit import RESET_ENV, clear_kernel_cache, from_kernel_cache
from ooc.core.notes import note
from ooc.core.process import configure_process
from ooc.storage.atomic import within, write_json
from ooc.storage.bus_guard import guard


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the one-line error of every ooc command line:
    ``ooc: <problem> (see <prog> --help)`` on stderr, exit code 2, no usage block."""

    #: a value that starts with a minus and is not one number, e.g. ``-1,-1``
    _DASHED_VALUE = re.compile(r"^-\d+(\.\d+)?(,-?\d+(\.\d+)?)+$")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """``--fanouts -1,-1`` reads as ``--fanouts=-1,-1``: argparse takes a value that
        starts with ``-`` and is not a single number for an option."""
        args = list(sys.argv[1:] if args is None else args)
        merged: list[str] = []
        for tok in args:
            if (merged and self._DASHED_VALUE.match(tok) and merged[-1].startswith("--")
                    and "=" not in merged[-1]):
                merged[-1] = f"{merged[-1]}={tok}"
            else:
                merged.append(tok)
        return super().parse_known_args(merged, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ooc: {message} (see {self.prog} --help)\n")


def fail(message: str) -> NoReturn:
    """Print ``ooc: message`` (one line) to stderr and exit with code 2."""
    print(f"ooc: {message}".splitlines()[0] if message else "ooc: error", file=sys.stderr)
    sys.exit(2)


#: Exit code of a command ended by SIGTERM (128 + 15, as a shell reports a process killed by it).
TERMINATED_RC = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a command ran: raised in the main thread (as Ctrl-C raises
    :class:`KeyboardInterrupt`) so that every ``finally`` and ``with`` block on the way
    out runs: temporary outputs are removed, a launcher stops its workers."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread, when
    SIGTERM still has its default action there (a caller's own handler is left alone);
    the previous action is restored after. Python runs the handler between bytecodes:
    a kernel running at the time finishes first."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main_wrapper(fn: Callable[[Sequence[str] | None], int | None]) -> Callable[..., int]:
    """Decorate a CLI ``main(argv)``: the process-wide settings of ooc's commands
    (:func:`ooc.core.process.configure_process`), user errors become one line and exit 2,
    SIGTERM (a scheduler's or ``timeout``'s stop) cleans up as Ctrl-C does, then exits
    :data:`TERMINATED_RC` with one line, and a SIGBUS (a mapped input that shrank) is one
    line and exit 2 (:func:`ooc.storage.bus_guard.guard`)."""

    @functools.wraps(fn)
    def wrapped(argv: Sequence[str] | None = None) -> int:
        configure_process()
        try:
            try:
                with sigterm_raises(), cli_names(), guard():
                    rc = fn(argv)
            except Exception as e:
                _rerun_if_kernel_cache(e, argv)
                raise
        except OocError as e:
            fail(str(e))
        except FileNotFoundError as e:
            fail(f"{e.filename}: not found")
        except OSError as e:
            if e.filename is None:
                raise
            fail(f"{e.filename}: {e.strerror or e}")  # e.g. a read-only or full file system
        except Terminated:
            print("ooc: terminated (SIGTERM); nothing half-written was kept", file=sys.stderr)
            return TERMINATED_RC
        except KeyboardInterrupt:
            print("ooc: interrupted", file=sys.stderr)
            return 130
        return int(rc or 0)

    return wrapped


def _rerun_if_kernel_cache(e: Exception, argv: Sequence[str] | None) -> None:
    """A kernel cache numba cannot read (truncated, tampered) is cleared and the command run
    again from the start, once; called with ``argv`` from Python, one line asks for that."""

    if not from_kernel_cache(e):
        return
    gone = clear_kernel_cache()
    what = f"numba's cache of ooc's kernels was unreadable ({type(e).__name__}); cleared {gone} files"
    if argv is not None or os.environ.get(RESET_ENV):
        raise InvalidValue(f"{what}: run the command again to compile them anew") from None
    note(f"{what}, compiling them again")
    os.environ[RESET_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    again = ["-m", spec.name, *sys.argv[1:]] if spec is not None else list(sys.argv)
    os.execv(sys.executable, [sys.executable, *again])


#: The top-level key that marks a JSON file as a report ooc wrote; its value names the
#: command (``ooc.train``). ``--report`` replaces only such a file.
REPORT_KEY = "ooc_report"
#: A file larger than this is not read to see whether it is a report (none is).
_REPORT_MAX_BYTES = 64 << 20


def is_report(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file (not a symlink) holding a report ooc wrote: a JSON
    object with :data:`REPORT_KEY`."""
    import json
    import stat

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _REPORT_MAX_BYTES:
            return False
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get(REPORT_KEY), str)


def _check_replaceable(p: Path) -> None:
    """Refuse a ``--report`` path where something other than ooc's report exists."""
    if os.path.lexists(p) and not is_report(p):
        raise OutputExists(f"{p}: exists and is not a report ooc wrote; --report replaces only "
                           f"ooc's own reports (remove it or give another --report path)")


def check_report_path(report: str | None,
                      keep_out: Mapping[str, str | os.PathLike | None] | None = None) -> None:
    """Refuse a ``--report`` path before any work (a long run must not end unable to write
    it, nor write it over something of the user's): a folder, an existing file that is not
    a report ooc wrote (an input, a dataset's file, a checkpoint), a path that is or lies
    inside one of ``keep_out`` (what the run reads or writes, e.g. ``{"--out": out}``; None
    values are skipped), a missing folder, or one that does not take a new file
    (read-only, full; probed with a temporary file)."""
    import tempfile

    if report is None:
        return
    p = Path(report)
    if p.is_dir():
        raise InvalidValue(f"{p}: --report is a folder; give a file path")
    _check_replaceable(p)
    for what, folder in (keep_out or {}).items():
        if folder is not None and within(p, folder):
            raise InvalidValue(f"{p}: --report is or lies inside {what} {folder}; write the "
                               f"report elsewhere")
    parent = p.parent
    if not parent.is_dir():
        raise NotFound(f"{parent}: --report's folder does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".ooc-report-probe-"):
            pass
    except OSError as e:
        raise IOFailure(f"{parent}: --report's folder is not writable ({e.strerror or e})") \
            from None


def add_report_arg(p: argparse.ArgumentParser) -> None:
    """Add the ``--report PATH`` option (a JSON summary of the run) to ``p``."""
    p.add_argument("--report", metavar="PATH", help="write a JSON summary here (replaces only "
                   "a report ooc wrote)")


def write_report(path: str | os.PathLike, report: dict, note: str = "",
                 command: str = "ooc") -> None:
    """Write a ``--report`` JSON atomically, marked as ooc's report of ``command``
    (:data:`REPORT_KEY`, first); a failure is one :class:`OocError` line naming the file and
    the cause (``disk full`` for ENOSPC), then ``note``. A file other than ooc's report
    that appeared at ``path`` since :func:`check_report_path` is refused, not replaced."""
    import errno


    _check_replaceable(Path(path))
    try:
        write_json(path, {REPORT_KEY: command, **report})
    except OSError as e:
        what = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise IOFailure(f"{path}: cannot write the report ({what}){note}") from None
