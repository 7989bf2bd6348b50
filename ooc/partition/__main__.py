"""CLI: ``python -m ooc.partition --data DIR --parts P --algo ALGO --out DIR``.

Partitions a dataset with SPRING or a streaming baseline and writes one
dataset per partition (see :mod:`ooc.partition`). Bad input (P < 1 or
P > N, beta < 1, ``--halo-hops`` < 1, an option of another algorithm
such as ``--merge`` with ``--algo greedy``, a missing or invalid dataset, an
existing output folder without ``--overwrite``) exits with code 2 and a
one-line reason, leaving no output behind.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ooc.cli import ArgumentParser, add_report_arg, check_report_path, main_wrapper, write_report
from ooc.core.errors import InvalidValue
from ooc.core.memory import peak_rss_bytes
from ooc.core.sizes import format_size
from ooc.partition import ALGORITHMS, partition_dataset
from ooc.partition.edges import DEFAULT_CHUNK_EDGES


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m ooc.partition",
        description="Partition an ooc dataset (SPRING or a streaming baseline) into "
                    "per-partition datasets with full in-neighbour replication.")
    p.add_argument("--data", required=True, metavar="DIR", help="source dataset folder")
    p.add_argument("--parts", required=True, type=int, metavar="P", help="number of partitions")
    p.add_argument("--algo", default="spring", choices=ALGORITHMS,
                   help="partitioning algorithm (default: spring)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (must not exist)")
    p.add_argument("--beta", type=float, default=1.05,
                   help="SPRING balance factor: merged clusters hold at most beta*|V|/p nodes "
                        "(default 1.05, must be >= 1)")
    p.add_argument("--tau-factor", type=float, default=None,
                   help="SPRING volume threshold tau_vol = F * |E| / p (default 0.1)")
    p.add_argument("--tau-vol", type=float, default=None,
                   help="SPRING absolute volume threshold (overrides --tau-factor)")
    p.add_argument("--tie-break", choices=("id", "random"), default=None,
                   help="SPRING representative tie break (default: id)")
    p.add_argument("--merge", choices=("vote", "richest"), default=None,
                   help="SPRING cluster merging: 'richest' = Algorithm 1 (the representative's "
                        "richest neighbour picks the target), 'vote' = the members' richest "
                        "neighbours vote (default: vote)")
    p.add_argument("--stream-iters", type=int, default=None,
                   help="SPRING clustering passes over the edge stream (restreaming; default 1)")
    p.add_argument("--ownership", choices=("majority", "last"), default=None,
                   help="edge partitioners: a node is owned by the partition holding the "
                        "majority of its in-edges (default) or its last in-edge (SDT-GNN's code)")
    p.add_argument("--no-shuffle", action="store_true",
                   help="stream edges in CSC order instead of a seeded shuffle of chunks")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--chunk-edges", type=int, default=DEFAULT_CHUNK_EDGES,
                   help=f"edges per streamed chunk (default {DEFAULT_CHUNK_EDGES})")
    p.add_argument("--halo-hops", type=int, default=1, metavar="H",
                   help="each partition holds the H-hop in-neighbourhood of its owned nodes "
                        "(nodes up to hop H-1 with their full in-neighbour lists; default 1)")
    p.add_argument("--features", choices=("copy", "link"), default="copy",
                   help="each partition's feature rows: 'copy' them into the partition "
                        "(default), or 'link' the dataset's features file: no copy (with "
                        "the halos a copy is several times the features), but the "
                        "partitions then read that file where it is")
    p.add_argument("--no-split", action="store_true",
                   help="only compute the assignment and metrics (owner.npy, partition.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--refine-passes", type=int, default=1, metavar="K",
                   help="streaming refinement passes after the algorithm: each node moves to "
                        "the partition owning most of its in-neighbours, under the beta cap "
                        "(default 1; 0 = the algorithm's own assignment)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_report_arg(p)
    return p


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_report_path(args.report, {"the dataset --data": args.data, "--out": args.out})
    rss0 = peak_rss_bytes()
    params: dict = {}
    spring_only = ("tau_factor", "tau_vol", "tie_break", "merge", "stream_iters")
    own = spring_only if args.algo == "spring" else ("ownership",)
    for key in spring_only + ("ownership",):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in own:
            which = "--algo spring" if key in spring_only else "the edge partitioners"
            raise InvalidValue(f"--{key.replace('_', '-')} applies to {which} only, "
                           f"not --algo {args.algo}")
        params[key] = value
    if params.get("stream_iters", 1) < 1:
        raise InvalidValue(f"--stream-iters must be >= 1, got {params['stream_iters']}")
    if args.no_shuffle:
        params["shuffle"] = False
    if args.chunk_edges < 1:
        raise InvalidValue(f"--chunk-edges must be >= 1, got {args.chunk_edges}")
    if not 0 <= args.seed < 2**63:
        raise InvalidValue(f"--seed must be in [0, 2**63), got {args.seed}")
    report = partition_dataset(args.data, args.out, args.parts, args.algo, beta=args.beta,
                               seed=args.seed, overwrite=args.overwrite,
                               split=not args.no_split, chunk_edges=args.chunk_edges,
                               halo_hops=args.halo_hops, refine_passes=args.refine_passes,
                               features=args.features,
                               precompile=True, progress=not args.quiet and sys.stderr.isatty(), **params)
    report["rss_baseline_bytes"] = rss0
    if args.report:
        write_report(args.report, report, command="ooc.partition")
    print(summary_line(report, args.out, split=not args.no_split)
          + (f"; report {args.report}" if args.report else ""))
    return 0


def summary_line(report: dict, out: str, split: bool) -> str:
    """The one-line summary printed at the end, like the other CLIs'."""
    what = f"{report['p']} partitions in {out}" if split else f"assignment in {out}"
    return (f"ooc.partition: {report['algo']} -> {what}: replication factor "
            f"{report['replication_factor']:.3f}, node balance {report['node_balance']:.3f}, "
            f"edge balance {report['edge_balance']:.3f}, edge cut {int(report['edge_cut']):,} "
            f"({report['edge_cut_ratio']:.1%} of the edges), "
            f"{report['time_s']:.1f} s, peak RSS {format_size(report['peak_rss_bytes'])}")


if __name__ == "__main__":
    sys.exit(main())
