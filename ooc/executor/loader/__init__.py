"""The loader: presets, the I/O stack they assemble, batch pipelines and :class:`NodeLoader`.

Upstream of it: :mod:`ooc.storage` (readers), :mod:`ooc.sampling` (sampler,
neighbor cache, superbatches) and :mod:`ooc.caches` (feature caches).
"""
