"""IGB (Illinois Graph Benchmark) homogeneous graphs, from the ``.npy`` files IGB ships::

    ROOT/.../paper/node_feat.npy                 float32 [N, D]
    ROOT/.../paper__cites__paper/edge_index.npy  int64 [E, 2] (citing, cited)
    ROOT/.../paper/node_label_19.npy             [N] labels (19 classes; node_label_2K: 2,983)

read in chunks through the edge-list ingest (plain reads, no whole-array load). IGB has no
split files: the labelled nodes are split at random with a seed (60/20/20 by default).
"""
from __future__ import annotations

from pathlib import Path

from ooc.storage.ingest.edgelist import DEFAULT_BUFFER, ingest_edgelist, input_error
from ooc.storage.link_split import LinkSplitSpec


def _find(root: Path, name: str) -> Path:
    hits = sorted(root.rglob(name))
    if not hits:
        raise input_error(root, f"holds no {name} (expected an IGB folder with node_feat.npy, "
                         f"edge_index.npy and node_label_*.npy)")
    if len(hits) > 1:
        raise input_error(root, f"holds {len(hits)} files named {name} ({', '.join(map(str, hits[:3]))}"
                         f"{', ...' if len(hits) > 3 else ''}); pass the folder of one graph")
    return hits[0]


def ingest_igb(root, out, label: str = "19", train_fraction: float = 0.6,
               val_fraction: float = 0.2, seed: int = 0, undirected: bool = False,
               dedup: bool = False, remove_self_loops: bool = False,
               feature_dtype: str | None = None, name: str = "",
               buffer_bytes: int = DEFAULT_BUFFER, overwrite: bool = False,
               progress: bool = True, stats: dict | None = None,
               allow_nonfinite: bool = False, reorder: str = "auto",
               link_split: LinkSplitSpec | None = None) -> Path:
    """Convert the IGB graph under ``root`` to a dataset folder ``out`` and return its path.

    ``label`` picks ``node_label_<label>.npy`` (``19`` or ``2K``)."""
    root = Path(root)
    if not root.is_dir():
        raise input_error(root, "not found (expected an IGB folder)")
    return ingest_edgelist(
        _find(root, "edge_index.npy"), out, num_nodes=None, undirected=undirected, dedup=dedup,
        remove_self_loops=remove_self_loops, features=_find(root, "node_feat.npy"),
        feature_dtype=feature_dtype, labels=_find(root, f"node_label_{label}.npy"),
        name=name or root.name, buffer_bytes=buffer_bytes, overwrite=overwrite,
        progress=progress, stats=stats, allow_nonfinite=allow_nonfinite,
        random_split=(train_fraction, val_fraction, seed), reorder=reorder,
        link_split=link_split)
