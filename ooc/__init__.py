"""ooc: out-of-core training of graph neural networks on one workstation.

The pieces, upstream to downstream: :mod:`ooc.storage` (dataset format,
ingest, direct readers), :mod:`ooc.partition`, :mod:`ooc.inspector`
(superbatch sampling, Belady changesets), :mod:`ooc.executor` (feature
cache, gather, training, inference).
"""
from .storage import Dataset, DatasetError, OocError, open_dataset, write_dataset

__version__ = "0.1.0"

__all__ = ["Dataset", "DatasetError", "OocError", "open_dataset", "write_dataset", "__version__"]
