"""ooc: out-of-core training of graph neural networks on one workstation.

The pieces, upstream to downstream: :mod:`ooc.storage` (dataset format,
ingest, direct readers), :mod:`ooc.partition`, :mod:`ooc.inspector`
(superbatch sampling, Belady changesets), :mod:`ooc.executor` (feature
cache, gather, training, inference).
"""
from .storage import Dataset, DatasetError, OocError, open_dataset, write_dataset


def load_model(path, map_location="cpu"):
    """The trained model in a checkpoint file (or the newest in a folder), in eval mode."""
    from .executor.checkpoint import load_model as _load

    return _load(path, map_location=map_location)


__version__ = "0.1.0"

__all__ = ["Dataset", "DatasetError", "OocError", "load_model", "open_dataset", "write_dataset",
           "__version__"]
