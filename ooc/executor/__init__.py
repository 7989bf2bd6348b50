"""Executor: models, the training loop, checkpoints (and the feature cache, gather, inference)."""
from .batch import to_data
from .checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint,
                         load_model, save_checkpoint)
from .inference import layerwise_inference, read_embeddings
from .models import GNN, MODEL_KINDS, build_model
from .feature_cache import FeatureCache, FeatureSource
from .trainer import TrainConfig, Trainer

__all__ = [
    "CheckpointError", "FeatureCache", "FeatureSource", "GNN", "MODEL_KINDS",
    "TrainConfig", "Trainer", "build_model", "latest_checkpoint", "list_checkpoints",
    "layerwise_inference", "load_checkpoint", "load_model", "read_embeddings",
    "save_checkpoint", "to_data",
]
