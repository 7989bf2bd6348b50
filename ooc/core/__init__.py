"""Core: what every stage uses and that imports nothing else of ooc: errors, sizes and
ranges, notes, the worker thread, stage timers, numba's JIT and threading layer, the random
kernels, process settings and memory measurement."""
