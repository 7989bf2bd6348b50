"""Executor: the loader, models, the training loop, checkpoints, caches, inference.

The names below load their module (and torch / PyG with it) on first use, so
that code needing only the executor's numba parts (the kernel compile child
of the memory planner, the feature cache) does not pay for torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "to_data": "batch",
    "CheckpointError": "checkpoint", "latest_checkpoint": "checkpoint",
    "list_checkpoints": "checkpoint", "load_checkpoint": "checkpoint",
    "load_model": "checkpoint", "save_checkpoint": "checkpoint",
    "layerwise_inference": "inference", "read_embeddings": "inference",
    "GNN": "models", "MODEL_KINDS": "models", "build_model": "models",
    "FeatureCache": "feature_cache", "FeatureSource": "feature_cache",
    "TrainConfig": "trainer", "Trainer": "trainer",
    "NodeLoader": "loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ooc.executor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
