"""One worker's share of a model-averaging run: its local models, the sync, the evaluation.

An epoch (:meth:`AveragingTrainer.train_epoch`): every local model trains one
epoch (:meth:`~AveragingTrainer.train_local`), the loss and accuracy sums are
summed over the workers; after every ``K``-th epoch and the last the local
models are averaged over all workers (:meth:`~AveragingTrainer.sync`) and the
averaged model is evaluated on the validation and test nodes
(:meth:`~AveragingTrainer.evaluate`). Checkpoints hold the averaged model and
optimizer state of a sync, so a run resumes with any number of workers.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ooc.core.errors import InvalidValue, setting
from ooc.executor.distributed.averaging import (
    assign_partitions,
    finish_average,
    flatten,
    optimizer_entries,
    optimizer_state,
    unflatten,
    weighted_sum,
    zeros_like_state,
)
from ooc.executor.distributed.comm import Comm
from ooc.executor.distributed.heartbeat import Heartbeat
from ooc.executor.distributed.local_model import LocalModel
from ooc.executor.training.checkpoint import (
    check_dataset,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from ooc.executor.training.models import GNN, build_model

if TYPE_CHECKING:
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.training.config import TrainConfig
    from ooc.storage.dataset import Dataset

#: ``--optimizer-sync`` choices: what happens to the local Adam states at a sync.
OPTIMIZER_SYNC = ("average", "reset")

#: Adam state as the sync produces it: parameter index -> {"step", "exp_avg", "exp_avg_sq"}.
OptState = dict[int, dict[str, torch.Tensor]]


def format_acc(v: float | None) -> str:
    """An accuracy for the log: four decimals, or ``n/a``."""
    return "n/a" if v is None else f"{v:.4f}"


class AveragingTrainer:
    """One worker's share of a multi-worker run (``comm.world_size`` workers, ``parts`` total).

    Args:
        data: the full dataset (opened), for the model's shapes and the report.
        part_dir: the partition folder (``part_000/`` ...).
        parts: ``P``.
        config: the run's :class:`~ooc.executor.training.trainer.TrainConfig` (its
            evaluation settings are ignored: evaluation follows each sync).
        options: :class:`~ooc.executor.loader.stack.ModeOptions` of every local pipeline.
        comm: the process group (:class:`~ooc.executor.distributed.comm.Comm`).
        sync_every: ``K``.
        log: rank 0's messages (the others pass a no-op).
        optimizer_sync: ``"average"`` (the local Adam states are averaged
            like the weights) or ``"reset"`` (every local Adam restarts).
        heartbeat: this worker's :class:`~ooc.executor.distributed.heartbeat.Heartbeat`
            (beats after every batch), or None.
    """

    def __init__(self, data: Dataset, part_dir: Path, parts: int, config: TrainConfig,
                 options: ModeOptions, comm: Comm,
                 sync_every: int = 1, log: Callable[[str], None] = print,
                 optimizer_sync: str = "average", heartbeat: Heartbeat | None = None):
        if sync_every < 1:
            raise InvalidValue(f"{setting('--sync-every')} must be >= 1, got {sync_every}")
        if optimizer_sync not in OPTIMIZER_SYNC:
            raise InvalidValue(f"{setting('--optimizer-sync')} must be one of {', '.join(OPTIMIZER_SYNC)}, "
                           f"got {optimizer_sync!r}")
        self.optimizer_sync = optimizer_sync
        #: the averaged optimizer state after the last sync (``average`` only)
        self.opt_state: OptState | None = None
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
        self._check_partitions()
        self.model = self._initial_model(config)
        self.epoch = 0
        self.history: list[dict[str, Any]] = []

    def _check_partitions(self) -> None:
        for lm in self.local:
            d, full = lm.dataset, self.data
            if d.feature_dim != full.feature_dim or d.num_classes != full.num_classes:
                raise InvalidValue(f"{lm.path}: partition does not match {full.path} (features "
                               f"{d.feature_dim} vs {full.feature_dim}, classes "
                               f"{d.num_classes} vs {full.num_classes})")

    def _initial_model(self, config: TrainConfig) -> GNN:
        """The averaged model's home, with the same initial weights as every local Trainer."""
        torch.manual_seed(config.seed)
        return build_model(config.model, self.data.feature_dim, config.hidden,
                           self.data.num_classes, config.num_layers, dropout=config.dropout,
                           heads=config.heads)

    @property
    def train_nodes(self) -> int:
        """Training nodes of this worker's partitions."""
        return sum(lm.n_train for lm in self.local)

    # -- one epoch ------------------------------------------------------------------------
    def train_epoch(self) -> dict[str, Any]:
        """Train every local model one epoch; average after every ``K``; evaluate after a sync.

        Returns the epoch's record (also appended to ``history``): ``loss`` and
        ``train_acc`` over all workers' training nodes, ``synced``, the times,
        and ``val_acc``/``test_acc`` after a sync (else None).
        """
        epoch = self.epoch + 1
        t0 = time.perf_counter()
        sums = self.train_local()
        train_s = time.perf_counter() - t0
        loss_sum, correct, count = self.comm.all_reduce_sum(sums).tolist()
        synced = epoch % self.sync_every == 0 or epoch == self.config.epochs
        sync_s = 0.0
        if synced:
            t1 = time.perf_counter()
            self.sync()
            sync_s = time.perf_counter() - t1
        rec: dict[str, Any] = {
            "epoch": epoch, "loss": loss_sum / max(count, 1),
            "train_acc": correct / max(count, 1), "synced": synced,
            "time_s": round(time.perf_counter() - t0, 6), "train_time_s": round(train_s, 6),
            "sync_time_s": round(sync_s, 6), "val_acc": None, "test_acc": None,
        }
        if synced and self.eval:
            t2 = time.perf_counter()
            rec["val_acc"], rec["test_acc"] = self.evaluate()
            rec["eval_time_s"] = round(time.perf_counter() - t2, 6)
        self.epoch = epoch
        self.history.append(rec)
        self._log_epoch(rec)
        return rec

    def train_local(self) -> torch.Tensor:
        """One epoch of every local model, one after the other (all but the last swapped
        out after theirs). Returns this worker's float64 ``[loss_sum, correct, count]``,
        the sums weighted by each partition's training nodes."""
        sums = torch.zeros(3, dtype=torch.float64)
        for i, lm in enumerate(self.local):
            rec = lm.train_epoch()
            if rec is not None:
                sums += torch.tensor([rec["loss"], rec["train_acc"], 1.0],
                                     dtype=torch.float64) * lm.n_train
            if i < len(self.local) - 1:
                lm.release()
        return sums

    def _log_epoch(self, rec: dict[str, Any]) -> None:
        if self.comm.rank != 0:
            return
        evaluated = rec["synced"] and self.eval
        self.log(f"epoch {rec['epoch']:>3}/{self.config.epochs}  loss {rec['loss']:.4f}  "
                 f"train_acc {rec['train_acc']:.4f}"
                 + (f"  val_acc {format_acc(rec['val_acc'])}  "
                    f"test_acc {format_acc(rec['test_acc'])}" if evaluated else "")
                 + f"  {rec['time_s']:.2f}s (train {rec['train_time_s']:.2f} "
                   f"sync {rec['sync_time_s']:.3f})"
                 + ("  [averaged]" if rec["synced"] else ""))

    # -- the sync -------------------------------------------------------------------------
    def sync(self) -> None:
        """Weighted averaging over all ``P`` local models (and their Adam states): one
        ``all_reduce`` of the flat partial sums, one of the weights."""
        model_like = self.model.state_dict()
        params = list(self.model.parameters())
        like = self._entries(model_like, {}, params)
        keys = [k for k, v in like.items() if v.is_floating_point()]
        flat = self.comm.all_reduce_sum(flatten(self._partial_sum(like, params), keys))
        weight = self.comm.all_reduce_sum(torch.tensor([float(self.train_nodes)],
                                                       dtype=torch.float64))
        avg = finish_average(unflatten(flat, like, keys), float(weight[0]), like)
        avg_model = {k: avg[k] for k in model_like}
        self.opt_state = optimizer_state(avg, len(params)) \
            if self.optimizer_sync == "average" else None
        self.model.load_state_dict(avg_model)
        for lm in self.local:
            lm.load_average(avg_model, self.opt_state)

    def _entries(self, model_state: dict[str, torch.Tensor], opt_state: dict,
                 params: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """What is averaged: the weights, and with ``average`` the Adam entries too."""
        if self.optimizer_sync != "average":
            return model_state
        return {**model_state, **optimizer_entries(opt_state, params)}

    def _partial_sum(self, like: dict[str, torch.Tensor], params: Sequence[torch.Tensor]
                     ) -> dict[str, torch.Tensor]:
        """``sum_{j mine} n_j w_j`` in float64 (zeros for a worker without partitions)."""
        if not self.local:
            return zeros_like_state(like)
        states = [self._entries(lm.model_state(), lm.optimizer_state_dict()["state"], params)
                  for lm in self.local]
        return weighted_sum(states, [lm.n_train for lm in self.local])

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

    def gather_train_nodes(self) -> list[int]:
        """Training nodes of every partition (a collective: every worker calls it)."""
        t = torch.zeros(self.parts, dtype=torch.float64)
        for lm in self.local:
            t[lm.part] = lm.n_train
        self.comm.all_reduce_sum(t)
        return [int(v) for v in t.tolist()]

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, checkpoint_dir: str | os.PathLike, args: dict[str, Any]) -> Path | None:
        """Rank 0 writes the averaged model (call right after a sync)."""
        if self.comm.rank != 0:
            return None
        opt = None
        if self.opt_state is not None:
            opt = {"state": self.opt_state,
                   "param_groups": self.local[0].optimizer_state_dict()["param_groups"]}
        return save_checkpoint(checkpoint_dir, self.epoch, self.model, opt, args=args,
                               history=self.history, extra=self._checkpoint_extra(),
                               dataset=self.data)

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "dataset": str(self.data.path),
                "num_nodes": self.data.num_nodes,
                "averaging": {"partitions": self.parts, "partition_dir": str(self.part_dir),
                              "workers": self.comm.world_size, "sync_every": self.sync_every,
                              "optimizer_sync": self.optimizer_sync}}

    def resume(self, path: str | os.PathLike) -> dict[str, Any]:
        """Continue from a checkpoint of a sync: every local model loads its weights."""
        state = load_checkpoint(path)
        check_dataset(state, self.data, path)
        self._check_resumable(state, path)
        avg = model_from_checkpoint(state, path).state_dict()
        self.model.load_state_dict(avg)
        self.epoch = int(state["epoch"])
        self.history = list(state.get("history") or [])
        self.opt_state = self._optimizer_from_checkpoint(state, path)
        for lm in self.local:
            lm.open()
            lm.load_average(avg, self.opt_state)
            lm.set_epoch(self.epoch)
            lm.release()
        return state

    def _check_resumable(self, state: dict[str, Any], path: str | os.PathLike) -> None:
        if dict(state["model_config"]) != dict(self.model.config):
            raise InvalidValue(f"{path}: checkpoint is for a different model or dataset")
        av = (state.get("extra") or {}).get("averaging")
        if av is None:
            raise InvalidValue(f"{path}: not a checkpoint of a multi-worker run (no averaging "
                           f"entry); resume it without --workers/--partitions")
        if int(av["partitions"]) != self.parts:
            raise InvalidValue(f"{path}: the run had {av['partitions']} partitions, not "
                           f"{self.parts} (resuming needs the same partitions)")

    def _optimizer_from_checkpoint(self, state: dict[str, Any], path: str | os.PathLike
                                   ) -> OptState | None:
        """The checkpoint's averaged Adam state in the complete per-parameter form the sync
        produces (None with ``reset``, or when the checkpoint has none)."""
        opt = state.get("optimizer_state") if self.optimizer_sync == "average" else None
        if opt is None:
            return None
        params = list(self.model.parameters())
        try:
            return optimizer_state(optimizer_entries(
                {int(i): st for i, st in opt["state"].items()}, params), len(params))
        except (KeyError, TypeError, AttributeError) as e:
            raise InvalidValue(f"{path}: averaged optimizer state does not load ({e})") from None

    def close(self) -> None:
        for lm in self.local:
            lm.close()
