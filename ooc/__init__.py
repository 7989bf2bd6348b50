"""ooc: out-of-core training of graph neural networks on one workstation.

The pieces, bottom to top: :mod:`ooc.core` (errors, sizes, worker threads, JIT),
:mod:`ooc.storage` (dataset format, ingest, readers), :mod:`ooc.caches` (feature,
neighbour and chunk caches, Belady changesets) and :mod:`ooc.partition`,
:mod:`ooc.sampling` (sampler, superbatch inspector), :mod:`ooc.executor` (loader,
training, inference, sizing); CONTRIBUTING.md draws the layers.

Importing ooc changes nothing process-wide; :func:`configure_process` applies the
settings ooc's own commands run with (call it first thing in a training script). The one
exception is a worker process of ``ooc.train --workers``, which its launcher marks in the
environment: it asks the kernel to end it with the launcher (:func:`die_with_launcher`).
"""
import os as _os

from ooc.core.process import LAUNCHER_ENV as _LAUNCHER_ENV
from ooc.core.process import configure_process, die_with_launcher

if _os.environ.get(_LAUNCHER_ENV, "").isdigit():
    # a worker of `ooc.train --workers`: end with its launcher, even during start-up (the
    # variable is taken out, so the worker's own children do not read it)
    die_with_launcher(int(_os.environ.pop(_LAUNCHER_ENV)))
from ooc.storage import (
    BudgetError,
    Dataset,
    DatasetError,
    IdOutOfRange,
    InvalidValue,
    IOFailure,
    NotFound,
    OocError,
    OutputBusy,
    OutputExists,
    TimedOut,
    open_dataset,
    write_dataset,
)


def load_model(path, map_location="cpu"):
    """The trained model in a checkpoint file (or the newest in a folder), in eval mode."""
    from ooc.executor.training.checkpoint import load_model as _load

    return _load(path, map_location=map_location)


def __getattr__(name: str):
    # torch and PyG load only when the loader is asked for: `import ooc` stays light
    if name == "NodeLoader":
        from ooc.executor.loader.node_loader import NodeLoader

        return NodeLoader
    if name == "LinkLoader":
        from ooc.executor.loader.link_loader import LinkLoader

        return LinkLoader
    if name in ("memory_budget", "set_memory_budget", "MemoryBudget"):
        from ooc.executor.loader import process_budget

        return getattr(process_budget, name)
    if name == "build_model":
        from ooc.executor.training.models import build_model

        return build_model
    if name in ("Trainer", "TrainConfig"):
        from ooc.executor.training import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'ooc' has no attribute {name!r}")


from ooc.core.version import __version__  # noqa: E402

__all__ = ["BudgetError", "Dataset", "DatasetError", "IOFailure", "IdOutOfRange", "InvalidValue",
           "LinkLoader", "MemoryBudget", "NodeLoader", "NotFound", "OocError", "OutputBusy", "OutputExists",
           "TimedOut", "TrainConfig", "Trainer", "build_model", "configure_process", "load_model",
           "memory_budget", "open_dataset", "set_memory_budget", "write_dataset", "__version__"]
