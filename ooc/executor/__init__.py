"""Executor: the settings, loader, training, distributed training, inference and sizing.

The names below load their module (and torch / PyG with it) on first use, so
that code needing only the executor's numba parts (the kernel compile child
of the memory planner) does not pay for torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "to_data": "loader.batch",
    "CheckpointError": "training.checkpoint", "latest_checkpoint": "training.checkpoint",
    "list_checkpoints": "training.checkpoint", "load_checkpoint": "training.checkpoint",
    "load_model": "training.checkpoint", "save_checkpoint": "training.checkpoint",
    "layerwise_inference": "inference.layerwise", "read_embeddings": "inference.layerwise",
    "GNN": "training.models", "MODEL_KINDS": "training.models", "build_model": "training.models",
    "Preset": "loader.presets", "PRESETS": "loader.presets",
    "TrainConfig": "training.trainer", "Trainer": "training.trainer",
    "NodeLoader": "loader.node_loader",
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
