"""The loader: presets, the I/O stack they assemble, batch pipelines and :class:`NodeLoader`.

Upstream of it: :mod:`ooc.storage` (readers), :mod:`ooc.inspector` (sampler,
neighbor cache, superbatches) and :mod:`ooc.executor.cache` (feature caches).
"""
