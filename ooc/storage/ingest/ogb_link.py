"""OGB link-property splits (``ogbl-*``) read as a dataset's link split.

OGB ships a link split as ``split/<name>/{train,valid,test}.pt``: ``torch.save``d dicts
of tensors, in one of two layouts::

    source_node [k], target_node [k], target_node_neg [k, K]    (ogbl-citation2)
    edge [k, 2], edge_neg [k', 2]                               (ogbl-collab, -ppa, -ddi)

The validation and test parts become given pairs of a
:class:`~ooc.storage.link_split.LinkSplitSpec` (held out of the adjacency, which for
OGB's link graphs holds only training edges already). ``target_node_neg`` becomes the
negatives; ``edge_neg`` (negative pairs not tied to a positive) is stored as one row of
negative target per positive when there are as many negative pairs as positives, else
negatives are drawn.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ooc.core.errors import InvalidValue
from ooc.storage.ingest.edgelist import input_error
from ooc.storage.link_split import LinkSplitSpec

#: The parts of an OGB link split that become held-out edges, and OGB's file stems.
PARTS = (("val", "valid"), ("test", "test"))


def is_link_split(folder: Path) -> bool:
    """Whether ``folder`` (``split/<name>``) holds an OGB link split (``valid.pt``)."""
    return (folder / "valid.pt").is_file() and (folder / "test.pt").is_file()


def _load(path: Path) -> dict[str, np.ndarray]:
    import torch

    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle/zip errors of a truncated or foreign file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise input_error(path, f"cannot read an OGB link split ({msg})") from None
    if not isinstance(d, dict):
        raise input_error(path, f"expected a dict of tensors, got {type(d).__name__}")
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in d.items()}


def read_part(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """``(positives int64 [2, k], negatives int64 [k, K] or None)`` of one ``.pt`` file."""
    d = _load(path)
    if "source_node" in d and "target_node" in d:
        edges = np.stack([d["source_node"].reshape(-1), d["target_node"].reshape(-1)])
        neg = d.get("target_node_neg")
        if neg is not None and neg.ndim == 1:
            neg = neg.reshape(-1, 1)
        return edges.astype(np.int64), None if neg is None else neg.astype(np.int64)
    if "edge" in d:
        e = d["edge"]
        if e.ndim != 2 or e.shape[1] != 2:
            raise input_error(path, f"'edge' has shape {e.shape}, expected [k, 2]")
        edges = e.T.astype(np.int64)
        neg = d.get("edge_neg")
        if neg is not None and neg.ndim == 2 and neg.shape == (edges.shape[1], 2):
            return edges, neg[:, 1:].astype(np.int64)
        return edges, None
    raise input_error(path, f"holds neither source_node/target_node nor edge (keys: "
                            f"{sorted(d)})")


def ogb_link_split(folder: Path, asked: LinkSplitSpec | None) -> LinkSplitSpec:
    """The :class:`LinkSplitSpec` of the OGB link split in ``folder``; ``asked`` (the
    user's ``--link-split``/``--num-neg``/seed) gives the seed and the negatives drawn
    where the split has none, and may not bring pairs of its own."""
    if asked is not None and (asked.given or asked.val or asked.test):
        raise InvalidValue(f"{folder}: an OGB link split is given; drop --link-split/"
                           f"--val-edges/--test-edges (or pass another --split)")
    spec = LinkSplitSpec(seed=asked.seed if asked else 0,
                         num_neg=asked.num_neg if asked else 1)
    for part, stem in PARTS:
        edges, neg = read_part(folder / f"{stem}.pt")
        setattr(spec, f"{part}_edges", edges)
        setattr(spec, f"{part}_neg", neg)
        spec.names[f"{part}_edges"] = str(folder / f"{stem}.pt")
        if neg is not None:
            spec.names[f"{part}_neg"] = str(folder / f"{stem}.pt")
    return spec
