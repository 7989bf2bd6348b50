"""Feature caches that wrap a fallback feature source: the static and the
Belady superbatch feature cache (:mod:`.feature_cache`) and the layer-wise
inference chunk cache (:mod:`.chunk_cache`)."""
