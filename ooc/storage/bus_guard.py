"""A one-line error, not a signal death, when a file ooc maps shrinks under it.

A load from a page of a file mapping that lies past the file's end (another program
truncated the file while ooc read it) or that the disk cannot read raises SIGBUS in the
thread that touched the page. Python cannot recover from it: a Python-level handler only
sets a flag and returns, and the load faults again, forever. So two layers:

* :func:`check_size` — the readers of mapped inputs (``features.bin`` of the ``baseline``
  preset and the ``mmap`` backend, ``indices.bin`` of the mapped neighbour reader) compare
  the file's size (``fstat`` through the mapping) with the bytes they map before each
  request: a file that shrank between batches is an :class:`IOFailure` naming it, raised
  like any other error (the run cleans up as it does for those).
* :func:`guard` — for the rest (the file shrinks while a batch is being copied), the
  command lines install a native SIGBUS handler, made once per process with llvmlite
  (numba's code generator): it writes one line naming the mapped inputs
  (:func:`watch`) to stderr and ends the process with exit code 2 (``_exit``). Both
  calls are async-signal-safe, so it cannot deadlock, and ``_exit`` cannot loop. As after
  ``kill -9``, nothing is cleaned up on that path: outputs are written to temp names and
  renamed, so what is left is a partial folder a later run removes or resumes. No Python
  code runs in the handler, and the previous disposition comes back when the guard ends.
  Where the handler cannot be made (no llvmlite, no ``sigaction``) the guard does
  nothing and the process dies of the signal as before.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from typing import Iterator

import numpy as np

from ooc.core.errors import IOFailure
from ooc.storage.pagecache import mapping_of

#: Bytes of the message buffer the handler writes (longer lists of files are cut).
MESSAGE_BYTES = 4096
#: Exit status of a process the handler ends (a CLI's bad-input status).
EXIT_CODE = 2
#: ``struct sigaction`` as glibc and musl lay it out on 64-bit Linux (handler first,
#: then a 1024-bit mask, flags, restorer), with room to spare.
SIGACTION_BYTES = 256

_lock = threading.Lock()
_watched: dict[str, None] = {}  # the mapped inputs, in the order they were mapped
_native: "_Handler | None" = None
_installed = 0  # nesting depth of guard()
_previous: ctypes.Array | None = None


class _Handler:
    """The native handler: ``void h(int)`` writing ``length`` bytes of ``buffer`` to
    stderr, then ``_exit(EXIT_CODE)`` (once: a second thread faulting waits for that
    exit); compiled with llvmlite's MCJIT."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm

        with contextlib.suppress(Exception):  # done already by numba, or not needed
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.buffer = ctypes.create_string_buffer(MESSAGE_BYTES)
        self.length = ctypes.c_int64(0)
        self.taken = ctypes.c_int32(0)  # set by the first faulting thread
        write, exit_, pause = (ctypes.cast(f, ctypes.c_void_p).value
                               for f in (self.libc.write, self.libc._exit, self.libc.pause))
        # the first thread to fault writes the line and exits; any other thread faulting
        # meanwhile waits (pause) for that exit, so the line is written once
        ir = f"""
define void @ooc_sigbus(i32 %sig) {{
entry:
  %old = atomicrmw xchg ptr inttoptr (i64 {ctypes.addressof(self.taken)} to ptr), i32 1 seq_cst
  %first = icmp eq i32 %old, 0
  br i1 %first, label %say, label %wait
say:
  %n = load volatile i64, ptr inttoptr (i64 {ctypes.addressof(self.length)} to ptr)
  %w = inttoptr i64 {write} to ptr
  %r = call i64 %w(i32 2, ptr inttoptr (i64 {ctypes.addressof(self.buffer)} to ptr), i64 %n)
  %x = inttoptr i64 {exit_} to ptr
  call void %x(i32 {EXIT_CODE})
  unreachable
wait:
  %p = inttoptr i64 {pause} to ptr
  %q = call i32 %p()
  br label %wait
}}
"""
        module = llvm.parse_assembly(ir)
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine()
        self.engine = llvm.create_mcjit_compiler(module, machine)  # keeps the code alive
        self.engine.finalize_object()
        self.address = self.engine.get_function_address("ooc_sigbus")
        self.libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.libc.sigaction.restype = ctypes.c_int

    def set_message(self, text: str) -> None:
        data = text.encode("utf-8", "replace")[:MESSAGE_BYTES - 1]
        if not data.endswith(b"\n"):
            data = data[:MESSAGE_BYTES - 2] + b"\n"
        self.length.value = 0  # a fault while the text changes writes nothing, then exits
        ctypes.memmove(self.buffer, data, len(data))
        self.length.value = len(data)

    def install(self) -> ctypes.Array:
        """Make the handler SIGBUS's; returns the previous ``struct sigaction``."""
        new = ctypes.create_string_buffer(SIGACTION_BYTES)
        ctypes.memmove(new, ctypes.byref(ctypes.c_void_p(self.address)), ctypes.sizeof(
            ctypes.c_void_p))
        old = ctypes.create_string_buffer(SIGACTION_BYTES)
        if self.libc.sigaction(int(signal.SIGBUS), new, old) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")
        return old

    def restore(self, old: ctypes.Array) -> None:
        self.libc.sigaction(int(signal.SIGBUS), old, None)


def message(paths: list[str]) -> str:
    """The line the handler writes, naming the mapped inputs ``paths``."""
    files = ", ".join(paths) if paths else "none so far"
    return (f"ooc: bus error reading a file mapped into memory (mapped inputs: {files}): "
            "a file shrank while the run read it, or its disk failed or is full; "
            "the run stopped (check or make the dataset again)")


def watch(path: str | os.PathLike) -> None:
    """Name ``path`` among the mapped inputs the handler's line lists."""
    key = os.fspath(os.path.abspath(path))
    with _lock:
        if key in _watched:
            return
        _watched[key] = None
        if _native is not None:
            _native.set_message(message(list(_watched)))


def _make_handler() -> "_Handler | None":
    global _native
    if _native is None:
        try:
            _native = _Handler()
        except Exception:  # noqa: BLE001 - no llvmlite or no sigaction: no guard
            return None
        _native.set_message(message(list(_watched)))
    return _native


@contextlib.contextmanager
def guard() -> Iterator[bool]:
    """Inside, a SIGBUS prints one line naming the mapped inputs and exits with code 2
    (see the module docstring); yields whether the handler is in place. Nests."""
    global _installed, _previous
    with _lock:
        handler = _make_handler()
        if handler is not None and _installed == 0:
            try:
                _previous = handler.install()
            except OSError:
                handler = None
        if handler is not None:
            _installed += 1
    try:
        yield handler is not None
    finally:
        if handler is not None:
            with _lock:
                _installed -= 1
                if _installed == 0 and _previous is not None:
                    handler.restore(_previous)
                    _previous = None


def check_size(arr: np.ndarray | None, path: str | os.PathLike, need: int) -> None:
    """Raise :class:`IOFailure` naming ``path`` when the file behind the mapping ``arr``
    (a memmap, or a view of one) now holds fewer than ``need`` bytes (it shrank after it
    was mapped); nothing when ``arr`` maps no file."""
    mm = mapping_of(arr)
    if mm is None:
        return
    try:
        size = mm.size()  # fstat of the mapped file's descriptor
    except (OSError, ValueError):
        return
    if size < need:
        raise IOFailure(f"{path}: the file shrank to {size:,} bytes while it was being read "
                        f"({need:,} expected): another program truncated it; restore it or "
                        "make the dataset again")
