"""One partition's local model and the two states a worker switches it between.

* **resident**: a :class:`~ooc.executor.training.trainer.Trainer` on the
  partition dataset with its pipeline open (readers, caches, runtime files);
* **swapped out**: only its model and optimizer ``state_dict`` s, the
  pipeline closed. With ``--memory-budget`` and several partitions per
  worker, every local model but the one training is swapped out, so only one
  pipeline is open at a time.

Before its first use a local model is neither: the first :meth:`LocalModel.open`
builds a Trainer, which starts from the run's initial weights (``--seed``).
"""
from __future__ import annotations

import copy
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ooc.executor.distributed.heartbeat import Heartbeat
from ooc.executor.training.trainer import Trainer
from ooc.storage import open_dataset

if TYPE_CHECKING:
    from ooc.executor.loader.stack import ModeOptions
    from ooc.executor.training.config import TrainConfig


class LocalModel:
    """Partition ``part`` (the dataset at ``path``) and its local model.

    Args:
        part: the partition's number ``j``.
        path: its dataset folder (``<partition dir>/part_<j>``).
        config: the run's TrainConfig (every local model trains with it).
        options: the run's ModeOptions; a ``runtime_dir`` gets a ``part_<j>``
            sub-folder per partition.
        log: where the Trainer's messages go (prefixed ``part j:``).
        resident_ok: True: :meth:`release` keeps the Trainer open.
        heartbeat: beats after every batch and marks the set-up of a pipeline.
    """

    def __init__(self, part: int, path: Path, config: TrainConfig, options: ModeOptions,
                 log: Callable[[str], None], resident_ok: bool,
                 heartbeat: Heartbeat | None = None):

        self.part, self.path = part, path
        self.dataset = open_dataset(path)
        self.n_train = int(len(self.dataset.train_idx))
        self.config, self.options, self.log = config, options, log
        self.resident_ok, self.heartbeat = resident_ok, heartbeat
        self.trainer: Trainer | None = None  # resident: the open Trainer
        self.saved: dict[str, Any] | None = None  # swapped out: {"model": ..., "optimizer": ...}
        self.epoch = 0

    # -- switching states --------------------------------------------------------------
    def open(self) -> Trainer:
        """The resident Trainer (built, and its swapped-out states restored, if needed)."""
        if self.trainer is None:
            if self.heartbeat is not None:
                self.heartbeat.setup()
            t = self._build_trainer()
            if self.saved is not None:
                t.model.load_state_dict(self.saved["model"])
                t.optimizer.load_state_dict(self.saved["optimizer"])
                self.saved = None
            t.epoch = self.epoch
            self.trainer = t
        return self.trainer

    def release(self) -> None:
        """Swap out: close the pipeline, keeping model and optimizer states (unless
        ``resident_ok``)."""
        if self.trainer is None or self.resident_ok:
            return
        t = self.trainer
        self.saved = {"model": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
                      "optimizer": copy.deepcopy(t.optimizer.state_dict())}
        t.close()
        self.trainer = None
        gc.collect()

    def _build_trainer(self) -> Trainer:
        opts = copy.copy(self.options)
        if opts.runtime_dir:
            opts.runtime_dir = str(Path(opts.runtime_dir) / f"part_{self.part:03d}")
        part = self.part

        def log(m: str) -> None:
            self.log(f"  part {part}: {m}")

        t = Trainer(self.dataset, self.config, options=opts, allow_empty_train=True, log=log)
        if self.heartbeat is not None:
            t.on_batch = self.heartbeat.beat
        return t

    # -- states, in either state -------------------------------------------------------
    def _swapped_out(self) -> dict[str, Any]:
        """The saved states of a model that is not resident."""
        # callers use a local model's states once it has been open (trained or resumed)
        assert self.saved is not None, f"part {self.part}: local model not opened yet"
        return self.saved

    def model_state(self) -> dict[str, torch.Tensor]:
        """The local model's ``state_dict()``."""
        return (self.trainer.model.state_dict() if self.trainer is not None
                else self._swapped_out()["model"])

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The local optimizer's ``state_dict()``."""
        if self.trainer is not None:
            return self.trainer.optimizer.state_dict()
        return self._swapped_out()["optimizer"]

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
            saved = self._swapped_out()
            saved["model"] = {k: v.clone() for k, v in avg.items()}
            saved["optimizer"]["state"] = state

    def set_epoch(self, epoch: int) -> None:
        """The number of epochs trained so far (a resumed run)."""
        self.epoch = epoch
        if self.trainer is not None:
            self.trainer.epoch = epoch

    # -- work ----------------------------------------------------------------------------
    def train_epoch(self) -> dict[str, Any] | None:
        """One local epoch (the Trainer's record), or None for a partition without
        training nodes (its epoch count moves on all the same)."""
        t = self.open()
        if self.n_train == 0:
            t.epoch += 1
            self.epoch = t.epoch
            return None
        rec = t.train_epoch()
        self.epoch = t.epoch
        return rec

    def close(self) -> None:
        """Close the pipeline (the states are dropped)."""
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
