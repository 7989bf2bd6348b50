"""``python -m ooc.train``: train a GNN on an on-disk dataset.

With no ``--data`` it trains on the embedded default: a synthetic power-law
graph created once in ``$OOC_CACHE/default-v1`` (``$XDG_CACHE_HOME/ooc/default-v1`` or
``~/.cache/ooc/default-v1`` when ``OOC_CACHE`` is unset).

Examples::

    python -m ooc.train                                   # the embedded default
    python -m ooc.train --data D --model sage --fanouts 10,10 --epochs 50 --report r.json
    python -m ooc.train --data D --checkpoint-dir ck --epochs 10
    python -m ooc.train --checkpoint-dir ck --resume --epochs 20   # continue, same settings

``--report`` is written after every epoch (``"complete": false``, the epochs so far and the
memory plan) and once more at the end (``"complete": true``, with the final accuracies), so
a run stopped midway leaves what it did.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ooc.cli import ArgumentParser, add_report_arg, check_report_path, main_wrapper, write_report
from ooc.core.errors import DatasetError, InvalidValue, IOFailure, OocError
from ooc.core.jit import note_if_cold
from ooc.core.notes import note
from ooc.executor.distributed.environment import in_worker
from ooc.executor.settings import MODE, RUN, TRAIN, add_arguments
from ooc.executor.sizing.budget import compile_kernels

# the settings' resolution is shared with ooc.size; the private names are ooc.train's own use
from ooc.executor.sizing.options import DEFAULTS
from ooc.executor.sizing.options import check_options as _check_options
from ooc.executor.sizing.options import mode_options as _mode_options
from ooc.executor.sizing.options import resolve as _settings
from ooc.executor.sizing.profiler import load_sizes
from ooc.storage import open_dataset
from ooc.storage.ingest import generate_synthetic
from ooc.storage.locks import exclusive
from ooc.storage.probe import cache_dir

#: The embedded default dataset (``generate_synthetic`` arguments). Sized so
#: the default run (generation once, then training) takes about a minute on
#: two cores; one batch of 1024 seeds with fanouts 10,10 touches a few
#: percent of its nodes.
DEFAULT_DATASET: dict[str, Any] = dict(nodes=100_000, avg_degree=10, feature_dim=64, classes=8,
                       train_fraction=0.1, val_fraction=0.05, test_fraction=0.1, seed=0)
DEFAULT_NAME = "default-v1"

#: Kernel modules a training run compiles on its first run on a machine.
TRAIN_KERNELS = ("ooc.sampling._sampler_kernels", "ooc.caches._changeset_kernels",
                 "ooc.caches._cache_kernels", "ooc.storage._direct_kernels",
                 "ooc.executor.training._activation_kernels")


def default_dataset(log=print) -> Path:
    """The embedded default dataset, created on first use."""


    path = cache_dir() / DEFAULT_NAME
    if path.exists():
        try:
            open_dataset(path)
            log(f"ooc.train: using the default dataset in {path}")
            return path
        except DatasetError as e:
            log(f"ooc.train: the default dataset is unusable ({e}); creating it again")

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
    """The argument parser of ``python -m ooc.train``."""
    p = ArgumentParser(
        prog="python -m ooc.train",
        description="Train a GNN (GraphSAGE, GCN, GAT) on an on-disk ooc dataset. "
                    "Without --data, trains on a small synthetic dataset created once in "
                    "$OOC_CACHE/default-v1 (default ~/.cache/ooc/default-v1).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS)
    p.add_argument("--data", metavar="DIR", help="dataset folder (python -m ooc.prepare)")
    add_arguments(p, TRAIN)
    p.add_argument("--layers", type=int, help="number of layers (must match --fanouts; "
                   "alone, fanouts default to 10 per layer)")
    add_arguments(p, MODE)
    p.add_argument("--sizes", metavar="JSON", help="cache and superbatch sizes recommended by "
                   "python -m ooc.size (its --report); explicit size options win")
    add_arguments(p, RUN)
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="save epoch_NNNN.pt here after every --checkpoint-every epochs (a "
                        "folder holding another run's checkpoints is refused unless --resume "
                        "continues it or --overwrite replaces them)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir with its "
                        "settings (options given here override the others)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_report_arg(p)
    return p


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m ooc.train`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    given = vars(build_parser().parse_args(argv))
    resume = bool(given.pop("resume", False))
    overwrite = bool(given.pop("overwrite", False))
    progress = not given.pop("no_progress", False)
    report_path = given.pop("report", None)
    ckdir = given.pop("checkpoint_dir", None)
    check_report_path(report_path, _report_keep_out(given, ckdir))
    sizes_path = given.pop("sizes", None)
    argv = list(sys.argv[1:] if argv is None else argv)
    with checkpoint_lock(ckdir):
        return _run(given, (resume, overwrite), progress, report_path, ckdir, sizes_path, argv)


def _report_keep_out(s: dict, ckdir: str | None) -> dict[str, Any]:
    """What ``--report`` may neither be nor lie inside: the dataset, the checkpoint and
    partition folders."""
    return {"the dataset": s.get("data"), "--checkpoint-dir": ckdir,
            "--partition-dir": s.get("partition_dir")}


def checkpoint_lock(ckdir: str | os.PathLike | None):
    """The lock of a checkpoint folder for the whole run (nothing to lock without one): a
    second training on the same folder is refused naming this one's pid. A worker process
    of ``--workers`` (or torchrun) takes none: the launcher holds it for its workers."""
    import contextlib


    if ckdir is None or in_worker():
        return contextlib.nullcontext()
    Path(ckdir).resolve().parent.mkdir(parents=True, exist_ok=True)
    return exclusive(Path(ckdir).resolve(), "checkpoint folder")


def _run(given: dict, how: tuple[bool, bool], progress: bool, report_path, ckdir, sizes_path,
         argv: list[str]) -> int:
    """Train with the options ``given``; ``how``: ``--resume`` and ``--overwrite``."""
    from ooc.executor.training.checkpoint import check_checkpoint_dir, remove_checkpoints

    resume, overwrite = how
    replaced = check_checkpoint_dir(ckdir, resume, overwrite)
    ck_path, ck_state = _checkpoint_to_resume(ckdir) if resume else (None, None)
    s = _settings(given, (ck_state.get("args") or {}) if ck_state is not None else None)
    s["overwrite"] = overwrite  # this command's, never the checkpoint's
    check_report_path(report_path, _report_keep_out(s, ckdir))  # the dataset resumed on
    config = _check_options(s, progress)  # before any file is touched
    if s["data"] is None:
        s["data"] = str(default_dataset())
    dataset = open_dataset(s["data"])
    s["data"] = str(Path(s["data"]).resolve())  # checkpoints resume from any folder
    if ck_state is not None:
        from ooc.executor.training.checkpoint import check_dataset

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

        compile_kernels(dataset, config, options)
    from ooc.executor.distributed.cli import run_cli, wants_averaging
    if wants_averaging(s):
        if config.task == "link":
            raise InvalidValue("--task link trains in one process: drop --workers/--partitions")
        return run_cli(dataset, config, options, s, argv, ckdir, ck_path, report_path,
                       list(DEFAULTS))
    remove_checkpoints(replaced)  # every check passed: this run replaces them
    t0 = time.perf_counter()
    run_facts = {"resumed_from": str(ck_path) if ck_path else None, "checkpoint_dir": ckdir,
                 "argv": argv}

    def epoch_report(trainer) -> None:  # a run stopped later keeps the epochs it finished
        write_report(report_path, trainer.report(
            complete=False, total_time_s=round(time.perf_counter() - t0, 3), **run_facts),
            command="ooc.train")

    trainer, results = _train(dataset, config, options, s, ckdir, ck_path,
                              epoch_report if report_path else None)
    total = time.perf_counter() - t0
    rep = trainer.report(**results, complete=True, total_time_s=round(total, 3), **run_facts)
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    shown = "  ".join(f"{k} {fmt(v)}" for k, v in results.items()
                      if "@" not in k or k.endswith("@50"))
    print(f"ooc.train: done in {total:.1f}s: {shown}  "
          f"peak RSS {rep['peak_rss_bytes'] / 2**20:.0f} MiB"
          + (f"  report {report_path}" if report_path else ""))
    if report_path:
        write_report(report_path, rep, command="ooc.train")
    return 0


def _checkpoint_to_resume(ckdir: str | None) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint in ``ckdir`` and its state (``--resume``)."""
    if ckdir is None:
        raise InvalidValue("--resume needs --checkpoint-dir DIR")
    from ooc.executor.training.checkpoint import latest_checkpoint, load_checkpoint

    ck_path = latest_checkpoint(ckdir)
    return ck_path, load_checkpoint(ck_path)


def _apply_sizes(sizes_path: str, dataset, given: dict, s: dict, config) -> None:
    """Cache sizes, superbatch size, read gap and mode from a size_caches report, where the
    command line leaves them out."""

    sizes = load_sizes(sizes_path, dataset)
    for key in ("feature_cache_size", "neighbor_cache_size", "superbatch_size", "read_gap"):
        if key not in given and sizes.get(key) is not None:
            s[key] = sizes[key]
    if "mode" not in given and sizes.get("mode"):
        s["mode"] = config.mode = sizes["mode"]


def _train(dataset, config, options, s: dict, ckdir, ck_path,
           after_epoch: Callable[[Any], None] | None = None):
    """Train in this process (resuming from ``ck_path``), checkpointing into ``ckdir`` and
    calling ``after_epoch(trainer)`` after each epoch; returns the closed trainer and the
    final metrics (node task: ``val_acc``, ``test_acc``; link task: ``val_auc``,
    ``test_auc``, ``test_mrr``, ``test_hits@K``, ...)."""
    trainer = TRAINERS[config.task]()(dataset, config, options=options)
    try:
        if ck_path is not None:
            trainer.resume(ck_path)
            print(f"ooc.train: resumed from {ck_path} (epoch {trainer.epoch})")
            if trainer.epoch >= config.epochs:
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
        last: dict | None = None  # the record of the last epoch this run trained
        while trainer.epoch < config.epochs:
            last = trainer.train_epoch()
            if ckdir is not None and (trainer.epoch % s["checkpoint_every"] == 0
                                      or trainer.epoch == config.epochs):
                trainer.save(ckdir, args=args)
            if after_epoch is not None:
                after_epoch(trainer)
        results = {} if s["no_eval"] else FINAL[config.task](trainer, last)
    finally:
        trainer.close()
    return trainer, results


def _node_results(trainer, last: dict | None) -> dict[str, Any]:
    """The final validation and test accuracies of a node classifier."""
    ds = trainer.dataset
    if last is not None and last["val_acc"] is not None:
        val_acc = last["val_acc"]  # these weights, evaluated with the fixed eval seed
    else:
        val_acc = trainer.evaluate(ds.val_idx)
    return {"val_acc": val_acc, "test_acc": trainer.evaluate(ds.test_idx)}


def _link_results(trainer, last: dict | None) -> dict[str, Any]:
    """The final link metrics on the dataset's link split (from layer-wise embeddings)."""
    if trainer.dataset.link_split is None:
        note(f"{trainer.dataset.path} has no link split (ooc.prepare --link-split): no "
             f"validation or test metrics")
    return trainer.link_metrics(("val", "test"))


def _link_trainer():
    from ooc.executor.training.link import LinkTrainer

    return LinkTrainer


def _node_trainer():
    from ooc.executor.training.trainer import Trainer

    return Trainer


#: The trainer of each ``--task`` (imported when asked for: torch loads late).
TRAINERS = {"node": _node_trainer, "link": _link_trainer}
#: The final metrics of each ``--task``.
FINAL = {"node": _node_results, "link": _link_results}


if __name__ == "__main__":
    sys.exit(main())
