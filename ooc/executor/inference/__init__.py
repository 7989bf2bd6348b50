"""Layer-wise inference: every layer over all nodes, embeddings on disk (Zarr).

The entry point is :func:`ooc.executor.inference.layerwise.layerwise_inference`;
:func:`~ooc.executor.inference.store.read_embeddings` reads its output back.
"""
