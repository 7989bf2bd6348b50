"""``python -m ooc.train``: train a GNN on an on-disk dataset.

With no ``--data`` it trains on the embedded default: a synthetic power-law
graph created once in ``$OOC_CACHE/default-v1`` (``$XDG_CACHE_HOME/ooc/default-v1`` or
``~/.cache/ooc/default-v1`` when ``OOC_CACHE`` is unset).

Examples::

    python -m ooc.train                                   # the embedded default
    python -m ooc.train --data D --model sage --fanouts 10,10 --epochs 50 --report r.json
    python -m ooc.train --data D --checkpoint-dir ck --epochs 10
    python -m ooc.train --checkpoint-dir ck --resume --epochs 20   # continue, same settings
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .cli import (ArgumentParser, add_io_backend_arg, add_report_arg, check_report_path,
                  main_wrapper, write_report)
from .jit import note_if_cold
from .storage.errors import DatasetError, OocError
from .storage.errors import IOFailure, InvalidValue

#: The embedded default dataset (``generate_synthetic`` arguments). Sized so
#: the default run (generation once, then training) takes about a minute on
#: two cores; one batch of 1024 seeds with fanouts 10,10 touches a few
#: percent of its nodes.
DEFAULT_DATASET: dict[str, Any] = dict(nodes=100_000, avg_degree=10, feature_dim=64, classes=8,
                       train_fraction=0.1, val_fraction=0.05, test_fraction=0.1, seed=0)
DEFAULT_NAME = "default-v1"

#: Option defaults (``None`` options are derived: ``layers`` from ``fanouts``).
DEFAULTS: dict[str, Any] = dict(
    data=None, model="sage", fanouts="10,10", layers=None, batch_size=1024,
    eval_batch_size=None, hidden=128, heads=4, lr=0.005, weight_decay=5e-4, dropout=0.5,
    epochs=3, seed=0, device="auto", eval_every=1, threads=None, mode="ooc",
    checkpoint_every=1, superbatch_size=None, runtime_dir=None, runtime_disk_budget="1GiB",
    feature_cache_size=None, neighbor_cache_size=None, queue_depth=64, io_threads=16,
    memory_budget=None, io_backend="auto",
    workers=None, partitions=None, sync_every=1, compute_fraction=None, partition_dir=None,
    optimizer_sync="average", halo_hops=None, no_eval=False, max_weight_growth=10.0,
)
#: Kernel modules a training run compiles on its first run on a machine.
TRAIN_KERNELS = ("ooc.inspector._sampler_kernels", "ooc.inspector._changeset_kernels",
                 "ooc.executor.cache._cache_kernels", "ooc.storage._direct_kernels")
#: Settings that must not change when resuming (they define the model or the math).
FIXED_ON_RESUME = ("model", "fanouts", "hidden", "heads", "dropout", "seed", "batch_size",
                   "lr", "weight_decay")


def default_dataset(log=print) -> Path:
    """The embedded default dataset, created on first use."""
    from .storage import open_dataset

    from .storage.probe import cache_dir

    path = cache_dir() / DEFAULT_NAME
    if path.exists():
        try:
            open_dataset(path)
            log(f"ooc.train: using the default dataset in {path}")
            return path
        except DatasetError as e:
            log(f"ooc.train: the default dataset is unusable ({e}); creating it again")
    from .storage.ingest import generate_synthetic

    log(f"ooc.train: creating the default dataset once in {path} "
        f"(synthetic power-law graph, {DEFAULT_DATASET['nodes']:,} nodes, "
        f"average degree {DEFAULT_DATASET['avg_degree']}, "
        f"{DEFAULT_DATASET['feature_dim']} features, {DEFAULT_DATASET['classes']} classes)")
    t0 = time.perf_counter()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IOFailure(f"{path.parent}: cannot create the default dataset's folder "
                       f"({e.strerror or e}); set OOC_CACHE to a writable folder or pass "
                       f"--data") from None
    try:
        generate_synthetic(path, **DEFAULT_DATASET, overwrite=path.exists())
    except OocError:
        # another process may have created it meanwhile
        try:
            open_dataset(path)
        except DatasetError:
            raise
    log(f"ooc.train: default dataset ready in {time.perf_counter() - t0:.1f}s")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m ooc.train",
        description="Train a GNN (GraphSAGE, GCN, GAT) on an on-disk ooc dataset. "
                    "Without --data, trains on a small synthetic dataset created once in "
                    "$OOC_CACHE/default-v1 (default ~/.cache/ooc/default-v1).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS)
    d = DEFAULTS
    p.add_argument("--data", metavar="DIR", help="dataset folder (python -m ooc.prepare)")
    from .executor.loader.presets import PRESET_NAMES

    p.add_argument("--mode", choices=PRESET_NAMES,
                   help=f"preset (default {d['mode']}): baseline = memmaps and the page cache, "
                        "no app caches (PyG+); static = neighbor cache + static degree-ordered "
                        "feature cache, O_DIRECT (Ali+PG); ooc = neighbor cache + superbatch "
                        "inspector + Belady feature cache, O_DIRECT (Ginex)")
    p.add_argument("--memory-budget", metavar="SIZE", help="bound the process's memory: the "
                   "caches get what is left after the measured working memory and a reserve")
    p.add_argument("--feature-cache-size", metavar="SIZE", help="feature cache bytes "
                   "(default: from --memory-budget, else 10%% of the features)")
    p.add_argument("--neighbor-cache-size", metavar="SIZE", help="neighbor cache bytes "
                   "(default: from --memory-budget, else 25%% of the full cache)")
    p.add_argument("--superbatch-size", type=int, help="batches per superbatch (ooc; default: "
                   "the largest whose runtime files fit --runtime-disk-budget)")
    p.add_argument("--sizes", metavar="JSON", help="cache and superbatch sizes recommended by "
                   "tools/size_caches.py (its --report); explicit size options win")
    p.add_argument("--runtime-dir", metavar="DIR", help="runtime files (default <data>/runtime)")
    p.add_argument("--runtime-disk-budget", metavar="SIZE",
                   help=f"disk for runtime files (default {d['runtime_disk_budget']})")
    p.add_argument("--queue-depth", type=int, help=f"io_uring queue depth (default "
                   f"{d['queue_depth']})")
    p.add_argument("--io-threads", type=int, help=f"baseline memmap copy threads (default "
                   f"{d['io_threads']})")
    add_io_backend_arg(p)
    p.add_argument("--workers", type=int, help="Q worker processes with model averaging "
                   "(torch.distributed gloo on 127.0.0.1, or the torchrun environment); 1 "
                   "simulates the partitions sequentially in this process")
    p.add_argument("--partitions", type=int, help="P partitions, partition j on worker j mod Q "
                   "(default: the workload-allocation rule from --memory-budget)")
    p.add_argument("--sync-every", type=int, help="average the local models every K epochs "
                   "(default 1)")
    p.add_argument("--optimizer-sync", choices=["average", "reset"],
                   help="at each sync, average the local Adam states with the weights, or "
                        "restart every local Adam (default average)")
    p.add_argument("--halo-hops", type=int, help="hops of in-neighbourhood each partition "
                   "holds when --workers partitions the graph itself (default: the number of "
                   "layers, so sampled neighbourhoods are the whole graph's; 1 = SDT-GNN's "
                   "full in-neighbour lists only, smaller partitions)")
    p.add_argument("--compute-fraction", type=float, help="T/M: share of the per-worker "
                   "--memory-budget the computation needs (default 2/3)")
    p.add_argument("--partition-dir", metavar="DIR", help="partition folder (default "
                   "<data>.partitions/spring_p<P>, partitioned with SPRING when missing)")
    p.add_argument("--no-eval", action="store_true", help="skip validation/test evaluation")
    p.add_argument("--model", choices=["sage", "gcn", "gat"], help=f"default {d['model']}")
    p.add_argument("--fanouts", metavar="F1,F2,..",
                   help=f"neighbours sampled per layer, -1 = all; sets the number of layers "
                        f"(default {d['fanouts']})")
    p.add_argument("--layers", type=int, help="number of layers (must match --fanouts; "
                   "alone, fanouts default to 10 per layer)")
    p.add_argument("--batch-size", type=int, help=f"seeds per batch (default {d['batch_size']})")
    p.add_argument("--eval-batch-size", type=int, help="seeds per evaluation batch "
                   "(default: --batch-size)")
    p.add_argument("--hidden", type=int, help=f"hidden width (default {d['hidden']})")
    p.add_argument("--heads", type=int, help=f"GAT attention heads (default {d['heads']})")
    p.add_argument("--lr", type=float, help=f"Adam learning rate (default {d['lr']})")
    p.add_argument("--weight-decay", type=float, help="Adam weight decay (default 5e-4)")
    p.add_argument("--dropout", type=float, help=f"dropout (default {d['dropout']})")
    p.add_argument("--max-weight-growth", type=float, metavar="X",
                   help="stop when one step grows the weights more than X times (an exploding "
                        "update; normal steps stay within a few percent; default "
                        f"{d['max_weight_growth']:g})")
    p.add_argument("--epochs", type=int, help=f"train until this epoch (default {d['epochs']})")
    p.add_argument("--seed", type=int, help=f"random seed (default {d['seed']})")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when available (default auto)")
    p.add_argument("--eval-every", type=int,
                   help="evaluate on the validation split every N epochs (default 1)")
    p.add_argument("--threads", type=int, help="sampler threads (default: all cores)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="save epoch_NNNN.pt here after every --checkpoint-every epochs")
    p.add_argument("--checkpoint-every", type=int, help="epochs between checkpoints (default 1)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir with its "
                        "settings (options given here override the others)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_report_arg(p)
    return p


def parse_fanouts(text: str) -> list[int]:
    try:
        f = [int(t) for t in str(text).replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise InvalidValue(f"--fanouts {text!r}: expected comma-separated integers, e.g. 10,10") \
            from None
    if not f or any(v == 0 or v < -1 for v in f):
        raise InvalidValue(f"--fanouts {text!r}: need one value per layer, each > 0 or -1 (all)")
    return f


def _settings(given: dict[str, Any], saved: dict[str, Any] | None) -> dict[str, Any]:
    """Explicit options > the checkpoint's settings (on resume) > defaults."""
    s = dict(DEFAULTS)
    if saved:
        s.update({k: v for k, v in saved.items() if k in DEFAULTS})
        for k in FIXED_ON_RESUME:
            if k in given and str(given[k]) != str(saved.get(k)):
                raise InvalidValue(f"--resume: --{k.replace('_', '-')} {given[k]} differs from the "
                               f"checkpoint's {saved.get(k)} (resuming needs the same settings)")
    s.update({k: v for k, v in given.items() if k in DEFAULTS})
    if "fanouts" not in given and "layers" in given and not saved:
        s["fanouts"] = ",".join(["10"] * int(given["layers"]))
    fanouts = parse_fanouts(s["fanouts"])
    if s.get("layers") is not None and int(s["layers"]) != len(fanouts):
        raise InvalidValue(f"--layers {s['layers']} does not match --fanouts {s['fanouts']} "
                       f"({len(fanouts)} layers)")
    s["fanouts"] = ",".join(str(v) for v in fanouts)
    s["layers"] = len(fanouts)
    return s


#: Range of the integer and float options that TrainConfig does not hold:
#: (settings key, lowest, highest, integer, open low end, open high end); None = no bound.
OPTION_LIMITS = (
    ("queue_depth", 1, 4096, True, False, False), ("io_threads", 1, 1024, True, False, False),
    ("superbatch_size", 1, None, True, False, False),
    ("checkpoint_every", 1, None, True, False, False), ("workers", 1, 256, True, False, False),
    ("partitions", 1, 1 << 16, True, False, False), ("sync_every", 1, None, True, False, False),
    ("halo_hops", 1, 64, True, False, False),
    ("compute_fraction", 0, 1, False, True, True),
)
#: Size options: (settings key, smallest accepted byte count).
SIZE_LIMITS = (("memory_budget", 1), ("runtime_disk_budget", 1), ("feature_cache_size", 0),
               ("neighbor_cache_size", 0))


def _size(key: str, value: Any) -> int | None:
    """Bytes of a size option (``512MiB``, ``8GiB``); None when not given."""
    from .cli import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except Exception:  # noqa: BLE001 - argparse error type
        raise InvalidValue(f"--{key.replace('_', '-')} {value!r}: not a size (e.g. 512MiB, 8GiB)") \
            from None


def _check_options(s: dict[str, Any], progress: bool):
    """Range-check every option; returns the run's ``TrainConfig``.

    Runs before the dataset is opened or created, so bad input touches no file.
    """
    from .cli import check_range

    for key, lo, hi, integer, lo_open, hi_open in OPTION_LIMITS:
        check_range(f"--{key.replace('_', '-')}", s.get(key), lo, hi, integer=integer,
                    lo_open=lo_open, hi_open=hi_open)
    for key, lo in SIZE_LIMITS:
        v = _size(key, s.get(key))
        if v is not None and v < lo:
            hint = " (leave the option out for no budget)" if key == "memory_budget" else ""
            raise InvalidValue(f"--{key.replace('_', '-')} {s[key]}: must be at least {lo} "
                           f"byte{'s' if lo != 1 else ''}{hint}")
    from .executor.training.config import TrainConfig

    config = TrainConfig(model=s["model"], fanouts=parse_fanouts(s["fanouts"]),
                         batch_size=s["batch_size"], eval_batch_size=s["eval_batch_size"],
                         hidden=s["hidden"], dropout=s["dropout"], heads=s["heads"], lr=s["lr"],
                         weight_decay=s["weight_decay"], epochs=s["epochs"], seed=s["seed"],
                         eval_every=s["eval_every"], device=s["device"],
                         num_threads=s["threads"], progress=progress, mode=s["mode"],
                         max_weight_growth=s["max_weight_growth"])
    config.validate()
    if s["no_eval"]:
        config.eval_every = 10**9
        config.eval_final = False
    return config


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    given = vars(build_parser().parse_args(argv))
    resume = bool(given.pop("resume", False))
    progress = not given.pop("no_progress", False)
    report_path = given.pop("report", None)
    check_report_path(report_path)
    ckdir = given.pop("checkpoint_dir", None)
    sizes_path = given.pop("sizes", None)
    argv = list(sys.argv[1:] if argv is None else argv)
    with checkpoint_lock(ckdir):
        return _run(given, resume, progress, report_path, ckdir, sizes_path, argv)


def checkpoint_lock(ckdir: str | os.PathLike | None):
    """The lock of a checkpoint folder for the whole run (nothing to lock without one): a
    second training on the same folder is refused naming this one's pid. A worker process
    of ``--workers`` (or torchrun) takes none: the launcher holds it for its workers."""
    import contextlib

    from .executor.distributed.environment import in_worker
    from .storage.locks import exclusive

    if ckdir is None or in_worker():
        return contextlib.nullcontext()
    Path(ckdir).resolve().parent.mkdir(parents=True, exist_ok=True)
    return exclusive(Path(ckdir).resolve(), "checkpoint folder")


def _run(given: dict, resume: bool, progress: bool, report_path, ckdir, sizes_path,
         argv: list[str]) -> int:
    from .storage import open_dataset

    ck_path, ck_state = _checkpoint_to_resume(ckdir) if resume else (None, None)
    s = _settings(given, (ck_state.get("args") or {}) if ck_state is not None else None)
    config = _check_options(s, progress)  # before any file is touched
    if s["data"] is None:
        s["data"] = str(default_dataset())
    dataset = open_dataset(s["data"])
    s["data"] = str(Path(s["data"]).resolve())  # checkpoints resume from any folder
    if ck_state is not None:
        from .executor.training.checkpoint import check_dataset

        assert ck_path is not None  # _checkpoint_to_resume returns both or neither
        check_dataset(ck_state, dataset, ck_path)
        del ck_state
    if sizes_path is not None:
        _apply_sizes(sizes_path, dataset, given, s, config)
    options = _mode_options(s)
    note_if_cold(TRAIN_KERNELS, "the sampling, cache and changeset kernels")
    if options.memory_budget:
        # a first run compiles the kernels in a child process; started before torch is
        # imported here, the two processes together stay within a budget's cgroup
        from .executor.sizing.budget import compile_kernels

        compile_kernels(dataset, config, options)
    from .executor.distributed.cli import run_cli, wants_averaging
    if wants_averaging(s):
        return run_cli(dataset, config, options, s, argv, ckdir, ck_path, report_path,
                       list(DEFAULTS))
    t0 = time.perf_counter()
    trainer, val_acc, test_acc = _train(dataset, config, options, s, ckdir, ck_path)
    total = time.perf_counter() - t0
    rep = trainer.report(val_acc=val_acc, test_acc=test_acc, total_time_s=round(total, 3),
                         resumed_from=str(ck_path) if ck_path else None,
                         checkpoint_dir=ckdir, argv=argv)
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    print(f"ooc.train: done in {total:.1f}s: val_acc {fmt(val_acc)}  test_acc {fmt(test_acc)}  "
          f"peak RSS {rep['peak_rss_bytes'] / 2**20:.0f} MiB"
          + (f"  report {report_path}" if report_path else ""))
    if report_path:
        write_report(report_path, rep)
    return 0


def _checkpoint_to_resume(ckdir: str | None) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint in ``ckdir`` and its state (``--resume``)."""
    if ckdir is None:
        raise InvalidValue("--resume needs --checkpoint-dir DIR")
    from .executor.training.checkpoint import latest_checkpoint, load_checkpoint

    ck_path = latest_checkpoint(ckdir)
    return ck_path, load_checkpoint(ck_path)


def _apply_sizes(sizes_path: str, dataset, given: dict, s: dict, config) -> None:
    """Cache sizes, superbatch size and mode from a size_caches report, where the
    command line leaves them out."""
    from .executor.sizing.profiler import load_sizes

    sizes = load_sizes(sizes_path, dataset)
    for key in ("feature_cache_size", "neighbor_cache_size", "superbatch_size"):
        if key not in given and sizes.get(key) is not None:
            s[key] = sizes[key]
    if "mode" not in given and sizes.get("mode"):
        s["mode"] = config.mode = sizes["mode"]


def _mode_options(s: dict):
    """The loader stack's options from the settings."""
    from .executor.loader.stack import ModeOptions

    def size(key):
        return _size(key, s.get(key))

    return ModeOptions(superbatch_size=s["superbatch_size"], runtime_dir=s["runtime_dir"],
                       runtime_disk_budget=size("runtime_disk_budget"),
                       feature_cache_size=size("feature_cache_size"),
                       neighbor_cache_size=size("neighbor_cache_size"),
                       queue_depth=int(s["queue_depth"]), io_threads=int(s["io_threads"]),
                       memory_budget=size("memory_budget"), io_backend=s["io_backend"])


def _train(dataset, config, options, s: dict, ckdir, ck_path):
    """Train in this process (resuming from ``ck_path``), checkpointing into ``ckdir``;
    returns the closed trainer and the validation and test accuracies."""
    from .executor.training.trainer import Trainer

    trainer = Trainer(dataset, config, options=options)
    try:
        if ck_path is not None:
            trainer.resume(ck_path)
            print(f"ooc.train: resumed from {ck_path} (epoch {trainer.epoch})")
            if trainer.epoch >= config.epochs:
                from .storage.notes import note

                note(f"{ck_path} has trained {trainer.epoch} epochs already and --epochs is "
                     f"{config.epochs}: no epoch to train (raise --epochs to continue); "
                     f"evaluating it")
        print(f"ooc.train: {dataset.path} ({dataset.num_nodes:,} nodes, "
              f"{dataset.num_edges:,} edges, {dataset.feature_dim} features, "
              f"{dataset.num_classes} classes, {len(dataset.train_idx):,} training nodes); "
              f"model {config.model} {trainer.model.dims}, fanouts {s['fanouts']}, batch "
              f"{config.batch_size}, mode {config.mode}, device {trainer.device}, "
              f"reader {trainer.mode_info.get('reader_backend', 'n/a')}")
        args = {k: s[k] for k in DEFAULTS}
        while trainer.epoch < config.epochs:
            trainer.train_epoch()
            if ckdir is not None and (trainer.epoch % s["checkpoint_every"] == 0
                                      or trainer.epoch == config.epochs):
                trainer.save(ckdir, args=args)
        no_eval = bool(s["no_eval"])
        val_acc = None if no_eval else trainer.evaluate(dataset.val_idx)
        test_acc = None if no_eval else trainer.evaluate(dataset.test_idx)
    finally:
        trainer.close()
    return trainer, val_acc, test_acc


if __name__ == "__main__":
    sys.exit(main())
