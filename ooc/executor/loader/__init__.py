"""The loader: presets, the I/O stack they assemble, batch pipelines and :class:`NodeLoader`.

Below it: :mod:`ooc.storage` (readers), :mod:`ooc.caches` (feature and neighbour
caches) and :mod:`ooc.sampling` (sampler, superbatches).
"""
