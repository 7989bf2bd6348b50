"""The ``--workers``/``--partitions`` branch of ``python -m ooc.train``: parent or worker.

With ``Q > 1`` workers and no worker environment this process becomes the
parent: it resolves ``P``, partitions the dataset if needed and
:func:`~ooc.executor.distributed.launcher.launch` es ``Q`` copies of the
command. In a worker (started by the launcher or by torchrun), and with
``Q = 1``, it trains (:func:`~ooc.executor.distributed.worker.run_worker`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ooc.core.errors import InvalidValue
from ooc.executor.distributed.environment import dist_timeout_s, env_rank, env_world_size, in_worker
from ooc.executor.distributed.launcher import launch
from ooc.executor.distributed.partitions import ensure_partitions_locked, resolve_partitions
from ooc.executor.distributed.worker import WorkerRun, run_worker
from ooc.executor.training.checkpoint import check_checkpoint_dir, remove_checkpoints
from ooc.executor.training.trainer import check_labelled_training

if TYPE_CHECKING:
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.training.config import TrainConfig
    from ooc.storage.dataset import Dataset


def wants_averaging(s: dict[str, Any]) -> bool:
    """Whether ``python -m ooc.train`` with settings ``s`` runs the multi-worker path."""
    return s.get("workers") is not None or s.get("partitions") is not None or in_worker()


def run_cli(dataset: Dataset, config: TrainConfig, options: ModeOptions, s: dict[str, Any],
            argv: Sequence[str], ckdir: str | None, ck_path: Path | None,
            report_path: str | None, arg_keys: Sequence[str]) -> int:
    """Run the multi-worker path of ``python -m ooc.train``; its exit status.

    ``s``: the command's settings (``workers`` is filled in); ``argv``: the
    command line (the launcher repeats it for the workers); ``ckdir``,
    ``ck_path``: ``--checkpoint-dir`` and the checkpoint to resume (or None);
    ``arg_keys``: the settings a checkpoint records.
    """

    workers = _check_workers(s)
    check_labelled_training(dataset)  # partitions' trainers take an empty split each
    parts, alloc = resolve_partitions(dataset.path, workers, s.get("partitions"),
                                      options.memory_budget, s.get("compute_fraction"),
                                      dataset.num_nodes)
    halo = _halo_hops(s, config.num_layers)
    part_dir = _partition_dir(dataset.path, parts, halo, s)
    if env_rank() == 0:  # every check passed: the checkpoints --overwrite replaces go

        remove_checkpoints(check_checkpoint_dir(ckdir, ck_path is not None,
                                                bool(s.get("overwrite"))))
    if not in_worker() and workers > 1:
        print(f"ooc.train: {workers} workers, {parts} partitions ({alloc['rule']}), "
              f"averaging every {s['sync_every']} epoch(s); partitions in {part_dir}")
        return launch(list(argv) + ["--partitions", str(parts), "--partition-dir",
                                    str(part_dir)], workers)
    return run_worker(WorkerRun(dataset, config, options, s, part_dir, parts, alloc, list(argv),
                                ckdir, ck_path, report_path, list(arg_keys)))


def _check_workers(s: dict[str, Any]) -> int:
    """``--workers`` (default ``WORLD_SIZE`` in a worker, else 1), checked against the
    worker environment; also checks ``--sync-every`` and, with several workers,
    ``OOC_DIST_TIMEOUT``. Sets ``s["workers"]``."""
    env_world = env_world_size()
    workers = int(s["workers"]) if s.get("workers") is not None else (env_world or 1)
    if workers < 1:
        raise InvalidValue(f"--workers must be >= 1, got {workers}")
    if env_world is not None and env_world != workers:
        raise InvalidValue(f"--workers {workers} but WORLD_SIZE={env_world} (torchrun "
                       f"--nproc-per-node x nodes must equal --workers)")
    s["workers"] = workers
    if s.get("sync_every") is None or int(s["sync_every"]) < 1:
        raise InvalidValue(f"--sync-every must be >= 1, got {s.get('sync_every')}")
    if workers > 1:
        dist_timeout_s()  # a bad OOC_DIST_TIMEOUT: one line here, not one per worker
    return workers


def _halo_hops(s: dict[str, Any], num_layers: int) -> int:
    """``--halo-hops``, default the model's number of layers."""
    halo = int(s["halo_hops"]) if s.get("halo_hops") is not None else num_layers
    if halo < 1:
        raise InvalidValue(f"--halo-hops must be >= 1, got {halo}")
    return halo


def _partition_dir(data: Path, parts: int, halo: int, s: dict[str, Any]) -> Path:
    """The partition folder, made when missing by the first process to take its lock (the
    parent, or one worker per node under torchrun: it says so); the others reuse it."""
    return ensure_partitions_locked(data, parts, s.get("partition_dir"), dist_timeout_s(),
                                    s["seed"], halo_hops=halo,
                                    overwrite=bool(s.get("overwrite")),
                                    check_halo=s.get("halo_hops") is not None)
