"""Multi-process training by model averaging (SDT-GNN §III-C/D; DESIGN.md §6).

``python -m ooc.train --workers Q [--partitions P] [--sync-every K]``:

* **Launch** (:mod:`.cli`, :mod:`.launcher`, :mod:`.environment`). With
  ``Q > 1`` and no worker environment, the command becomes a *parent*: it
  resolves ``P`` (workload allocation, then SPRING partitioning when the
  partition datasets do not exist yet, :mod:`.partitions`), picks a free
  loopback port and starts ``Q`` copies of itself with ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``. Under
  ``torchrun`` (those variables already set) the same command is the worker
  directly, on one machine or several (``torchrun --nnodes N``): every process
  that needs the partition folder takes its lock in turn and the first makes it
  when missing (:func:`.partitions.ensure_partitions_locked`: once in a folder
  the nodes share, once per node in a folder of each node's own), and the
  workers refuse to train when their datasets or partitions differ
  (:func:`.worker.check_same_data`). Workers join a gloo process group (:mod:`.comm`,
  ``init_method="env://"``, timeout ``OOC_DIST_TIMEOUT`` seconds, default
  1800). ``Q = 1`` runs in this process with no process group: the same math.
* **Work** (:mod:`.worker`, :mod:`.averaging_trainer`, :mod:`.local_model`).
  Partition ``j`` belongs to worker ``j mod Q``. A worker trains one local
  model per partition (a :class:`~ooc.executor.training.trainer.Trainer` on
  the partition dataset with the chosen ``--mode`` and its own
  ``--memory-budget``), one after the other. All local models start from the
  same initial weights (the Trainer seeds torch with ``--seed``).
* **Sync** (:mod:`.averaging`). After every ``K`` epochs (and after the
  last), every worker computes ``sum_{j mine} n_j w_j`` (float64, ``n_j`` the
  partition's training nodes); one ``all_reduce`` sums the partial sums,
  another the weights, and every local model loads the quotient. With
  ``--optimizer-sync average`` (default) the local Adam states are averaged
  the same way in the same ``all_reduce`` and loaded too; ``reset`` restarts
  every local Adam from zero (federated-averaging clients). Either way, after
  a sync the whole training state is the averaged model (and optimizer
  state) and the epoch, so a checkpoint of rank 0 resumes exactly, with any
  number of workers.
* **Evaluation** after each sync: each worker evaluates the averaged model on
  the validation and test nodes its partitions own (every node is owned by
  one partition, so these are the global splits); correct/total are summed
  with ``all_reduce``. Partitions made here hold an ``L``-hop halo
  (``--halo-hops``, default the number of layers): every owned node's
  in-neighbourhood up to ``L`` hops is in its partition, so sampled
  neighbourhoods in training and evaluation are those of the whole graph.
  With ``--halo-hops 1`` (SDT-GNN's full in-neighbour lists only) the second
  hop is cut at partition borders, which costs validation accuracy in
  evaluation (``python -m bench averaging``).
* **Memory.** With ``--memory-budget`` and several partitions per worker,
  only one local pipeline is open at a time: the others are kept as their
  model and optimizer states and reopened when their turn comes.
* **Failures** (:mod:`.launcher`, :mod:`.heartbeat`). The parent watches its
  children: the first one to exit non-zero is reported as
  ``ooc: worker rank R failed: <reason>`` (its exit status and last message),
  the others are terminated and the parent exits 1. It also reads their
  heartbeats: a worker that is stopped, frozen or hung (no heartbeat, or no
  progress outside a collective, for ``OOC_HEARTBEAT_TIMEOUT`` seconds,
  default 120) is killed and named the same way, within that time plus one
  poll (at most 1 s) and ``TERMINATE_GRACE_S`` to stop the others; the
  workers waiting for it in a collective are not blamed. A worker whose peer
  vanishes fails its collective (gloo reports the closed connection at once,
  or after the timeout) and exits 75 naming its rank; the parent treats that
  as a consequence and names the worker that caused it when one exits with
  another status within a few seconds. Under torchrun, torchrun's agent stops
  the group; a worker that loses a peer names the workers that are gone
  (:mod:`.liveness`: their beats in the group's store stopped), with their node,
  host and pid when they ran on another node.
* **Checkpoints** come from rank 0 only, after a sync, atomically
  (:func:`~ooc.executor.training.checkpoint.save_checkpoint`): the averaged
  model, the epoch, the history and the run's settings (``--resume``
  continues).
"""
from ooc.executor.distributed.averaging_trainer import AveragingTrainer
from ooc.executor.distributed.cli import run_cli, wants_averaging
from ooc.executor.distributed.launcher import launch
from ooc.executor.distributed.partitions import (
                                                 ensure_partitions,
                                                 ensure_partitions_locked,
                                                 resolve_partitions,
)
from ooc.executor.distributed.worker import WorkerRun, run_worker

__all__ = ["AveragingTrainer", "WorkerRun", "ensure_partitions", "ensure_partitions_locked",
           "launch", "resolve_partitions", "run_cli", "run_worker", "wants_averaging"]
