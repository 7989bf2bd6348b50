"""ooc: out-of-core training of graph neural networks on one workstation.

The pieces, upstream to downstream: :mod:`ooc.storage` (dataset format,
ingest, direct readers), :mod:`ooc.partition`, :mod:`ooc.inspector`
(superbatch sampling, Belady changesets), :mod:`ooc.executor` (feature
cache, gather, training, inference).
"""
import os as _os

# numba's and torch's OpenMP pools busy-wait between parallel regions by default;
# interleaved (sample, then compute) on a few cores they starve each other
# (measured: forward+backward 3-4x slower on 2 cores). Must be set before torch
# or numba start their pools; an explicit setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .memory import tune_malloc as _tune_malloc  # noqa: E402

# the gather, loader and inspector threads each get a malloc arena by default, and
# batch-sized arrays stay resident after they are freed; both make RSS creep past budgets
_tune_malloc()

from .storage import Dataset, DatasetError, OocError, open_dataset, write_dataset  # noqa: E402


def load_model(path, map_location="cpu"):
    """The trained model in a checkpoint file (or the newest in a folder), in eval mode."""
    from .executor.training.checkpoint import load_model as _load

    return _load(path, map_location=map_location)


def __getattr__(name: str):
    # torch and PyG load only when the loader is asked for: `import ooc` stays light
    if name == "NodeLoader":
        from .executor.loader.node_loader import NodeLoader

        return NodeLoader
    raise AttributeError(f"module 'ooc' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = ["Dataset", "DatasetError", "NodeLoader", "OocError", "load_model", "open_dataset",
           "write_dataset", "__version__"]
