"""Sizing: the memory planner (``--memory-budget``) and the offline profiler
(``python -m ooc.size``)."""
