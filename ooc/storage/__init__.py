"""Storage: the on-disk dataset format, writers, ingest and direct readers.

This package imports nothing of ooc above :mod:`ooc.core`.
"""
from ooc.core.errors import (
                             BudgetError,
                             DatasetError,
                             IdOutOfRange,
                             InvalidValue,
                             IOFailure,
                             NotFound,
                             OocError,
                             OutputBusy,
                             OutputExists,
                             TimedOut,
)
from ooc.storage.dataset import Dataset, MmapFeatures, open_dataset
from ooc.storage.layout import PAGE, FeatureLayout
from ooc.storage.writer import DatasetWriter, csc_from_edges, write_dataset

__all__ = [
    "PAGE", "BudgetError", "Dataset", "DatasetError", "DatasetWriter", "FeatureLayout", "IOFailure",
    "IdOutOfRange", "InvalidValue", "MmapFeatures", "NotFound", "OocError", "OutputBusy",
    "OutputExists", "TimedOut", "csc_from_edges", "open_dataset", "write_dataset",
]
from ooc.storage.direct import (
                             DirectFeatures,
                             DirectReader,
                             ReadStats,
                             aligned_empty,
                             read_index_ranges,
                             read_ranges,
)
from ooc.storage.io_backends import CHOICES as IO_BACKENDS  # noqa: E402

__all__ += [
    "DirectFeatures", "DirectReader", "IO_BACKENDS", "ReadStats", "aligned_empty",
    "read_index_ranges", "read_ranges",
]
