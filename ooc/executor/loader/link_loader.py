"""``ooc.LinkLoader``: out-of-core link-prediction batches in PyG ``LinkNeighborLoader``'s
conventions, for a user's own model and loop::

    with ooc.LinkLoader(ds, num_neighbors=[10, 10], neg_sampling="binary",
                        batch_size=512, shuffle=True) as loader:
        for data in loader:                                  # the next epoch
            h = model(data.x, data.edge_index)
            s, d = data.edge_label_index
            loss = F.binary_cross_entropy_with_logits((h[s] * h[d]).sum(-1), data.edge_label)

It is a :class:`~ooc.executor.loader.node_loader.NodeLoader` whose seeds are edges
(:class:`~ooc.sampling.link_plan.EdgeSeeds`): the epoch plan
(:class:`~ooc.sampling.link_plan.LinkEpochPlan`) turns each batch of edges and its seeded
negatives into the batch's seed nodes, and the same stack samples and gathers them in
every preset (the ``ooc`` preset's inspector and Belady cache see node batches), under
the same ``memory_budget``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ooc.core.errors import IdOutOfRange, InvalidValue
from ooc.executor.loader.node_loader import NodeLoader
from ooc.executor.settings import default
from ooc.sampling.link_plan import EdgeSeeds, LinkEpochPlan


def _as_numpy(a) -> np.ndarray:
    return np.asarray(a.cpu().numpy() if hasattr(a, "cpu") else a)


def edge_seeds(dataset, edge_label_index=None, edge_label=None, neg_sampling=None,
               neg_sampling_ratio: float | None = None,
               neg_distribution: str = "uniform",
               edges_per_epoch: int | None = None) -> EdgeSeeds:
    """The :class:`EdgeSeeds` of a link loader's arguments.

    ``edge_label_index``: int [2, m] pairs, ``"val"``/``"test"`` (the dataset's held-out
    positives, :attr:`ooc.storage.Dataset.link_split`), or None: every edge of the stored
    adjacency (the training edges of a split dataset; both directions of an undirected
    one, as PyG's loader over ``data.edge_index``). ``neg_sampling``: ``"binary"``,
    ``"triplet"`` or None; ``neg_sampling_ratio`` alone means binary (as PyG);
    ``neg_distribution``: ``"uniform"`` or ``"degree"``; ``edges_per_epoch``: positives an
    epoch takes (:class:`EdgeSeeds`)."""
    n = dataset.num_nodes
    amount = 1.0 if neg_sampling_ratio is None else float(neg_sampling_ratio)
    if isinstance(neg_sampling, dict):  # PyG's NegativeSampling given as its fields
        amount = float(neg_sampling.get("amount", amount))
        neg_sampling = neg_sampling.get("mode")
    if neg_sampling is None and neg_sampling_ratio is not None and neg_sampling_ratio > 0:
        neg_sampling = "binary"
    if isinstance(edge_label_index, str):
        split = dataset.link_split
        if split is None:
            raise InvalidValue(f"edge_label_index {edge_label_index!r}: {dataset.path} has no "
                               f"link split (write it with ooc.prepare --link-split)")
        edge_label_index = split.edges(edge_label_index)[0]
    if edge_label_index is None:
        if edge_label is not None:
            raise InvalidValue("edge_label needs edge_label_index (labels of given pairs)")
        return EdgeSeeds(n, None, None, neg_sampling, amount, indptr=dataset.indptr,
                         indices=dataset.indices, negatives=neg_distribution,
                         per_epoch=edges_per_epoch)
    pairs = _as_numpy(edge_label_index)
    if pairs.ndim != 2 or pairs.shape[0] != 2 or (pairs.size and not np.issubdtype(
            pairs.dtype, np.integer)):
        raise InvalidValue(f"edge_label_index: expected an integer array [2, m], got shape "
                           f"{pairs.shape} of {pairs.dtype}")
    pairs = pairs.astype(np.int64, copy=False)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= n):
        bad = int(pairs.min()) if pairs.min() < 0 else int(pairs.max())
        raise IdOutOfRange(f"edge_label_index: node id {bad} out of range [0, {n})")
    label = None
    if edge_label is not None:
        label = _as_numpy(edge_label)
        if label.shape[:1] != (pairs.shape[1],):
            raise InvalidValue(f"edge_label: expected {pairs.shape[1]} labels (one per pair), "
                               f"got shape {label.shape}")
    return EdgeSeeds(n, pairs, label, neg_sampling, amount, indptr=dataset.indptr,
                     negatives=neg_distribution, per_epoch=edges_per_epoch)


class LinkLoader(NodeLoader):
    """Link-prediction mini-batches of an on-disk dataset as PyG ``Data``, out of core.

    Arguments as PyG's ``LinkNeighborLoader`` (``data, num_neighbors,
    edge_label_index, edge_label``, then ``neg_sampling``, ``neg_sampling_ratio``) and
    the :class:`~ooc.executor.loader.node_loader.NodeLoader`'s (``batch_size``: positive
    edges per batch, ``shuffle``, ``num_workers``, ``preset``, ``memory_budget``,
    ``seed``, the cache and I/O options).

    Args:
        data: an opened :class:`ooc.storage.Dataset` or a dataset folder.
        num_neighbors: neighbours sampled per layer (``-1``: all).
        edge_label_index: the positive edges, int [2, m]; ``"val"``/``"test"``: the
            dataset's held-out ones; None: every edge of the stored adjacency.
        edge_label: labels of ``edge_label_index`` ([m]); with binary negative sampling
            negatives get 0 and positives ``edge_label + 1`` when the labels hold a 0, as
            PyG.
        neg_sampling: ``"binary"`` (``ceil(ratio * b)`` negative pairs per batch of b,
            both ends uniform over the nodes), ``"triplet"`` (``ceil(ratio)`` negative
            targets per positive's source) or None; drawn from the batch's own seed, so
            every preset gives the same batches.
        neg_sampling_ratio: negatives per positive (default 1); given alone, binary.
        neg_distribution: ``"uniform"`` over the nodes (default, as PyG) or ``"degree"``
            (in proportion to each node's in-degree: harder negatives).
        edges_per_epoch: positives an epoch takes (default: all): the first ones of the
            epoch's own order, a new sample each epoch when shuffled (for edge sets too
            large for an epoch over all of them).

    Each ``Data`` has ``x``, ``edge_index``, ``n_id`` (the distinct ends of the batch's
    edges first, sorted), ``num_sampled_nodes``, ``num_sampled_edges``, ``input_id``
    (each positive's position among the loader's edges), and ``edge_label_index``
    (local ids, [2, b + k]: positives then negatives) with ``edge_label`` (float 1/0
    without given labels), or for triplets ``src_index`` [b], ``dst_pos_index`` [b] and
    ``dst_neg_index`` ([b], or [b, K] for K > 1).
    """

    def __init__(self, data, num_neighbors: Sequence[int] = default("fanouts"),
                 edge_label_index=None, edge_label=None, *, neg_sampling=None,
                 neg_sampling_ratio: float | None = None, neg_distribution: str = "uniform",
                 edges_per_epoch: int | None = None,
                 batch_size: int = default("batch_size"), **kwargs: Any):
        if "labels" in kwargs or "input_nodes" in kwargs:
            raise InvalidValue("LinkLoader: give edge_label_index/edge_label, not "
                               "input_nodes/labels")
        self._link_args = (edge_label_index, edge_label, neg_sampling, neg_sampling_ratio,
                           neg_distribution, edges_per_epoch)
        self._plans: dict[int, LinkEpochPlan] = {}
        super().__init__(data, num_neighbors, None, batch_size=batch_size, labels=False,
                         **kwargs)
        label = self.seeds.label
        #: as PyG: given labels that hold 0 move up by one, 0 being the negatives' label
        self._shift_labels = bool(label is not None and label.size and label.min() == 0)

    def _resolve_seeds(self, dataset, input_nodes) -> EdgeSeeds:
        return edge_seeds(dataset, *self._link_args)

    def _index_seeds(self, seeds) -> None:
        """``input_id`` is the plan's edge positions: nothing to index."""

    def _plan(self, epoch: int) -> LinkEpochPlan:
        plan = self._plans.get(epoch)
        if plan is None:
            pipe = self._source.pipeline()
            plan = self.seeds.plan(self.batch_size, pipe.seed, epoch, pipe.shuffle)
            self._plans = {epoch: plan}
        return plan

    def _complete(self, data, seeds: np.ndarray, epoch: int, index: int):
        """``data`` with the batch's edges in local ids (see the class docstring)."""
        lb = self._plan(epoch).link_batch(index)
        if not np.array_equal(seeds, lb.nodes):  # the plan and the pipeline disagree
            raise InvalidValue(f"LinkLoader: batch {index} of epoch {epoch} does not start "
                               f"with its edges' ends")
        data.input_id = torch.from_numpy(lb.input_id)
        src, dst = lb.local(lb.src), lb.local(lb.dst)
        if self.seeds.neg_sampling == "triplet":
            assert lb.neg_dst is not None
            data.src_index = torch.from_numpy(src)
            data.dst_pos_index = torch.from_numpy(dst)
            neg = lb.local(lb.neg_dst)
            data.dst_neg_index = torch.from_numpy(neg[:, 0] if neg.shape[1] == 1 else neg)
            return data
        index_ = np.stack([src, dst])
        label = (torch.from_numpy(np.asarray(lb.label)) if lb.label is not None
                 else torch.ones(len(src)))
        if self.seeds.neg_sampling == "binary":
            assert lb.neg_src is not None and lb.neg_dst is not None
            index_ = np.concatenate([index_, np.stack([lb.local(lb.neg_src),
                                                       lb.local(lb.neg_dst)])], axis=1)
            if lb.label is not None and self._shift_labels:
                label = label + 1
            label = torch.cat([label, torch.zeros(len(lb.neg_src), dtype=label.dtype)])
        data.edge_label_index = torch.from_numpy(index_)
        data.edge_label = label
        return data

    def __repr__(self) -> str:
        return (f"LinkLoader({self.dataset.path}, num_neighbors={self.sampling.fanouts}, "
                f"batch_size={self.batch_size}, edges={len(self.seeds)}, "
                f"neg_sampling={self.seeds.neg_sampling!r}, preset={self.preset.name!r})")
