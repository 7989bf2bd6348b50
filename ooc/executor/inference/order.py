"""The processing order of layer-wise inference: which node each output row holds.

Rows of every layer array are written in processing order; ``perm`` maps row
-> node and ``rowof`` its inverse, node -> row: [N] of the graph's index dtype
(:func:`~ooc.storage.layout.index_dtype`: int32 below 2^31 nodes, 4 bytes a node each).
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from ooc.core.errors import InvalidValue, NotFound
from ooc.storage.dataset import Dataset
from ooc.storage.layout import index_dtype
from ooc.storage.reorder import locality_order

ORDERS = ("auto", "natural", "pds", "degree", "locality")
#: ``auto`` orders a graph of at least this many nodes by locality when it has no partitioning.
AUTO_LOCALITY_NODES = 1 << 20


def _partition_of(dataset: Dataset, order: Any, partition: Any) -> tuple[np.ndarray | None, Any]:
    """The partition assignment the order uses (or None) and the order's name."""
    if isinstance(order, np.ndarray) or (not isinstance(order, str) and order is not None):
        return np.asarray(order), "pds"
    if partition is not None:
        if isinstance(partition, (str, os.PathLike)):
            return _load_owner(partition), order
        return np.asarray(partition), order
    if order in ("auto", "pds") and (dataset.path / "owner.npy").is_file():
        return _load_owner(dataset.path / "owner.npy"), order
    return None, order


def _load_owner(path: str | os.PathLike) -> np.ndarray:
    """An ``owner.npy`` partition assignment (integers, one per node), or one line why not."""
    try:
        owner = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise NotFound(f"{path}: not found") from None
    except (ValueError, OSError, EOFError):
        raise InvalidValue(f"{path}: not a partition assignment (an .npy of integers, one per node, "
                       f"as `python -m ooc.partition` writes owner.npy)") from None
    if owner.dtype.kind not in "iu":
        raise InvalidValue(f"{path}: partition assignment has dtype {owner.dtype}; expected integers")
    return owner


def compute_order(dataset: Dataset, order: Any = "auto", partition: Any = None
                  ) -> tuple[np.ndarray | None, str]:
    """The processing order ``perm`` (row -> node, [N] of
    :func:`~ooc.storage.layout.index_dtype`) or None for node id order.

    ``order``: ``auto``, ``natural``, ``pds``, ``degree``, ``locality``, or a partition
    assignment array (PDS over it). ``partition``: assignment array or path
    to an ``owner.npy``. ``locality`` groups nodes whose in-neighbours are each other
    (:func:`ooc.storage.reorder.locality_order`), so a block of targets reads few pages
    and few chunks of the previous layer (a dataset stored in a locality order has it
    already: its rows' order); ``auto`` is ``pds`` with a partitioning, else ``locality``
    for a dataset stored in one or from :data:`AUTO_LOCALITY_NODES` nodes, else ``natural``.
    """
    return order_of(dataset, *resolve_order(dataset, order, partition))


def resolve_order(dataset: Dataset, order: Any = "auto", partition: Any = None
                  ) -> tuple[np.ndarray | None, str]:
    """``(owner, name)``: the partition assignment the order uses (int [N], or None) and
    the order's name, ``auto`` resolved (see :func:`compute_order`); checked without
    reading the graph (one line for an unknown order, a missing partitioning, or one of
    another length than the graph's nodes)."""
    owner, order = _partition_of(dataset, order, partition)
    if order == "auto":
        order = "pds" if owner is not None else (
            "locality" if dataset.row_of is not None or dataset.num_nodes >= AUTO_LOCALITY_NODES
            else "natural")
    if order not in ORDERS:
        raise InvalidValue(f"unknown order {order!r} (choose one of {', '.join(ORDERS)} "
                       "or pass a partition assignment array)")
    if order != "pds":
        return None, order
    if owner is None:
        raise InvalidValue("order 'pds' needs a partitioning: pass partition= (owner.npy from "
                       "`python -m ooc.partition`) or put owner.npy in the dataset folder")
    owner = np.asarray(owner).reshape(-1)
    if owner.shape[0] != dataset.num_nodes:
        raise InvalidValue(f"partition assignment has {owner.shape[0]} entries, the graph "
                       f"{dataset.num_nodes} nodes")
    return owner, order


def order_of(dataset: Dataset, owner: np.ndarray | None, order: str) -> tuple[np.ndarray | None, str]:
    """:func:`compute_order` for a :func:`resolve_order` result: ``(perm, order)``; reads
    the graph (its in-degrees, or every edge for ``locality``)."""
    ids = index_dtype(dataset.num_nodes)
    if order == "natural":
        return None, "natural"
    if order == "locality":
        by_row = dataset.stored_order()
        if by_row is not None:  # the order the feature rows are stored in (made at ingest)
            return by_row.astype(ids, copy=False), "locality"
        return locality_order(dataset.indptr, dataset.indices).astype(ids, copy=False), \
            "locality"
    deg = dataset.in_degrees()
    if order == "degree":
        return np.argsort(-deg, kind="stable").astype(ids), "degree"
    assert owner is not None  # resolve_order gives pds its partitioning
    return np.lexsort((-deg, owner)).astype(ids), "pds"


def order_digest(perm: np.ndarray | None) -> str:
    """``natural`` for node id order, else a digest of ``perm``'s ids as int64 whatever
    their dtype (for the run's fingerprint), taken a million at a time."""
    if perm is None:
        return "natural"
    h = hashlib.sha256()
    for a in range(0, perm.shape[0], 1 << 20):
        h.update(np.ascontiguousarray(perm[a:a + (1 << 20)], dtype=np.int64).tobytes())
    return h.hexdigest()[:24]


def stored_rows(dataset: Dataset, order_name: str) -> np.ndarray | None:
    """The dataset's node -> stored row map (a memmap) where the processing order
    ``order_name`` is the order its feature rows are stored in (``locality`` over a
    dataset stored in one, with a feature file of its own): that order's inverse, read
    from the disk instead of made again in memory. Else None."""
    if order_name != "locality" or dataset.row_of is None or dataset.linked_file is not None:
        return None
    return dataset.row_of


def rows_and_nodes(perm: np.ndarray | None, n: int, stored: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, rowof)`` as [N] arrays of :func:`~ooc.storage.layout.index_dtype`; the same
    identity array twice in node id order. ``stored``: ``perm``'s inverse as the dataset
    stores it (:func:`stored_rows`), returned as ``rowof``."""
    ids = index_dtype(n)
    if perm is None:
        ident = np.arange(n, dtype=ids)
        return ident, ident
    if stored is not None and stored.dtype == ids and stored.shape == (n,):
        return perm, stored
    rowof = np.empty(n, dtype=ids)
    rowof[perm] = np.arange(n, dtype=ids)
    return perm, rowof
