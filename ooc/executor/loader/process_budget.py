"""One memory budget for the whole process, shared by the loaders made under it.

::

    with ooc.memory_budget("4GiB"):
        train = ooc.NodeLoader(ds, [10, 10], input_nodes="train", batch_size=1024,
                               shuffle=True)
        val = ooc.NodeLoader(ds, [10, 10], input_nodes="val", batch_size=4096)
        for epoch in range(10):
            for data in train: ...
            for data in val: ...

A ``NodeLoader`` made while a budget is set (the ``with`` block, or
:func:`set_memory_budget` for the rest of the process) and given no
``memory_budget`` of its own joins it; a ``Trainer`` and
``layerwise_inference`` made under it plan with it (their plans measure what the
process already holds, the loaders' caches included).

- **Groups.** Loaders of one dataset folder with the same preset and cache
  options form a group: one opened dataset, one set of readers, one neighbor
  cache and one feature cache. The group's *owner* runs the preset's schedule
  (for ``ooc`` the inspector and its Belady changesets): the first loader made
  with ``shuffle=True`` (a training loader), else the first made. The others
  sample on demand over the same readers and read hits from the same caches,
  as the trainer's evaluation does; their batches are the ones they would get
  alone.
- **Working memory.** Each loader measures its own when it is made (its batches
  in flight sampled and gathered: :func:`~ooc.executor.sizing.budget.plan_memory`);
  a loader that does not fit the budget on its own is refused then, with the
  smallest budget that works.
- **The split.** A group's caches are sized when the first epoch of one of its
  loaders starts: the budget less its reserve, the largest working memory of its
  loaders (loaders take turns, one epoch at a time) and the caches of groups
  already built, shared evenly by the groups not yet built
  (:func:`~ooc.executor.sizing.plan.compose_plan`, as a single loader's plan). A loader made after
  its group was built runs beside the caches built, or is refused: make every
  loader before the first epoch and the budget is split among them.
- **Taking turns.** An epoch started while another loader's epoch of the same
  budget is running holds two loops' batches, which the split did not plan for:
  it runs, and a warning says so (once per budget).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.core.sizes import SizeError, parse_size
from ooc.executor.loader.stack import build_stack
from ooc.executor.sizing.budget import plan_memory
from ooc.executor.sizing.plan import (
    NEIGHBOR_FRACTION,
    DatasetShape,
    compose_plan,
    default_reserve,
    explicit_neighbor_bytes,
)
from ooc.storage import open_dataset

_LOCK = threading.RLock()
_ACTIVE: list["MemoryBudget"] = []  # the `with` blocks, innermost last
_PROCESS: list["MemoryBudget"] = []  # set_memory_budget's, at most one


def parse_budget(nbytes: int | str) -> int:
    """Bytes of a budget given as bytes or a size such as ``"4GiB"`` (positive)."""

    try:
        n = parse_size(nbytes)
    except SizeError as e:
        raise InvalidValue(f"memory budget: {e}") from None
    if n <= 0:
        raise InvalidValue(f"memory budget must be positive, got {nbytes!r}")
    return int(n)


@dataclass(eq=False)
class _Member:
    """A loader of a group: what its pipeline is made from, and the pipeline once made."""

    config: Any
    seeds: np.ndarray
    shuffle: bool
    workers: int
    plan: Any
    pipeline: Any = None


@dataclass(eq=False)
class _Group:
    """Loaders sharing one dataset, preset and cache options: one stack."""

    dataset: Any
    preset: Any
    opts: Any
    members: list = field(default_factory=list)
    stack: Any = None
    plan: Any = None
    owner: "_Member | None" = None

    @property
    def cache_bytes(self) -> int:
        info = self.stack.info if self.stack is not None else {}
        return int(info.get("feature_cache_bytes", 0)) + int(info.get("neighbor_cache_bytes", 0))


class MemoryBudget:
    """Bytes the process may hold, split between the loaders made under it.

    Attributes:
        total: the budget in bytes.
        reserve: bytes held back for what no probe sees (as a single loader's).
    """

    def __init__(self, nbytes: int | str):
        self.total = parse_budget(nbytes)
        self.reserve = default_reserve(self.total)
        self._groups: dict[tuple, _Group] = {}
        self._live_epochs = 0
        self._warned = False

    def __repr__(self) -> str:
        return f"MemoryBudget({self.total} bytes, {len(self._groups)} groups)"

    # -- loaders ------------------------------------------------------------------
    def dataset(self, path) -> Any:
        """The dataset a group of this budget already opened from folder ``path``, or a
        newly opened one."""

        real = os.path.realpath(path)
        with _LOCK:
            for g in self._groups.values():
                if os.path.realpath(g.dataset.path) == real:
                    return g.dataset
        return open_dataset(path)

    def join(self, dataset, preset, opts, config, seeds: np.ndarray, shuffle: bool,
             workers: int) -> "Membership":
        """Measure a loader's working memory under this budget and add it to its group.

        Raises:
            BudgetError: the loader alone does not fit beside what the process holds.
        """

        plan = plan_memory(dataset, config, self.total, opts, preset=preset, workers=workers,
                           seeds=seeds)
        key = (os.path.realpath(dataset.path), preset.name, preset.readers.name,
               id(preset.policy), _options_key(opts))
        member = _Member(config, seeds, bool(shuffle), int(workers), plan)
        with _LOCK:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(dataset, preset, opts)
            group.members.append(member)
        return Membership(self, key, member)

    def _pipeline(self, key: tuple, member: _Member):
        with _LOCK:
            group = self._groups[key]
            if group.stack is None:
                self._build(group)
            if member.pipeline is None:
                if member is group.owner:
                    member.pipeline = group.stack.train
                else:
                    member.pipeline = group.stack.on_demand(member.seeds, member.config,
                                                            member.shuffle)
                member.pipeline.workers = member.workers
            return member.pipeline

    @staticmethod
    def _owner(group: _Group) -> _Member:
        return next((m for m in group.members if m.shuffle), group.members[0])

    def _build(self, group: _Group) -> None:
        """Size the group's caches (the split) and build its stack for its owner."""

        owner = group.owner = self._owner(group)
        working = max(m.plan.working for g in self._groups.values() for m in g.members)
        built = sum(g.cache_bytes for g in self._groups.values() if g.stack is not None)
        pending = sum(1 for g in self._groups.values() if g.stack is None and g.members)
        shape = DatasetShape.of(group.dataset, full_neighbor_cache=explicit_neighbor_bytes(
            group.preset, group.opts) is None)
        plan = group.plan = compose_plan(
            shape, owner.plan.measured, self.total, group.preset, group.opts,
            batch_size=owner.config.batch_size, reserve=self.reserve,
            neighbor_fraction=NEIGHBOR_FRACTION, built=built, shares=pending,
            others_working=working)
        group.stack = build_stack(group.dataset, owner.config, group.opts, plan=plan,
                                  seeds=owner.seeds, shuffle=owner.shuffle, preset=group.preset)
        group.stack.info.update(budget_bytes=self.total, budget_loaders=len(group.members))

    def _leave(self, key: tuple, member: _Member) -> None:
        with _LOCK:
            group = self._groups.get(key)
            if member.pipeline is not None:
                member.pipeline.close()
                member.pipeline = None
            if group is None or member not in group.members:
                return
            group.members.remove(member)
            if not group.members:
                del self._groups[key]
                stack, group.stack = group.stack, None
                if stack is not None:
                    stack.close()

    @contextlib.contextmanager
    def _epoch(self) -> Iterator[None]:
        with _LOCK:
            self._live_epochs += 1
            warn = self._live_epochs > 1 and not self._warned
            self._warned |= warn
        if warn:
            warnings.warn("two loaders under one ooc.memory_budget run epochs at once; the "
                          "budget was split for one epoch at a time, so the peak may pass it",
                          ResourceWarning, stacklevel=4)
        try:
            yield
        finally:
            with _LOCK:
                self._live_epochs -= 1


def _options_key(opts) -> tuple:
    """The cache and I/O options that decide a stack (the budget is the group's)."""
    d = dict(vars(opts))
    d.pop("memory_budget", None)
    return tuple(sorted(d.items()))


class Membership:
    """A loader's place in a :class:`MemoryBudget`: its pipeline, made on first use
    (which builds the group's stack), and its release."""

    def __init__(self, budget: MemoryBudget, key: tuple, member: _Member):
        self.budget, self._key, self._member = budget, key, member

    @property
    def plan(self):
        """The group's plan once built (cache sizes of the split), else the loader's own."""
        group = self.budget._groups.get(self._key)
        return group.plan if group is not None and group.plan is not None else self._member.plan

    def pipeline(self):
        return self.budget._pipeline(self._key, self._member)

    @property
    def info(self) -> dict:
        group = self.budget._groups.get(self._key)
        return dict(group.stack.info) if group is not None and group.stack is not None else {}

    def epoch(self):
        """A context held while one of the loader's epochs runs (the turn-taking check)."""
        return self.budget._epoch()

    def close(self) -> None:
        self.budget._leave(self._key, self._member)


def current_budget() -> MemoryBudget | None:
    """The budget loaders made now join: the innermost ``with ooc.memory_budget(...)``,
    else the one of :func:`set_memory_budget`, else None."""
    with _LOCK:
        if _ACTIVE:
            return _ACTIVE[-1]
        return _PROCESS[0] if _PROCESS else None


def process_total() -> int | None:
    """Bytes of the budget things made now run under (:func:`current_budget`), or None."""
    budget = current_budget()
    return budget.total if budget is not None else None


@contextlib.contextmanager
def memory_budget(nbytes: int | str) -> Iterator[MemoryBudget]:
    """A budget (bytes, or a size such as ``"4GiB"``) for every loader, trainer and
    inference made inside the ``with`` block; loaders keep it after the block ends."""
    budget = MemoryBudget(nbytes)
    with _LOCK:
        _ACTIVE.append(budget)
    try:
        yield budget
    finally:
        with _LOCK:
            _ACTIVE.remove(budget)


def set_memory_budget(nbytes: int | str | None) -> MemoryBudget | None:
    """Set the process's budget for what is made from now on outside any ``with
    ooc.memory_budget(...)`` block (None removes it); returns it."""
    with _LOCK:
        _PROCESS.clear()
        if nbytes is not None:
            _PROCESS.append(MemoryBudget(nbytes))
        return _PROCESS[0] if _PROCESS else None
