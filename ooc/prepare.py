"""``python -m ooc.prepare``: convert raw graph data to the on-disk dataset format.

Sub-commands::

    python -m ooc.prepare edgelist EDGES --out D [--undirected] [--dedup] ...
    python -m ooc.prepare ogb --root OGB_FOLDER --out D [--split NAME]
    python -m ooc.prepare igb --root IGB_FOLDER --out D [--label 19]
    python -m ooc.prepare planetoid --root R --name Cora --out D
    python -m ooc.prepare synthetic --nodes 1000000 --avg-degree 20 --out D
    python -m ooc.prepare verify D      # every page against its checksum, every row finite

Every source takes a link-prediction split: ``--link-split 0.05,0.1`` (seeded fractions
of the edge pairs) or ``--val-edges/--test-edges F.npy`` with optional ``--val-neg/
--test-neg``; held-out edges leave the adjacency and are stored with their negatives.

Every sub-command streams its input with O(N) memory plus ``--buffer``,
writes into a temporary folder renamed into place when complete, and exits
with code 2 and a one-line reason on bad input. ``--overwrite`` replaces
only an ooc dataset folder. Refused: a graph without edges, a node in two
splits or twice in one, NaN/inf features (unless ``--allow-nonfinite``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from ooc.cli import ArgumentParser, add_report_arg, check_report_path, main_wrapper
from ooc.cli import write_report as write_cli_report
from ooc.core.errors import InvalidValue
from ooc.core.jit import note_if_cold
from ooc.core.memory import current_rss_bytes, peak_rss_bytes
from ooc.core.sizes import format_size, parse_size
from ooc.storage import ingest
from ooc.storage.ingest.edgelist import DEFAULT_BUFFER, EDGE_FORMATS
from ooc.storage.ingest.limits import available_memory, load_kernels, planned_peak
from ooc.storage.ingest.precompile import compile_ingest_kernels
from ooc.storage.layout import FeatureLayout
from ooc.storage.link_split import LinkSplitSpec, load_int_array
from ooc.storage.verify import verify_dataset
from ooc.storage.writer import REORDERS


def _common(p: argparse.ArgumentParser, name: bool = True) -> None:
    p.add_argument("--out", required=True, type=Path, help="output dataset folder")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it is an ooc dataset folder (never anything else)")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="keep NaN/inf feature values (refused by default)")
    p.add_argument("--buffer", type=parse_size, default=DEFAULT_BUFFER, metavar="SIZE",
                   help="memory for the scatter buffer and input chunks, e.g. 256MiB (default 512MiB); "
                        "memory use is about 32 bytes per node plus this")
    p.add_argument("--reorder", choices=REORDERS, default="auto",
                   help="store the feature rows in a locality order so that neighbours share "
                        "pages (node ids stay yours): auto = when rows are smaller than a page "
                        "(default), locality = always, none = node order")
    _link_opts(p)
    if name:
        p.add_argument("--name", default="", help="dataset name stored in meta.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_report_arg(p)


def _fractions(text: str) -> tuple[float, float]:
    try:
        val, test = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected VAL,TEST fractions such as 0.05,0.1, got "
                                         f"{text!r}") from None
    return val, test


def _link_opts(p: argparse.ArgumentParser) -> None:
    """Options of an edge split for link prediction (:mod:`ooc.storage.link_split`)."""
    g = p.add_argument_group("link prediction split (held-out edges leave the adjacency "
                             "in both directions)")
    g.add_argument("--link-split", type=_fractions, metavar="VAL,TEST",
                   help="hold out these fractions of the edge pairs for validation and test, "
                        "seeded by --link-seed")
    g.add_argument("--val-edges", type=Path, metavar="F.npy",
                   help="given validation edges: int array [2, k] of source and target ids")
    g.add_argument("--test-edges", type=Path, metavar="F.npy", help="given test edges [2, k]")
    g.add_argument("--val-neg", type=Path, metavar="F.npy",
                   help="negatives of --val-edges: int array [k, K], K targets per positive")
    g.add_argument("--test-neg", type=Path, metavar="F.npy", help="negatives of --test-edges")
    g.add_argument("--num-neg", type=int, default=1, metavar="K",
                   help="negatives drawn per held-out edge where none are given (default 1; "
                        "1000 for ranking as ogbl-citation2)")
    g.add_argument("--link-seed", type=int, default=0,
                   help="seed of the held-out edges and drawn negatives (default 0)")


def link_split_spec(args: argparse.Namespace) -> LinkSplitSpec | None:
    """The link split the options ask for (None: none)."""
    files = {k: getattr(args, k) for k in ("val_edges", "test_edges", "val_neg", "test_neg")}
    if args.link_split is None and not any(v is not None for v in files.values()):
        return None
    arrays = {k: load_int_array(v) for k, v in files.items() if v is not None}
    val, test = args.link_split or (0.0, 0.0)
    return LinkSplitSpec(val=val, test=test, seed=args.link_seed, num_neg=args.num_neg,
                         names={k: str(v) for k, v in files.items() if v is not None}, **arrays)


def _graph_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--undirected", action="store_true", help="add the reverse of every edge")
    p.add_argument("--dedup", action="store_true", help="remove duplicate edges")
    p.add_argument("--remove-self-loops", action="store_true", help="drop edges v -> v")


def _add_edgelist(sub) -> None:
    """The ``edgelist`` subcommand's options."""
    e = sub.add_parser("edgelist", help="text/CSV, .npy [2,E] or [E,2], or raw int32/int64 pairs",
                       description="Convert an edge list (src dst per edge; CSC keeps in-neighbours).")
    e.add_argument("edges", type=Path, help="edge file (.txt/.csv[.gz], .npy, raw binary)")
    e.add_argument("--format", default="auto", choices=EDGE_FORMATS,
                   help="auto sniffs text/.npy; raw binary pairs need bin32 or bin64")
    e.add_argument("--header", action="store_true", help="skip the first line of a text file")
    e.add_argument("--num-nodes", type=int, help="node count (default: features rows, else max id + 1)")
    _graph_opts(e)
    e.add_argument("--features", type=Path, help=".npy [N, D] node features")
    e.add_argument("--dtype", choices=("float32", "float16"), help="feature dtype on disk")
    e.add_argument("--labels", type=Path, help=".npy [N] int labels (-1 or NaN: unlabeled)")
    e.add_argument("--train-idx", type=Path, help=".npy node ids or boolean mask")
    e.add_argument("--val-idx", type=Path, help=".npy node ids or boolean mask")
    e.add_argument("--test-idx", type=Path, help=".npy node ids or boolean mask")
    _common(e)


def _add_ogb(sub) -> None:
    """The ``ogb`` subcommand's options."""
    o = sub.add_parser("ogb", help="an OGB node-property folder (raw/*.csv.gz or raw/data.npz, "
                                   "split/<name>/)")
    o.add_argument("--root", type=Path, required=True,
                   help="the dataset folder holding raw/ and split/ (e.g. .../ogbn_arxiv)")
    o.add_argument("--split", help="split folder name under split/ (default: the only one)")
    _graph_opts(o)
    o.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    _common(o)


def _add_igb(sub) -> None:
    """The ``igb`` subcommand's options."""
    ig = sub.add_parser("igb", help="an IGB graph's .npy files (node_feat, edge_index [E, 2], "
                                    "node_label_19/2K)")
    ig.add_argument("--root", type=Path, required=True, help="folder holding the graph's .npy files")
    ig.add_argument("--label", default="19", help="node_label_<LABEL>.npy: 19 or 2K (default 19)")
    ig.add_argument("--train-fraction", type=float, default=0.6,
                    help="labelled nodes in train (default 0.6; IGB ships no splits)")
    ig.add_argument("--val-fraction", type=float, default=0.2,
                    help="labelled nodes in validation (default 0.2; the rest: test)")
    ig.add_argument("--seed", type=int, default=0, help="seed of the random split (default 0)")
    _graph_opts(ig)
    ig.add_argument("--dtype", choices=("float32", "float16"), help="feature dtype on disk")
    _common(ig)


def _add_planetoid(sub) -> None:
    """The ``planetoid`` subcommand's options."""
    pl = sub.add_parser("planetoid", help="PyG Planetoid raw files (Cora, CiteSeer, PubMed)")
    pl.add_argument("--root", type=Path, required=True, help="folder holding <name>/raw/ind.<name>.*")
    pl.add_argument("--name", dest="dataset", required=True, help="Cora, CiteSeer or PubMed")
    _common(pl, name=False)


def _add_synthetic(sub) -> None:
    """The ``synthetic`` subcommand's options."""
    s = sub.add_parser("synthetic", help="power-law graph with communities (labels) and noisy features")
    s.add_argument("--nodes", type=int, default=100_000, help="number of nodes (default 100000)")
    s.add_argument("--avg-degree", type=float, default=10.0,
                   help="mean in-degree before duplicate edges are merged (default 10)")
    s.add_argument("--feature-dim", type=int, default=64,
                   help="features per node (default 64)")
    s.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="feature dtype on disk (default float32)")
    s.add_argument("--classes", type=int, default=8,
                   help="communities, which are the labels (default 8)")
    s.add_argument("--train-fraction", type=float, default=0.1,
                   help="share of the nodes in the training split (default 0.1)")
    s.add_argument("--val-fraction", type=float, default=0.05,
                   help="share of the nodes in the validation split (default 0.05)")
    s.add_argument("--test-fraction", type=float, default=None,
                   help="share of the nodes in the test split (default: all remaining nodes)")
    s.add_argument("--community-size", type=int, default=None, metavar="K",
                   help="many small communities of about K nodes (labels: community modulo "
                        "--classes) instead of one community per class")
    s.add_argument("--p-in", type=float, default=0.85,
                   help="probability an edge stays inside its community (default 0.85)")
    s.add_argument("--noise", type=float, default=None,
                   help="standard deviation of the feature noise (default 0.7: features alone "
                        "give about half the accuracy)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    d = s.add_mutually_exclusive_group()
    d.add_argument("--undirected", dest="undirected", action="store_true", default=True,
                   help="store both directions of every edge (default)")
    d.add_argument("--directed", dest="undirected", action="store_false",
                   help="store each generated edge in one direction only")
    _common(s)


def _add_verify(sub) -> None:
    """The ``verify`` subcommand's options."""
    v = sub.add_parser("verify", help="read a dataset whole: every page against its checksum, "
                                      "every id in range, every feature row finite",
                       description="Verify a dataset folder (see ooc.storage.verify); exit 2 "
                                   "naming the first bad file and place, else 0.")
    v.add_argument("dataset", type=Path, help="the dataset folder")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_report_arg(v)


def verify(args: argparse.Namespace) -> int:
    """``ooc.prepare verify``: one summary line on stdout (and the summary as ``--report``),
    exit 0 (a problem raises)."""
    check_report_path(args.report, {"the dataset": args.dataset})
    t0 = time.perf_counter()
    s = verify_dataset(args.dataset, progress=not args.no_progress)
    dt = time.perf_counter() - t0
    if args.report:
        write_cli_report(args.report, {**s, "seconds": round(dt, 3)},
                         command="ooc.prepare verify")
    rows = f", {s['rows']:,} feature rows finite" if s["rows"] else ""
    old = (f"; {', '.join(s['uncovered'])} without page checksums (written by an older ooc: "
           f"write the dataset again with ooc.prepare to cover them)" if s["uncovered"] else "")
    print(f"{s['dataset']}: verified {s['files']} files, {format_size(s['bytes'])} in "
          f"{dt:.1f} s ({format_size(s['bytes'] / max(dt, 1e-9))}/s): every page matches its "
          f"checksum, every id in range{rows}{old}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m ooc.prepare`` and its subcommands."""
    ap = ArgumentParser(prog="python -m ooc.prepare", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True,
                            metavar="{edgelist,ogb,igb,planetoid,synthetic,verify}")
    _add_edgelist(sub)
    _add_ogb(sub)
    _add_igb(sub)
    _add_planetoid(sub)
    _add_synthetic(sub)
    _add_verify(sub)
    return ap


MIN_BUFFER = 1 << 20


def write_report(report: str, data: dict, out: Path) -> None:
    """Write the report atomically; a failure is one line saying the dataset is fine."""
    write_cli_report(report, data, note=f"; the dataset {out} was written and is complete",
          command="ooc.prepare")


def _planned_peak(rss0: int, stats: dict, out: Path, buffer: int) -> int:
    """:func:`~ooc.storage.ingest.limits.planned_peak` of the dataset just written."""
    import json

    meta = json.loads((Path(out) / "meta.json").read_text())
    stored = stats.get("edges_before_dedup", meta["num_edges"])
    reordered, order = None, meta.get("feature_order", {})
    if order.get("kind") == "locality":
        reordered = FeatureLayout(meta["num_nodes"], meta["feature_dim"], meta["feature_dtype"])
    # a generated graph's own arrays (its id permutation and labels) beside ingest's
    return planned_peak(rss0 + int(stats.get("source_bytes", 0)), meta["num_nodes"], stored,
                        buffer, 4 if meta["index_dtype"] == "int32" else 8, meta["row_bytes"],
                        reordered, order.get("longest_list"), stats.get("routed"),
                        bool(stats.get("labels_held", True)))


def _compile_kernels(args: argparse.Namespace) -> None:
    """On a cold numba cache, a note and the ingest's kernels compiled in a child process
    (:mod:`~ooc.storage.ingest.precompile`), so this process peaks as a later run does."""

    note_if_cold(("ooc.storage.ingest._kernels", "ooc.storage._reorder_kernels"),
                 "the ingest kernels")
    compile_ingest_kernels(args.command, undirected=getattr(args, "undirected", True),
                           dedup=getattr(args, "dedup", False),
                           remove_self_loops=getattr(args, "remove_self_loops", False),
                           dtype=getattr(args, "dtype", None), reorder=args.reorder)


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m ooc.prepare`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return verify(args)

    check_report_path(args.report, {"--out": args.out})
    if args.buffer < MIN_BUFFER:
        raise InvalidValue(f"--buffer must be at least 1MiB, got {args.buffer} bytes")
    avail = available_memory()
    if args.buffer > avail:
        raise InvalidValue(f"--buffer {args.buffer} bytes is more than the {avail} bytes of memory "
                       f"available now")
    if args.command != "planetoid":  # Planetoid's graphs are small enough as they are
        _compile_kernels(args)
    t0 = time.perf_counter()
    load_kernels()
    rss0 = current_rss_bytes()
    stats: dict = {}
    progress = not args.no_progress
    common = dict(overwrite=args.overwrite, progress=progress, buffer_bytes=args.buffer, stats=stats,
                  allow_nonfinite=args.allow_nonfinite, reorder=args.reorder,
                  link_split=link_split_spec(args))
    if args.command == "edgelist":
        out = ingest.ingest_edgelist(
            args.edges, args.out, fmt=args.format, header=args.header, num_nodes=args.num_nodes,
            undirected=args.undirected, dedup=args.dedup, remove_self_loops=args.remove_self_loops,
            features=args.features, feature_dtype=args.dtype, labels=args.labels,
            train_idx=args.train_idx, val_idx=args.val_idx, test_idx=args.test_idx,
            name=args.name, **common)
    elif args.command == "ogb":
        out = ingest.ingest_ogb(args.root, args.out, split=args.split, undirected=args.undirected,
                                dedup=args.dedup, remove_self_loops=args.remove_self_loops,
                                feature_dtype=args.dtype, name=args.name, **common)
    elif args.command == "igb":
        out = ingest.ingest_igb(args.root, args.out, label=args.label,
                                train_fraction=args.train_fraction, val_fraction=args.val_fraction,
                                seed=args.seed, undirected=args.undirected, dedup=args.dedup,
                                remove_self_loops=args.remove_self_loops, feature_dtype=args.dtype,
                                name=args.name, **common)
    elif args.command == "planetoid":
        out = ingest.ingest_planetoid(args.root, args.dataset, args.out, **common)
    else:
        out = ingest.generate_synthetic(
            args.out, nodes=args.nodes, avg_degree=args.avg_degree, feature_dim=args.feature_dim,
            classes=args.classes, dtype=args.dtype, train_fraction=args.train_fraction,
            val_fraction=args.val_fraction, test_fraction=args.test_fraction, seed=args.seed,
            undirected=args.undirected, p_in=args.p_in, noise=args.noise,
            community_size=args.community_size, **common)
    if args.command != "verify" and common["link_split"] is not None:  # edges held out
        import json

        stats["num_edges"] = json.loads((Path(out) / "meta.json").read_text())["num_edges"]
    report = {"command": args.command, "out": str(out), "num_nodes": stats.get("num_nodes"),
              "num_edges": stats.get("num_edges"), "time_s": round(time.perf_counter() - t0, 3),
              "peak_rss_bytes": peak_rss_bytes(), "buffer_bytes": args.buffer,
              "passes": stats.get("passes"), "windows": stats.get("windows"),
              # ingest's own charge (storage.ingest.limits.planned_peak)
              "planned_peak_bytes": _planned_peak(rss0, stats, out, args.buffer)}
    print(f"wrote {out}: {report['num_nodes']} nodes, {report['num_edges']} edges "
          f"in {report['time_s']:.1f} s", file=sys.stderr)
    if args.report:
        write_report(args.report, report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
