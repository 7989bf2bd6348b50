"""Caches over a fallback reader: the feature cache (static or Belady changesets), the
neighbour cache, the layer-wise inference chunk cache, and the policies that decide what
each holds (:mod:`ooc.caches.policies`, with the miss simulators in
:mod:`ooc.caches.miss_curves`)."""
