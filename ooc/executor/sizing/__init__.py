"""Sizing: the memory planner (``--memory-budget``) and the offline profiler
(``tools/size_caches.py``)."""
