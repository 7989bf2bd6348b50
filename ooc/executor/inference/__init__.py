"""Layer-wise inference: every layer over all nodes, embeddings on disk (Zarr)."""
