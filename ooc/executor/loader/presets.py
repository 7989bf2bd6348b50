"""Presets: a reader kind paired with a feature-cache policy, by name.

=============  ==================  ==========================================
preset         readers             feature cache policy
=============  ==================  ==========================================
``baseline``   memmaps + threads   none (the page cache; the papers' PyG+)
``static``     O_DIRECT            highest out-degree rows (PaGraph, Ali+PG)
``ooc``        O_DIRECT            Belady changesets over superbatches (Ginex)
``packed``     O_DIRECT            Belady, misses swept and packed per batch
``auto``       O_DIRECT            Belady, packed where the disk's rates say so
=============  ==================  ==========================================

The O_DIRECT presets put the Ginex neighbor cache in front of the neighbour
reads. Everything that differs between presets is asked of the preset's
:class:`~ooc.executor.loader.readers.Readers` and
:class:`~ooc.caches.policies.CachePolicy`: the stack that builds the
loader, the memory planner and the profiler hold no branch on a preset's name.
A :class:`CachePolicy` object can stand for a preset: it reads with O_DIRECT.
"""
from __future__ import annotations

from dataclasses import dataclass

from ooc.caches.policies import (
    AutoCache,
    BeladyCache,
    CachePolicy,
    NoCache,
    PackedCache,
    StaticCache,
)
from ooc.core.errors import InvalidValue
from ooc.executor.loader.readers import DirectReaders, MmapReaders, Readers


@dataclass(frozen=True)
class Preset:
    """A named pairing of readers and a cache policy."""

    name: str
    readers: Readers
    policy: CachePolicy

    @property
    def neighbor_cache(self) -> bool:
        """Whether the stack puts a neighbor cache in front of the neighbour reads."""
        return self.readers.neighbor_cache

    @property
    def caches(self) -> bool:
        """Whether the preset holds application caches the planner must size."""
        return self.policy.caches or self.neighbor_cache


#: The built-in presets (``--mode``).
PRESETS: dict[str, Preset] = {
    "baseline": Preset("baseline", MmapReaders(), NoCache()),
    "static": Preset("static", DirectReaders(), StaticCache()),
    "ooc": Preset("ooc", DirectReaders(), BeladyCache()),
    "packed": Preset("packed", DirectReaders(), PackedCache()),
    "auto": Preset("auto", DirectReaders(), AutoCache()),
}
#: The names of :data:`PRESETS`.
PRESET_NAMES = tuple(PRESETS)


def resolve_preset(preset: "str | Preset | CachePolicy") -> Preset:
    """A :class:`Preset` from a name, a preset, or a cache policy (read with O_DIRECT).

    Raises:
        OocError: an unknown name (the message lists the presets).
    """
    if isinstance(preset, Preset):
        return preset
    if isinstance(preset, CachePolicy):
        return Preset(preset.name, DirectReaders(), preset)
    if isinstance(preset, str) and preset in PRESETS:
        return PRESETS[preset]
    raise InvalidValue(f"unknown preset {preset!r} (choose one of {', '.join(PRESETS)}, "
                   f"or pass a cache policy object)")
