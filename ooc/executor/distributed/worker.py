"""A worker process: join the group, train its partitions' local models, report.

Started by the launcher or by torchrun (or run in the command's own process
with ``--workers 1``): rank ``R`` of ``Q`` trains the partitions
``j mod Q == R`` with an :class:`~ooc.executor.distributed.averaging_trainer.AveragingTrainer`,
checkpoints after a sync every ``--checkpoint-every`` epochs (rank 0), and rank
0 prints the summary and writes the report.

Before training, the workers of a group check that they read the same data: each
sends the digest of its dataset and of its partition folder
(:func:`~ooc.executor.distributed.partitions.dataset_digest`,
:func:`~ooc.executor.distributed.partitions.partition_set_fingerprint`; on several
nodes each reads its own copy) and every worker refuses a difference in one line
naming the two workers (rank, node, host) and their folders.

A collective that fails because a peer vanished ends the worker with
:data:`~ooc.executor.distributed.comm.PEER_LOST_RC`, naming the workers that are
gone (:meth:`~ooc.executor.distributed.comm.Comm.gone`) with their node and host
when they ran on another node: ``ooc: worker rank 1 (node 1, host H, pid P)
failed: gone ...; worker rank 0 (node 0, ...) lost it: all_reduce failed ...``.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ooc.cli import write_report
from ooc.core.errors import InvalidValue, OocError
from ooc.core.memory import peak_rss_bytes
from ooc.executor.distributed.averaging_trainer import AveragingTrainer, format_acc
from ooc.executor.distributed.comm import PEER_LOST_RC, Comm, PeerLost
from ooc.executor.distributed.environment import describe, env_rank, identity, threads_per_worker
from ooc.executor.distributed.heartbeat import Heartbeat
from ooc.executor.distributed.liveness import SETTLE_S
from ooc.executor.distributed.partitions import dataset_digest, partition_set_fingerprint

if TYPE_CHECKING:
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.training.config import TrainConfig
    from ooc.storage.dataset import Dataset


@dataclass
class WorkerRun:
    """What a worker takes from ``python -m ooc.train``.

    ``settings``: the command's resolved settings (``workers``, ``sync_every``,
    ``checkpoint_every``, ``optimizer_sync``, ...); ``arg_keys``: the settings
    saved in checkpoints; ``allocation``: how ``parts`` was chosen.
    """

    dataset: Dataset
    config: TrainConfig
    options: ModeOptions
    settings: dict[str, Any]
    part_dir: Path
    parts: int
    allocation: dict[str, Any]
    argv: list[str]
    checkpoint_dir: str | None
    resume_from: Path | None
    report_path: str | None
    arg_keys: list[str]

    @property
    def workers(self) -> int:
        return int(self.settings["workers"])

    @property
    def sync_every(self) -> int:
        return int(self.settings["sync_every"])

    def checkpoint_args(self) -> dict[str, Any]:
        """The settings a checkpoint records (``--resume`` reads them back)."""
        args = {k: self.settings.get(k) for k in self.arg_keys}
        args["partitions"], args["partition_dir"] = self.parts, str(self.part_dir)
        return args


def run_worker(run: WorkerRun) -> int:
    """Rank ``RANK`` of the run (0 of 1 outside a worker); 0 when done, or
    :data:`PEER_LOST_RC` when a collective lost a peer."""
    rank, world = env_rank(), run.workers
    _configure_process(run, rank)
    t0 = time.perf_counter()
    heartbeat = Heartbeat.from_env(rank) if world > 1 else None
    comm, trainer, peers = Comm(), None, [identity()]
    try:
        if world > 1:
            comm = Comm.from_env(heartbeat)
            peers = check_same_data(comm, run)
        trainer = _open_trainer(run, comm, heartbeat)
        _train(trainer, run)
        peak = comm.all_reduce_max(torch.tensor([float(peak_rss_bytes())], dtype=torch.float64))
        total_s = time.perf_counter() - t0
        train_nodes = trainer.gather_train_nodes()
        if rank == 0:
            rep = _report(run, trainer, train_nodes, int(peak[0]), total_s)
            _print_summary(rep, run.report_path)
            if run.report_path:
                _write_report(run.report_path, rep)
        return 0
    except OocError as e:
        if world > 1:  # the same class, its message naming the rank
            e.args = (f"worker rank {rank}: {e}",)
        raise
    except PeerLost as e:
        print(peer_lost_message(e, comm, peers), file=sys.stderr, flush=True)
        return PEER_LOST_RC
    finally:
        if trainer is not None:
            trainer.close()
        comm.close()
        if heartbeat is not None:
            heartbeat.close()


def check_same_data(comm: Comm, run: WorkerRun) -> list[dict[str, Any]]:
    """Every worker's identity (:func:`~.environment.identity`) with the digests of the
    dataset and the partitions it opened; :class:`InvalidValue` when two differ."""
    me = dict(identity(), data=dataset_digest(run.dataset.meta), data_path=str(run.dataset.path),
              parts=partition_set_fingerprint(run.part_dir, run.parts),
              part_dir=str(run.part_dir))
    peers = comm.all_gather_object(me)
    multi = _multi_node(peers)
    for key, path, what, fix in (
            ("data", "data_path", "datasets", "give every node a copy of the same dataset"),
            ("parts", "part_dir", "partitions", "copy one node's partition folder to the "
             "others, or give every node one shared --partition-dir")):
        other = next((p for p in peers if p[key] != peers[0][key]), None)
        if other is not None:
            a, b = peers[0], other
            raise InvalidValue(f"the {what} differ between workers: {describe(a, multi)} reads "
                               f"{a[path]} [{a[key]}], {describe(b, multi)} reads {b[path]} "
                               f"[{b[key]}]; {fix}")
    return peers


def peer_lost_message(e: PeerLost, comm: Comm, peers: list[dict[str, Any]]) -> str:
    """The line of a worker whose collective failed: the workers that are gone, named with
    their node when it is not this one's, else (none found) this worker and the error."""
    me = next((p for p in peers if p["rank"] == comm.rank), identity())
    gone, why = comm.gone(), f"its beats in the group's store stopped for {SETTLE_S:g}s"
    if gone is None and comm.world_size == 2:  # the store's host is gone too: the other one
        gone, why = [1 - comm.rank], "the group's store is gone with it"
    by_rank = {p["rank"]: p for p in peers}
    named = [describe(by_rank[r], _other_node(by_rank[r], me)) if r in by_rank
             else f"worker rank {r}" for r in gone or []]
    self_name = describe(me, _multi_node(peers))
    if not named:
        return f"ooc: {self_name}: {e}"
    return f"ooc: {', '.join(named)} failed: gone ({why}); {self_name} lost it: {e}"


def _multi_node(peers: list[dict[str, Any]]) -> bool:
    return len({(p["node"], p["host"]) for p in peers}) > 1


def _other_node(p: dict[str, Any], me: dict[str, Any]) -> bool:
    return (p["node"], p["host"]) != (me["node"], me["host"])


def _configure_process(run: WorkerRun, rank: int) -> None:
    """An even share of the cores per worker (unless ``--threads``); progress bars on
    rank 0 only."""
    config = run.config
    if run.workers > 1 and config.num_threads is None:
        config.num_threads = threads_per_worker(run.workers)
        torch.set_num_threads(config.num_threads)
    if rank != 0:
        config.progress = False


def _quiet(message: str) -> None:
    """The log of ranks other than 0."""


def _open_trainer(run: WorkerRun, comm: Comm, heartbeat: Heartbeat | None) -> AveragingTrainer:
    """This worker's AveragingTrainer, resumed from ``run.resume_from`` if given."""
    log: Callable[[str], None] = print if comm.rank == 0 else _quiet
    s = run.settings
    trainer = AveragingTrainer(run.dataset, run.part_dir, run.parts, run.config, run.options,
                               comm, sync_every=run.sync_every, log=log,
                               optimizer_sync=s.get("optimizer_sync") or "average",
                               heartbeat=heartbeat)
    if run.resume_from is not None:
        trainer.resume(run.resume_from)
        log(f"ooc.train: resumed from {run.resume_from} (epoch {trainer.epoch})")
    log(f"ooc.train: worker {comm.rank}/{comm.world_size}: partitions {trainer.mine} of "
        f"{run.parts} ({', '.join(str(lm.n_train) for lm in trainer.local)} training nodes); "
        f"model {run.config.model} {trainer.model.dims}, mode {run.config.mode}")
    return trainer


def _train(trainer: AveragingTrainer, run: WorkerRun) -> None:
    """Epochs up to ``--epochs``; a checkpoint after a sync every ``--checkpoint-every``
    epochs and after the last."""
    epochs, every = run.config.epochs, int(run.settings["checkpoint_every"])
    args = run.checkpoint_args()
    while trainer.epoch < epochs:
        rec = trainer.train_epoch()
        due = trainer.epoch % every == 0 or trainer.epoch == epochs
        if run.checkpoint_dir is not None and rec["synced"] and due:
            trainer.save(run.checkpoint_dir, args)


def _report(run: WorkerRun, trainer: AveragingTrainer, train_nodes: list[int],
            peak_max: int, total_s: float) -> dict[str, Any]:
    """Rank 0's report of the run (``--report``)."""
    ds, config = run.dataset, run.config
    last: dict[str, Any] = next(
        (r for r in reversed(trainer.history) if r.get("val_acc") is not None), {})
    return {
        "mode": config.mode, "workers": run.workers, "partitions": run.parts,
        "sync_every": run.sync_every, "assignment": trainer.assignment,
        "partition_dir": str(run.part_dir), "allocation": run.allocation,
        "optimizer_at_sync": trainer.optimizer_sync, "train_nodes": train_nodes,
        "dataset": {"path": str(ds.path), "num_nodes": ds.num_nodes,
                    "num_edges": ds.num_edges, "train": int(len(ds.train_idx)),
                    "val": int(len(ds.val_idx)), "test": int(len(ds.test_idx))},
        "model": dict(trainer.model.config), "config": asdict(config),
        "val_acc": last.get("val_acc"), "test_acc": last.get("test_acc"),
        "epochs": trainer.history, "total_time_s": round(total_s, 3),
        "peak_rss_bytes_max_worker": peak_max, "peak_rss_bytes": peak_rss_bytes(),
        "resumed_from": str(run.resume_from) if run.resume_from else None,
        "checkpoint_dir": run.checkpoint_dir, "argv": list(run.argv),
    }


def _print_summary(rep: dict[str, Any], report_path: str | None) -> None:
    print(f"ooc.train: done in {rep['total_time_s']:.1f}s: val_acc {format_acc(rep['val_acc'])}  "
          f"test_acc {format_acc(rep['test_acc'])}  peak RSS (max worker) "
          f"{rep['peak_rss_bytes_max_worker'] / 2**20:.0f} MiB"
          + (f"  report {report_path}" if report_path else ""))


def _write_report(path: str, rep: dict[str, Any]) -> None:
    write_report(path, rep, command="ooc.train")
