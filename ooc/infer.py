"""``python -m ooc.infer``: layer-wise full-graph inference, out of core.

    python -m ooc.infer --data DIR --checkpoint PATH --out OUT.zarr \\
        --memory-budget 2GiB --report r.json [--chunk-rows 32768] [--order auto]

Computes ``h1`` .. ``hL`` (``hL`` = model output; the layers before it are deleted
once used unless ``--keep-layers``) and ``pred`` for every node
of the dataset into the Zarr group ``--out``, layer by layer from full
in-neighbourhoods (see :mod:`ooc.executor.inference.layerwise`). The group is built in
``.<out name>.partial`` beside ``--out`` and renamed when complete; re-running
the same command after a crash resumes from the chunks already written there. The report
holds per-layer timings, bytes read, the previous-layer cache hit ratio, peak
RSS and, when the dataset has labels, train/val/test accuracy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ooc.cli import ArgumentParser, add_report_arg, check_report_path, main_wrapper, write_report
from ooc.core.errors import InvalidValue
from ooc.core.memory import peak_rss_bytes
from ooc.core.sizes import check_range, format_size, parse_size
from ooc.executor.settings import BY_NAME
from ooc.storage import open_dataset


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m ooc.infer``."""
    p = ArgumentParser(
        prog="python -m ooc.infer",
        description="Layer-wise full-graph inference, out of core: computes every layer's "
                    "embeddings (h1 .. hL) and the predictions of every node into a Zarr group. "
                    "The group is built beside --out under a temporary name and renamed when "
                    "complete; the same command after a crash resumes from the chunks written.")
    p.add_argument("--data", required=True, type=Path, help="dataset folder")
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="checkpoint file written by ooc.train (or its folder: the latest)")
    p.add_argument("--out", required=True, type=Path, help="output Zarr group folder")
    p.add_argument("--memory-budget", type=parse_size, default=parse_size("2GiB"), metavar="SIZE",
                   help="peak memory of the whole process, e.g. 1GiB (default 2GiB)")
    p.add_argument("--chunk-rows", type=int, default=32768, help="rows per Zarr chunk (default 32768)")
    p.add_argument("--block-rows", type=int, default=None,
                   help="at most this many targets per block (default: from the budget)")
    p.add_argument("--order", default="auto",
                   choices=["auto", "natural", "pds", "degree", "locality"],
                   help="processing order: pds = partition then degree (needs --partition or "
                        "owner.npy in the dataset), locality = nodes grouped with their "
                        "in-neighbours (label propagation), natural = node id, degree; auto = "
                        "pds when a partitioning exists, else locality from 1M nodes, else "
                        "natural")
    p.add_argument("--partition", type=Path, default=None,
                   help="owner.npy (node -> partition) from python -m ooc.partition, for pds")
    p.add_argument("--policy", default="belady", choices=["belady", "lru", "fifo"],
                   help="previous-layer chunk cache policy (default belady)")
    p.add_argument("--features", default="auto", choices=["auto", "direct", "mmap"],
                   help="layer-0 feature reader (default: O_DIRECT when available)")
    p.add_argument("--layer-dtype", default="float32", choices=["float32", "float16"],
                   help="dtype of the layers before the last (float16 halves their disk and "
                        "the next layer's reads; the output layer stays float32)")
    p.add_argument("--keep-layers", action="store_true",
                   help="keep every layer's embeddings (default: a layer is deleted once the "
                        "next is complete, so only the output layer stays)")
    p.add_argument("--aggregate", default="auto",
                   choices=["auto", "blocks", "streamed", "sliced"],
                   help="how a layer reads its input: for a layer whose convolution is a "
                        "mean, sum or max of its input rows (SAGE), sliced = column slices "
                        "of every node's row held in turn, the input read about once and "
                        "the edges once a slice; streamed = groups of targets' "
                        "accumulators, the input streamed once a group; blocks = each "
                        "block of targets reads its neighbours' rows; auto = the way "
                        "planned to move the fewest bytes (blocks planned up to 2^25 "
                        "edges)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out when it holds another run (same run: resumed)")
    BY_NAME["io_backend"].add_to(p)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_report_arg(p)
    return p


def _feature_reader_choice(args: argparse.Namespace) -> str:
    """``--features`` combined with ``--io-backend`` (an O_DIRECT backend by name)."""

    if args.io_backend in (None, "auto"):
        return args.features
    if args.features == "mmap" and args.io_backend != "mmap":
        raise InvalidValue(f"--io-backend {args.io_backend} reads with O_DIRECT; it does not go "
                       f"with --features mmap")
    if args.features == "direct" and args.io_backend == "mmap":
        raise InvalidValue("--io-backend mmap reads through the page cache, not with O_DIRECT; "
                           "it does not go with --features direct")
    return args.io_backend


def _load_checked_model(args: argparse.Namespace, ds):
    """The checkpoint's model; its input width must be the dataset's feature width, and
    its output (ooc.train's: one logit a class) the dataset's classes where it has labels,
    unless it is a link-prediction encoder (``--task link``: its output is the embedding)."""
    from ooc.executor.training import checkpoint as ck

    path = Path(args.checkpoint)
    path = ck.latest_checkpoint(path) if path.is_dir() else path
    state = ck.load_checkpoint(path)
    model = ck.model_from_checkpoint(state, path)
    model.eval()
    link = (state.get("extra") or {}).get("task") == "link"
    in_dim, out_dim = model.config["in_dim"], model.config["out_dim"]
    if in_dim != ds.feature_dim:
        raise InvalidValue(f"{args.checkpoint}: model expects {in_dim}-dim features, "
                           f"{args.data} has {ds.feature_dim} (a checkpoint of another dataset?)")
    if ds.num_classes and out_dim != ds.num_classes and not link:
        raise InvalidValue(f"{args.checkpoint}: model predicts {out_dim} classes, {args.data} "
                           f"has {ds.num_classes} (a checkpoint of another dataset?)")
    return model


def _summary(rep: dict, args: argparse.Namespace) -> str:
    """The one line printed on stderr at the end."""
    acc = rep.get("test_accuracy")
    hit = rep.get("cache_hit_ratio")
    return (f"ooc.infer: {rep['num_nodes']} nodes, {rep['num_layers']} layers -> {args.out} "
            f"in {rep['time_s']:.1f}s, read {format_size(rep['bytes_read'])}, "
            f"cache hit {'-' if hit is None else f'{hit:.1%}'}, "
            f"peak RSS {format_size(rep['peak_rss_bytes'])} of {format_size(args.memory_budget)}"
            + ("" if acc is None else f", test acc {acc:.4f}"))


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m ooc.infer`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    args = build_parser().parse_args(argv)
    check_report_path(args.report, {"the dataset --data": args.data, "--out": args.out,
                                    "--checkpoint": args.checkpoint})
    import torch

    from ooc.executor.inference.layerwise import check_options, layerwise_inference

    # every option is checked before a file is read or written
    check_options(args.memory_budget, args.chunk_rows, args.block_rows, None, args.policy,
                  args.layer_dtype, args.aggregate)
    check_range("--threads", args.threads, 1, 4096, integer=True)
    features = _feature_reader_choice(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ds = open_dataset(args.data)
    model = _load_checked_model(args, ds)
    rep = layerwise_inference(ds, model, args.out, memory_budget=args.memory_budget,
                              chunk_rows=args.chunk_rows, order=args.order,
                              partition=args.partition, policy=args.policy,
                              features=features, block_rows=args.block_rows,
                              overwrite=args.overwrite, progress=not args.no_progress,
                              layer_dtype=args.layer_dtype, keep_layers=args.keep_layers,
                              aggregate=args.aggregate)
    rep["checkpoint"] = str(args.checkpoint)
    rep["ru_maxrss_bytes"] = peak_rss_bytes()
    if args.report:
        write_report(args.report, rep, command="ooc.infer")
    print(_summary(rep, args), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
