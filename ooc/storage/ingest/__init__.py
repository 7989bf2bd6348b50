"""Streaming, memory-bounded ingest into dataset format v1.

Each entry point writes through :class:`~ooc.storage.DatasetWriter` (temp
folder, renamed when complete) and returns the output folder's path:

- :func:`ingest_edgelist` — text/CSV (optionally gzipped), ``.npy`` [2,E] or
  [E,2], raw int32/int64 pairs; count pass then windowed scatter passes;
- :func:`ingest_ogb` — an OGB node-property raw folder (CSV or binary ``.npz``);
- :func:`ingest_igb` — an IGB graph's ``.npy`` files;
- :func:`ingest_planetoid` — PyG Planetoid raw files (Cora, CiteSeer, PubMed);
- :func:`generate_synthetic` — power-law graphs with community structure.
"""
from ooc.storage.ingest.edgelist import DEFAULT_BUFFER, ingest_edgelist
from ooc.storage.ingest.igb import ingest_igb
from ooc.storage.ingest.ogb import ingest_ogb
from ooc.storage.ingest.planetoid import ingest_planetoid  # imports torch_geometric only when called
from ooc.storage.ingest.synthetic import generate_synthetic

__all__ = ["DEFAULT_BUFFER", "generate_synthetic", "ingest_edgelist", "ingest_igb", "ingest_ogb",
           "ingest_planetoid"]
