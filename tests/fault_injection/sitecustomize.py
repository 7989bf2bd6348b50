"""Loaded at start-up by every Python process with this folder on ``PYTHONPATH``
(see ``__init__.py``): with ``OOC_TEST_FAULT=R:E[:how]`` set, rank ``R`` fails
right after its local training of epoch ``E`` (``E`` = 0: before its first local
training, while it has not made a batch yet). Without the variable it only
runs the ``sitecustomize`` it shadows (a distribution's, if any).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
import time

ENV = "OOC_TEST_FAULT"
HOWS = ("exit", "raise", "kill", "stop", "hang")
#: The module and method wrapped: a worker's local training of one epoch.
TARGET = "ooc.executor.distributed.averaging_trainer"
CLASS, METHOD = "AveragingTrainer", "train_local"


def parse(spec: str) -> tuple[int, int, str]:
    """``R:E[:how]`` as ``(rank, epoch, how)``."""
    bits = spec.split(":")
    if len(bits) not in (2, 3) or not all(b.strip().isdigit() for b in bits[:2]):
        raise ValueError(f"{ENV}={spec!r}: expected RANK:EPOCH[:how]")
    how = bits[2] if len(bits) == 3 else "exit"
    if how not in HOWS:
        raise ValueError(f"{ENV}={spec!r}: unknown how {how!r}")
    return int(bits[0]), int(bits[1]), how


def fail(how: str, epoch: int, spec: str) -> None:
    """Fail the way ``how`` says (does not return)."""
    what = f"injected {how} after epoch {epoch} ({ENV}={spec})"
    if how == "raise":
        raise RuntimeError(what)
    sys.stderr.write(f"ooc: {what}\n")
    sys.stderr.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)


def patch(module, spec: str) -> None:
    """Wrap ``module.AveragingTrainer.train_local`` to fail at the chosen rank and epoch
    (an AttributeError if the method is gone: the tests then see no injected failure)."""
    rank, epoch, how = parse(spec)
    cls = getattr(module, CLASS)
    original = getattr(cls, METHOD)

    def train_local(self):
        if epoch == 0 and self.comm.rank == rank:  # before any training: still starting
            fail(how, epoch, spec)
        sums = original(self)
        if self.comm.rank == rank and self.epoch + 1 == epoch:
            fail(how, epoch, spec)
        return sums

    setattr(cls, METHOD, train_local)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` like the path finder does, and patches it once executed."""

    def __init__(self, spec: str):
        parse(spec)  # a malformed variable fails the process at start-up
        self.spec = spec

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None or found.loader is None:
            return None
        exec_module = found.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module, self.spec)

        found.loader.exec_module = exec_and_patch
        return found


def run_shadowed_sitecustomize() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (this one hides it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if __name__ == "sitecustomize":
    if os.environ.get(ENV):
        sys.meta_path.insert(0, PatchOnImport(os.environ[ENV]))
    run_shadowed_sitecustomize()
