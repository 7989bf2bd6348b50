"""Multi-worker training with model averaging (SDT-GNN §III-C/D; DESIGN.md §6).

``python -m ooc.train --workers Q [--partitions P] [--sync-every K]``:

* **Launch.** With ``Q > 1`` and no ``RANK`` in the environment, the command
  becomes a *parent*: it resolves ``P`` (workload allocation, then SPRING
  partitioning when the partition datasets do not exist yet), picks a free
  loopback port and starts ``Q`` copies of itself with ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``. Under
  ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` already set) the same
  code is the worker directly. Workers join a gloo process group
  (``init_method="env://"``, timeout ``OOC_DIST_TIMEOUT`` seconds, default
  1800). ``Q = 1`` runs in this process with no process group: the same math.
* **Work.** Partition ``j`` belongs to worker ``j mod Q``. A worker trains one
  local model per partition (a :class:`~ooc.executor.training.trainer.Trainer` on the
  partition dataset with the chosen ``--mode`` and its own
  ``--memory-budget``), one after the other. All local models start from the
  same initial weights (the Trainer seeds torch with ``--seed``).
* **Sync.** After every ``K`` epochs (and after the last), every worker
  computes ``sum_{j mine} n_j w_j`` (float64, ``n_j`` the partition's
  training nodes); one ``all_reduce`` sums the partial sums, another the
  weights, and every local model loads the quotient. With
  ``--optimizer-sync average`` (default) the local Adam states are averaged
  the same way in the same ``all_reduce`` and loaded too; ``reset`` restarts
  every local Adam from zero (federated-averaging clients). Either way, after
  a sync the whole training state is the averaged model (and optimizer
  state) and the epoch, so a checkpoint of rank 0 resumes exactly, with any
  number of workers.
* **Evaluation** after each sync: each worker evaluates the averaged model on
  the validation and test nodes its partitions own (every node is owned by one
  partition, so these are the global splits); correct/total are summed with
  ``all_reduce``. Partitions made here hold an ``L``-hop halo (``--halo-hops``,
  default the number of layers): every owned node's in-neighbourhood up to
  ``L`` hops is in its partition, so sampled neighbourhoods in training and
  evaluation are those of the whole graph. With ``--halo-hops 1`` (SDT-GNN's
  full in-neighbour lists only) the second hop is cut at partition borders;
  measured on the 20K-node synthetic graph of ``tools/bench_averaging.py``
  that cost ~2 points of validation accuracy in evaluation alone.
* **Memory.** With ``--memory-budget`` and several partitions per worker, only
  one local pipeline is open at a time: the others are kept as their model and
  optimizer states and reopened when their turn comes.
* **Failures.** The parent watches its children: the first one to exit
  non-zero is reported as ``ooc: worker rank R failed: <reason>`` (its exit
  status and last message), the others are terminated and the parent exits 1.
  It also reads their heartbeats (:mod:`ooc.executor.distributed.heartbeat`): a worker
  that is stopped, frozen or hung (no heartbeat, or no progress outside a
  collective, for ``OOC_HEARTBEAT_TIMEOUT`` seconds, default 120) is killed
  and named the same way, within that time plus one poll (at most 1 s) and
  :data:`TERMINATE_GRACE_S` to stop the others; the workers waiting for it
  in a collective are not blamed.
  A worker whose peer vanishes fails its collective (gloo reports the closed
  connection at once, or after the timeout) and exits 75 naming its rank; the
  parent treats that as a consequence and names the worker that caused it
  when one exits with another status within a few seconds. Under torchrun,
  torchrun's agent stops the group; every worker's message names its rank.
* **Checkpoints** come from rank 0 only, after a sync, atomically
  (:func:`~ooc.executor.training.checkpoint.save_checkpoint`): the averaged model, the
  epoch, the history and the run's settings (``--resume`` continues).

Test hook: ``OOC_FAIL_AT=R:E[:how]`` makes rank ``R`` fail right after training
epoch ``E`` (``how``: exit, raise, kill, stop, hang; see :func:`_maybe_fail`).
"""
from __future__ import annotations

import contextlib
import copy
import datetime
import gc
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ...storage.atomic import write_json
from ...storage.errors import OocError
from . import heartbeat as HB
from .heartbeat import Heartbeat, HeartbeatMonitor
from .averaging import (DEFAULT_COMPUTE_FRACTION, allocate_partitions, assign_partitions,
                        dataset_bytes, finish_average, flatten, optimizer_entries,
                        optimizer_state, unflatten, weighted_sum, zeros_like_state)

#: ``--optimizer-sync`` choices: what happens to the local Adam states at a sync.
OPTIMIZER_SYNC = ("average", "reset")

ENV_FAIL = "OOC_FAIL_AT"
ENV_TIMEOUT = "OOC_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
#: Seconds the parent waits for the other workers to stop after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0
#: Exit status of a worker whose collective failed because a peer vanished or timed out
#: (a consequence, not the cause: the parent then waits a moment for the cause to exit).
PEER_LOST_RC = 75
#: Seconds the parent waits for the failing worker after a peer-lost exit.
CAUSE_WAIT_S = 10.0


class PeerLost(RuntimeError):
    """A collective failed: another worker died, or did not answer within the timeout."""


# -- process group -----------------------------------------------------------------------
def torchrun_env() -> bool:
    """Whether this process was started as a worker (by our parent or by torchrun)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def dist_timeout_s() -> float:
    v = os.environ.get(ENV_TIMEOUT)
    try:
        return float(v) if v else DEFAULT_TIMEOUT_S
    except ValueError:
        raise OocError(f"{ENV_TIMEOUT}={v!r}: expected seconds") from None


class Comm:
    """Rank, world size and sum-reductions; a no-op group of one without torch.distributed."""

    def __init__(self, rank: int = 0, world_size: int = 1, initialized: bool = False):
        self.rank, self.world_size, self.initialized = rank, world_size, initialized
        #: marks the time spent in collectives for the launcher (None: not watched)
        self.heartbeat: Heartbeat | None = None

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> "Comm":
        """Join the gloo group described by ``RANK``/``WORLD_SIZE``/``MASTER_*`` (env://)."""
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world == 1:
            return cls(0, 1, False)
        t = dist_timeout_s() if timeout_s is None else timeout_s
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=t))
        return cls(rank, world, True)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(t, "SUM")

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(t, "MAX")

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        if self.initialized:
            import torch.distributed as dist

            try:
                with (self.heartbeat.collective() if self.heartbeat is not None
                      else contextlib.nullcontext()):
                    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            except RuntimeError as e:  # gloo: connection closed, or the timeout
                msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise PeerLost(f"all_reduce failed, another worker died or timed out "
                               f"({msg[:240]})") from None
        return t

    def close(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
            self.initialized = False


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- partitions ----------------------------------------------------------------------------
def default_partition_dir(data: str | os.PathLike, parts: int, halo_hops: int = 1) -> Path:
    """``<data>.partitions/spring_p<P>`` (``spring_p<P>_h<H>`` for an ``H``-hop halo) beside
    the dataset (the partitioner refuses to write inside the dataset folder)."""
    d = Path(data).resolve()
    name = f"spring_p{int(parts)}" + (f"_h{int(halo_hops)}" if int(halo_hops) != 1 else "")
    return d.parent / f"{d.name}.partitions" / name


def resolve_partitions(data: str | os.PathLike, workers: int, parts: int | None,
                       memory_budget: int | None, compute_fraction: float | None
                       ) -> tuple[int, dict[str, Any]]:
    """``P`` and how it was chosen (the allocation rule when ``parts`` is None)."""
    s = dataset_bytes(data)
    frac = DEFAULT_COMPUTE_FRACTION if compute_fraction is None else float(compute_fraction)
    info: dict[str, Any] = {"data_bytes": s, "memory_budget": memory_budget,
                            "compute_fraction": frac, "workers": workers}
    if parts is not None:
        if int(parts) < 1:
            raise OocError(f"--partitions must be >= 1, got {parts}")
        info["rule"] = "given"
        return int(parts), info
    p = allocate_partitions(s, workers, memory_budget, compute_fraction=frac)
    info["rule"] = ("p = q (no --memory-budget)" if memory_budget is None else
                    "p = q (S <= q(M - T))" if p == workers else "p = ceil(S / (M - T))")
    return p, info


def ensure_partitions(data: str | os.PathLike, parts: int, part_dir: str | os.PathLike | None,
                      seed: int = 0, log: Callable[[str], None] = print,
                      halo_hops: int = 1) -> Path:
    """The partition folder for ``parts`` partitions; partitioned with SPRING if missing.

    ``halo_hops``: hops of in-neighbourhood each partition holds for its owned
    nodes (1: SDT-GNN's full in-neighbour lists; the number of layers: every
    owned node's sampled neighbourhood is the one of the whole graph). An
    existing folder is used as it is.
    """
    out = Path(part_dir) if part_dir else default_partition_dir(data, parts, halo_hops)
    meta = out / "partition.json"
    if meta.is_file():
        import json

        p = json.loads(meta.read_text()).get("p")
        if p != parts:
            raise OocError(f"{out}: holds {p} partitions, not --partitions {parts}")
        return out
    if out.exists():
        raise OocError(f"{out}: exists but has no partition.json (not a partition folder)")
    from ...partition import partition_dataset

    t0 = time.perf_counter()
    log(f"ooc.train: partitioning {data} into {parts} parts with SPRING -> {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    rep = partition_dataset(data, out, parts, "spring", seed=seed, halo_hops=halo_hops)
    log(f"ooc.train: partitioned in {time.perf_counter() - t0:.1f}s (edge cut "
        f"{rep['edge_cut_ratio']:.3f}, replication {rep['replication_factor']:.2f}, with "
        f"the {halo_hops}-hop halo {rep.get('halo_replication_factor', 0):.2f})")
    return out


def wait_for_partitions(part_dir: Path, timeout_s: float) -> None:
    """Wait until rank 0 has written ``part_dir`` (torchrun: rank 0 partitions)."""
    t_end = time.monotonic() + timeout_s
    while not (part_dir / "partition.json").is_file():
        if time.monotonic() > t_end:
            raise OocError(f"{part_dir}: rank 0 did not write the partitions within "
                           f"{timeout_s:.0f}s")
        time.sleep(0.5)


# -- local models --------------------------------------------------------------------------
class LocalModel:
    """One partition's local model: a Trainer while resident, its states while not."""

    def __init__(self, part: int, path: Path, config, options, log, resident_ok: bool,
                 heartbeat: Heartbeat | None = None):
        from ...storage import open_dataset

        self.heartbeat = heartbeat

        self.part, self.path = part, path
        self.dataset = open_dataset(path)
        self.n_train = int(len(self.dataset.train_idx))
        self.config, self.options, self.log = config, options, log
        self.trainer = None
        self.saved: dict[str, Any] | None = None  # model/optimizer state when not resident
        self.epoch = 0
        self.last: dict[str, Any] | None = None
        self.keep = resident_ok

    def open(self):
        """The Trainer (built, and its states restored, if it was swapped out)."""
        from ..training.trainer import Trainer

        if self.trainer is None:
            if self.heartbeat is not None:
                self.heartbeat.setup()
            opts = copy.copy(self.options)
            if opts.runtime_dir:
                opts.runtime_dir = str(Path(opts.runtime_dir) / f"part_{self.part:03d}")
            t = Trainer(self.dataset, self.config, options=opts, allow_empty_train=True,
                        log=lambda m, p=self.part: self.log(f"  part {p}: {m}"))
            if self.saved is not None:
                t.model.load_state_dict(self.saved["model"])
                t.optimizer.load_state_dict(self.saved["optimizer"])
                self.saved = None
            t.epoch = self.epoch
            if self.heartbeat is not None:
                t.on_batch = self.heartbeat.beat
            self.trainer = t
        return self.trainer

    def release(self) -> None:
        """Close the pipeline, keeping model and optimizer states (``--memory-budget``)."""
        if self.trainer is None or self.keep:
            return
        t = self.trainer
        self.saved = {"model": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
                      "optimizer": copy.deepcopy(t.optimizer.state_dict())}
        t.close()
        self.trainer = None
        gc.collect()

    def state(self) -> dict[str, torch.Tensor]:
        return self.trainer.model.state_dict() if self.trainer is not None else self.saved["model"]

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The local optimizer's ``state_dict()`` (resident or saved)."""
        if self.trainer is not None:
            return self.trainer.optimizer.state_dict()
        return self.saved["optimizer"]

    def load_average(self, avg: dict[str, torch.Tensor],
                     opt_state: dict[int, dict[str, torch.Tensor]] | None = None) -> None:
        """Continue from the averaged weights and optimizer state (None: a fresh optimizer)."""
        state = {} if opt_state is None else \
            {i: {k: v.clone() for k, v in st.items()} for i, st in opt_state.items()}
        if self.trainer is not None:
            self.trainer.model.load_state_dict(avg)
            opt = self.trainer.optimizer
            opt.load_state_dict({"state": state,
                                 "param_groups": opt.state_dict()["param_groups"]})
        else:
            self.saved["model"] = {k: v.clone() for k, v in avg.items()}
            self.saved["optimizer"]["state"] = state

    def train_epoch(self) -> dict[str, Any] | None:
        t = self.open()
        if self.n_train == 0:
            t.epoch += 1
            self.epoch = t.epoch
            return None
        rec = t.train_epoch()
        self.epoch = t.epoch
        self.last = rec
        return rec

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None


class AveragingTrainer:
    """One worker's share of a multi-worker run (``comm.world_size`` workers, ``parts`` total).

    Args:
        data: the full dataset (opened), for the model's shapes and the report.
        part_dir: the partition folder (``part_000/`` ...).
        parts: ``P``.
        config: the run's :class:`~ooc.executor.training.trainer.TrainConfig` (its
            evaluation settings are ignored: evaluation follows each sync).
        options: :class:`~ooc.executor.loader.stack.ModeOptions` of every local pipeline.
        comm: the process group (:class:`Comm`).
        sync_every: ``K``.
        optimizer_sync: ``"average"`` (the local Adam states are averaged
            like the weights) or ``"reset"`` (every local Adam restarts).
        heartbeat: this worker's :class:`~ooc.executor.distributed.heartbeat.Heartbeat`
            (beats after every batch), or None.
    """

    def __init__(self, data, part_dir: Path, parts: int, config, options, comm: Comm,
                 sync_every: int = 1, log: Callable[[str], None] = print,
                 optimizer_sync: str = "average", heartbeat: Heartbeat | None = None):
        from ..training.models import build_model

        if sync_every < 1:
            raise OocError(f"--sync-every must be >= 1, got {sync_every}")
        if optimizer_sync not in OPTIMIZER_SYNC:
            raise OocError(f"--optimizer-sync must be one of {', '.join(OPTIMIZER_SYNC)}, "
                           f"got {optimizer_sync!r}")
        self.optimizer_sync = optimizer_sync
        #: the averaged optimizer state after the last sync (``average`` only)
        self.opt_state: dict[int, dict[str, torch.Tensor]] | None = None
        self.data, self.part_dir, self.parts = data, Path(part_dir), int(parts)
        self.comm, self.sync_every, self.log = comm, int(sync_every), log
        self.config = copy.copy(config)
        self.config.eval_every = 10**9
        self.config.eval_final = False
        self.eval = bool(getattr(config, "eval_final", True))
        self.assignment = assign_partitions(self.parts, comm.world_size)
        self.mine = self.assignment[comm.rank]
        resident_ok = options.memory_budget is None or len(self.mine) <= 1
        self.local = [LocalModel(j, self.part_dir / f"part_{j:03d}", self.config, options,
                                 log, resident_ok, heartbeat) for j in self.mine]
        for lm in self.local:
            if lm.dataset.feature_dim != data.feature_dim or \
                    lm.dataset.num_classes != data.num_classes:
                raise OocError(f"{lm.path}: partition does not match {data.path} (features "
                               f"{lm.dataset.feature_dim} vs {data.feature_dim}, classes "
                               f"{lm.dataset.num_classes} vs {data.num_classes})")
        torch.manual_seed(config.seed)  # the same initial weights as every local Trainer
        self.model = build_model(config.model, data.feature_dim, config.hidden, data.num_classes,
                                 config.num_layers, dropout=config.dropout, heads=config.heads)
        self.epoch = 0
        self.history: list[dict[str, Any]] = []

    # -- one epoch ------------------------------------------------------------------------
    def train_epoch(self) -> dict[str, Any]:
        """Train every local model one epoch; average after every ``K``; evaluate after a sync."""
        epoch = self.epoch + 1
        t0 = time.perf_counter()
        loss_sum = correct = count = 0.0
        for i, lm in enumerate(self.local):
            rec = lm.train_epoch()
            if rec is not None:
                loss_sum += rec["loss"] * lm.n_train
                correct += rec["train_acc"] * lm.n_train
                count += lm.n_train
            if i < len(self.local) - 1:
                lm.release()
        _maybe_fail(self.comm.rank, epoch)
        train_s = time.perf_counter() - t0
        stats = self.comm.all_reduce_sum(torch.tensor([loss_sum, correct, count],
                                                      dtype=torch.float64))
        synced = epoch % self.sync_every == 0 or epoch == self.config.epochs
        sync_s = 0.0
        if synced:
            t1 = time.perf_counter()
            self.sync()
            sync_s = time.perf_counter() - t1
        epoch_s = time.perf_counter() - t0
        rec: dict[str, Any] = {
            "epoch": epoch, "loss": float(stats[0] / max(stats[2], 1)),
            "train_acc": float(stats[1] / max(stats[2], 1)), "synced": synced,
            "time_s": round(epoch_s, 6), "train_time_s": round(train_s, 6),
            "sync_time_s": round(sync_s, 6), "val_acc": None, "test_acc": None,
        }
        if synced and self.eval:
            t2 = time.perf_counter()
            rec["val_acc"], rec["test_acc"] = self.evaluate()
            rec["eval_time_s"] = round(time.perf_counter() - t2, 6)
        self.epoch = epoch
        self.history.append(rec)
        if self.comm.rank == 0:
            fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
            self.log(f"epoch {epoch:>3}/{self.config.epochs}  loss {rec['loss']:.4f}  "
                     f"train_acc {rec['train_acc']:.4f}"
                     + (f"  val_acc {fmt(rec['val_acc'])}  test_acc {fmt(rec['test_acc'])}"
                        if synced and self.eval else "")
                     + f"  {epoch_s:.2f}s (train {train_s:.2f} sync {sync_s:.3f})"
                     + ("  [averaged]" if synced else ""))
        return rec

    def sync(self) -> None:
        """Weighted averaging over all ``P`` local models (and their Adam states)."""
        model_like = self.model.state_dict()
        params = list(self.model.parameters())
        with_opt = self.optimizer_sync == "average"

        def full(state, opt):  # weights + optimizer entries: one flat all_reduce
            return {**state, **optimizer_entries(opt, params)} if with_opt else state

        like = full(model_like, {})
        keys = [k for k, v in like.items() if v.is_floating_point()]
        if self.local:
            part = weighted_sum([full(lm.state(), lm.optimizer_state_dict()["state"])
                                 for lm in self.local], [lm.n_train for lm in self.local])
        else:
            part = zeros_like_state(like)
        flat = self.comm.all_reduce_sum(flatten(part, keys))
        weight = self.comm.all_reduce_sum(torch.tensor([float(sum(lm.n_train
                                                                  for lm in self.local))],
                                                       dtype=torch.float64))
        avg = finish_average(unflatten(flat, like, keys), float(weight[0]), like)
        avg_model = {k: avg[k] for k in model_like}
        self.opt_state = optimizer_state(avg, len(params)) if with_opt else None
        self.model.load_state_dict(avg_model)
        for lm in self.local:
            lm.load_average(avg_model, self.opt_state)

    def evaluate(self) -> tuple[float | None, float | None]:
        """Global validation and test accuracy of the averaged model (counts summed)."""
        counts = torch.zeros(4, dtype=torch.float64)
        for lm in reversed(self.local):  # the resident one first
            t = lm.open()
            counts[0:2] += torch.tensor(t.evaluate_counts(lm.dataset.val_idx), dtype=torch.float64)
            counts[2:4] += torch.tensor(t.evaluate_counts(lm.dataset.test_idx),
                                        dtype=torch.float64)
            if lm is not self.local[0]:
                lm.release()
        self.comm.all_reduce_sum(counts)
        acc = lambda c, n: float(c / n) if n > 0 else None  # noqa: E731
        return acc(counts[0], counts[1]), acc(counts[2], counts[3])

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, checkpoint_dir: str | os.PathLike, args: dict[str, Any]) -> Path | None:
        """Rank 0 writes the averaged model (call right after a sync)."""
        if self.comm.rank != 0:
            return None
        from ..training.checkpoint import save_checkpoint

        opt = None
        if self.opt_state is not None:
            opt = {"state": self.opt_state,
                   "param_groups": self.local[0].optimizer_state_dict()["param_groups"]}
        return save_checkpoint(checkpoint_dir, self.epoch, self.model, opt, args=args,
                               history=self.history,
                               extra={"config": asdict(self.config),
                                      "dataset": str(self.data.path),
                                      "num_nodes": self.data.num_nodes,
                                      "averaging": {"partitions": self.parts,
                                                    "partition_dir": str(self.part_dir),
                                                    "workers": self.comm.world_size,
                                                    "sync_every": self.sync_every,
                                                    "optimizer_sync": self.optimizer_sync}},
                               dataset=self.data)

    def resume(self, path: str | os.PathLike) -> dict[str, Any]:
        """Continue from a checkpoint of a sync: every local model loads its weights."""
        from ..training.checkpoint import check_dataset, load_checkpoint, model_from_checkpoint

        state = load_checkpoint(path)
        check_dataset(state, self.data, path)
        if dict(state["model_config"]) != dict(self.model.config):
            raise OocError(f"{path}: checkpoint is for a different model or dataset")
        av = (state.get("extra") or {}).get("averaging")
        if av is None:
            raise OocError(f"{path}: not a checkpoint of a multi-worker run (no averaging "
                           f"entry); resume it without --workers/--partitions")
        if int(av["partitions"]) != self.parts:
            raise OocError(f"{path}: the run had {av['partitions']} partitions, not "
                           f"{self.parts} (resuming needs the same partitions)")
        avg = model_from_checkpoint(state, path).state_dict()
        self.model.load_state_dict(avg)
        self.epoch = int(state["epoch"])
        self.history = list(state.get("history") or [])
        opt = state.get("optimizer_state") if self.optimizer_sync == "average" else None
        self.opt_state = None
        if opt is not None:
            params = list(self.model.parameters())
            try:  # to the complete per-parameter form the sync produces
                self.opt_state = optimizer_state(optimizer_entries(
                    {int(i): st for i, st in opt["state"].items()}, params), len(params))
            except (KeyError, TypeError, AttributeError) as e:
                raise OocError(f"{path}: averaged optimizer state does not load ({e})") from None
        for lm in self.local:
            t = lm.open()
            lm.load_average(avg, self.opt_state)
            t.epoch = lm.epoch = self.epoch
            lm.release()
        return state

    def close(self) -> None:
        for lm in self.local:
            lm.close()


def _maybe_fail(rank: int, epoch: int) -> None:
    """The failure-injection hook for tests: ``OOC_FAIL_AT=R:E[:how]`` makes rank ``R``
    fail right after training epoch ``E``, ``how`` being ``exit`` (``os._exit(3)``, the
    default), ``raise`` (an exception), ``kill`` (SIGKILL to itself), ``stop`` (SIGSTOP
    to itself) or ``hang`` (the main thread sleeps for ever; the heartbeat thread runs)."""
    spec = os.environ.get(ENV_FAIL)
    if not spec:
        return
    bits = spec.split(":")
    if int(bits[0]) != rank or int(bits[1]) != epoch:
        return
    how = bits[2] if len(bits) > 2 else "exit"
    if how == "raise":
        raise RuntimeError(f"injected failure after epoch {epoch} ({ENV_FAIL}={spec})")
    sys.stderr.write(f"ooc: injected {how} after epoch {epoch} ({ENV_FAIL}={spec})\n")
    sys.stderr.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "hang":
        while True:
            time.sleep(3600)
    os._exit(3)


# -- the CLI ---------------------------------------------------------------------------------
def wants_averaging(s: dict[str, Any]) -> bool:
    """Whether ``python -m ooc.train`` runs the multi-worker path."""
    return s.get("workers") is not None or s.get("partitions") is not None or torchrun_env()


def run_cli(dataset, config, options, s: dict[str, Any], argv: Sequence[str],
            ckdir: str | None, ck_path: Path | None, report_path: str | None,
            arg_keys: Sequence[str]) -> int:
    """The ``--workers``/``--partitions`` branch of ``python -m ooc.train``."""
    in_worker = torchrun_env()
    env_world = int(os.environ["WORLD_SIZE"]) if in_worker else None
    workers = s.get("workers")
    workers = int(workers) if workers is not None else (env_world or 1)
    if workers < 1:
        raise OocError(f"--workers must be >= 1, got {workers}")
    if env_world is not None and env_world != workers:
        raise OocError(f"--workers {workers} but WORLD_SIZE={env_world} (torchrun "
                       f"--nproc-per-node x nodes must equal --workers)")
    s["workers"] = workers
    if s.get("sync_every") is None or int(s["sync_every"]) < 1:
        raise OocError(f"--sync-every must be >= 1, got {s.get('sync_every')}")
    parts, alloc = resolve_partitions(dataset.path, workers, s.get("partitions"),
                                      options.memory_budget, s.get("compute_fraction"))
    halo = int(s["halo_hops"]) if s.get("halo_hops") is not None else config.num_layers
    if halo < 1:
        raise OocError(f"--halo-hops must be >= 1, got {halo}")
    rank = int(os.environ.get("RANK", 0))
    if in_worker and rank != 0:
        part_dir = Path(s["partition_dir"]) if s.get("partition_dir") else \
            default_partition_dir(dataset.path, parts, halo)
        wait_for_partitions(part_dir, dist_timeout_s())
    else:
        part_dir = ensure_partitions(dataset.path, parts, s.get("partition_dir"), s["seed"],
                                     halo_hops=halo)
    if not in_worker and workers > 1:
        print(f"ooc.train: {workers} workers, {parts} partitions ({alloc['rule']}), "
              f"averaging every {s['sync_every']} epoch(s); partitions in {part_dir}")
        return launch(list(argv) + ["--partitions", str(parts), "--partition-dir",
                                    str(part_dir)], workers)
    return _worker(dataset, config, options, s, part_dir, parts, alloc, argv, ckdir, ck_path,
                   report_path, arg_keys)


def _worker(dataset, config, options, s, part_dir, parts, alloc, argv, ckdir, ck_path,
            report_path, arg_keys) -> int:
    rank = int(os.environ.get("RANK", 0))
    world = int(s["workers"])
    if world > 1 and config.num_threads is None:
        per = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        config.num_threads = per
        torch.set_num_threads(per)
    if rank != 0:
        config.progress = False
    t0 = time.perf_counter()
    heartbeat = Heartbeat.from_env(rank) if world > 1 else None
    comm = Comm.from_env() if world > 1 else Comm()
    comm.heartbeat = heartbeat
    log = print if rank == 0 else (lambda m: None)
    trainer = None
    try:
        trainer = AveragingTrainer(dataset, part_dir, parts, config, options, comm,
                                   sync_every=int(s["sync_every"]), log=log,
                                   optimizer_sync=s.get("optimizer_sync") or "average",
                                   heartbeat=heartbeat)
        if ck_path is not None:
            trainer.resume(ck_path)
            log(f"ooc.train: resumed from {ck_path} (epoch {trainer.epoch})")
        log(f"ooc.train: worker {rank}/{world}: partitions {trainer.mine} of {parts} "
            f"({', '.join(str(lm.n_train) for lm in trainer.local)} training nodes); "
            f"model {config.model} {trainer.model.dims}, mode {config.mode}")
        args = {k: s.get(k) for k in arg_keys}
        args["partitions"], args["partition_dir"] = parts, str(part_dir)
        while trainer.epoch < config.epochs:
            rec = trainer.train_epoch()
            if ckdir is not None and rec["synced"] and (
                    trainer.epoch % int(s["checkpoint_every"]) == 0
                    or trainer.epoch == config.epochs):
                trainer.save(ckdir, args)
        peak = comm.all_reduce_max(torch.tensor([float(_peak_rss())], dtype=torch.float64))
        last = next((r for r in reversed(trainer.history) if r.get("val_acc") is not None), {})
        total = time.perf_counter() - t0
        if rank == 0:
            rep = {
                "mode": config.mode, "workers": world, "partitions": parts,
                "sync_every": int(s["sync_every"]), "assignment": trainer.assignment,
                "partition_dir": str(part_dir), "allocation": alloc,
                "optimizer_at_sync": trainer.optimizer_sync,
                "train_nodes": _gather_train_nodes(trainer, comm),
                "dataset": {"path": str(dataset.path), "num_nodes": dataset.num_nodes,
                            "num_edges": dataset.num_edges, "train": int(len(dataset.train_idx)),
                            "val": int(len(dataset.val_idx)), "test": int(len(dataset.test_idx))},
                "model": dict(trainer.model.config), "config": asdict(config),
                "val_acc": last.get("val_acc"), "test_acc": last.get("test_acc"),
                "epochs": trainer.history, "total_time_s": round(total, 3),
                "peak_rss_bytes_max_worker": int(peak[0]), "peak_rss_bytes": _peak_rss(),
                "resumed_from": str(ck_path) if ck_path else None, "checkpoint_dir": ckdir,
                "argv": list(argv),
            }
            fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
            print(f"ooc.train: done in {total:.1f}s: val_acc {fmt(rep['val_acc'])}  "
                  f"test_acc {fmt(rep['test_acc'])}  peak RSS (max worker) "
                  f"{int(peak[0]) / 2**20:.0f} MiB" + (f"  report {report_path}"
                                                       if report_path else ""))
            if report_path:
                try:
                    write_json(report_path, rep)
                except OSError as e:
                    raise OocError(f"{report_path}: cannot write report "
                                   f"({e.strerror or e})") from None
        else:
            _gather_train_nodes(trainer, comm)
        return 0
    except OocError as e:
        raise OocError(f"worker rank {rank}: {e}" if world > 1 else str(e)) from None
    except PeerLost as e:
        print(f"ooc: worker rank {rank}: {e}", file=sys.stderr, flush=True)
        return PEER_LOST_RC
    finally:
        if trainer is not None:
            trainer.close()
        comm.close()
        if heartbeat is not None:
            heartbeat.close()


def _gather_train_nodes(trainer: AveragingTrainer, comm: Comm) -> list[int]:
    t = torch.zeros(trainer.parts, dtype=torch.float64)
    for lm in trainer.local:
        t[lm.part] = lm.n_train
    comm.all_reduce_sum(t)
    return [int(v) for v in t.tolist()]


def _peak_rss() -> int:
    from ...memory import peak_rss_bytes

    return peak_rss_bytes()


# -- the parent ---------------------------------------------------------------------------------
def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"killed by {name}"
    return f"exit code {rc}"


def launch(argv: Sequence[str], workers: int, python: str | None = None) -> int:
    """Start ``workers`` copies of ``python -m ooc.train argv`` on 127.0.0.1 and watch them.

    Child output is forwarded (stdout of rank 0 as is, the rest prefixed
    ``[rank R]``). The first child to exit non-zero, or to stop making progress
    (:mod:`ooc.executor.distributed.heartbeat`: no heartbeat, or no progress, for
    ``OOC_HEARTBEAT_TIMEOUT`` seconds), ends the run: a stalled worker gets
    SIGKILL, the others SIGTERM (SIGKILL after :data:`TERMINATE_GRACE_S`), and
    this returns 1 after printing ``ooc: worker rank R failed: <reason>``.
    """
    port = free_port()
    hb_timeout = HB.timeout_s()
    hb_dir = Path(tempfile.mkdtemp(prefix="ooc-heartbeat-"))
    hb_path = HB.create_file(hb_dir / "heartbeat", workers)
    monitor = HeartbeatMonitor(hb_path, workers, hb_timeout)
    poll = HB.interval_s(hb_timeout)
    procs: list[subprocess.Popen] = []
    last_err: dict[int, str] = {}
    exits: "queue.Queue[tuple[int, int]]" = queue.Queue()
    lock = threading.Lock()

    def pump(stream, rank: int, out, keep: bool) -> None:
        for line in iter(stream.readline, ""):
            if keep and line.strip():
                last_err[rank] = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
            with lock:
                out.write(line if (rank == 0 and out is sys.stdout) else f"[rank {rank}] {line}")
                out.flush()
        stream.close()

    threads = []
    t_start = time.perf_counter()
    print(f"ooc.train: starting {workers} worker processes on 127.0.0.1:{port} (each loads "
          f"torch, PyG and the kernels before its first line)", flush=True)
    try:
        for r in range(workers):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(workers), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
                       **{HB.ENV_PATH: str(hb_path), HB.ENV_TIMEOUT: str(hb_timeout)})
            p = subprocess.Popen([python or sys.executable, "-m", "ooc.train", *argv], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 bufsize=1)
            procs.append(p)
            for stream, out, keep in ((p.stdout, sys.stdout, False), (p.stderr, sys.stderr, True)):
                th = threading.Thread(target=pump, args=(stream, r, out, keep), daemon=True)
                th.start()
                threads.append(th)
            threading.Thread(target=lambda p=p, r=r: exits.put((r, p.wait())),
                             daemon=True).start()
        failed: tuple[int, int] | None = None
        stalled: tuple[int, str] | None = None
        running = set(range(workers))
        while running:
            try:
                r, rc = exits.get(timeout=poll)
            except queue.Empty:
                stalled = monitor.check(sorted(running))
                if stalled is not None:
                    with contextlib.suppress(OSError):
                        procs[stalled[0]].kill()  # stopped or hung: SIGTERM may never land
                    break
                continue
            running.discard(r)
            if rc != 0:
                failed = (r, rc)
                break
        if failed is not None and failed[1] == PEER_LOST_RC:
            # a consequence: the worker that caused it is probably still exiting, or
            # stopped or hung (its collective timed out on the others' side first)
            t_end = time.monotonic() + CAUSE_WAIT_S
            while time.monotonic() < t_end:
                try:
                    r, rc = exits.get(timeout=max(0.01, min(poll, t_end - time.monotonic())))
                except queue.Empty:
                    continue
                running.discard(r)
                if rc not in (0, PEER_LOST_RC):
                    failed = (r, rc)
                    break
            else:
                stalled = monitor.check(sorted(running), limit=CAUSE_WAIT_S)
                if stalled is not None:
                    with contextlib.suppress(OSError):
                        procs[stalled[0]].kill()
        if failed is not None or stalled is not None:
            _terminate(procs)
        for th in threads:
            th.join(timeout=2.0)
        if stalled is not None:
            print(f"ooc: worker rank {stalled[0]} failed: {stalled[1]}", file=sys.stderr,
                  flush=True)
            return 1
        if failed is None:
            print(f"ooc.train: {workers} workers finished in "
                  f"{time.perf_counter() - t_start:.1f}s, start-up included", flush=True)
            return 0
        r, rc = failed
        reason = _describe_exit(rc)
        if last_err.get(r):
            reason += f": {last_err[r]}"
        print(f"ooc: worker rank {r} failed: {reason}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        _terminate(procs)
        raise
    finally:
        _terminate(procs)
        shutil.rmtree(hb_dir, ignore_errors=True)


def _terminate(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.terminate()
        except OSError:
            pass
    t_end = time.monotonic() + TERMINATE_GRACE_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, t_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
