"""The epoch loop: sample, gather, transfer, compute; evaluation; metrics.

One code path for every mode. A :class:`Trainer` owns the model, the
optimizer and the mode's pipelines (:func:`ooc.executor.loader.stack.build_stack`):
a training pipeline and a factory of evaluation pipelines, each read through a
:class:`~ooc.executor.loader.node_loader.NodeLoader` made over it (its source a
:class:`~ooc.executor.loader.node_loader.GivenPipeline`), so the trainer, the CLI and
a user's own loop get the same ``Data`` from the same code (the trainer asks for the
seeds' labels only).

Determinism: the model is initialised after ``torch.manual_seed(seed)``; the
batch order and sampled batches of epoch ``e`` come from ``(seed, e)``
(:class:`~ooc.sampling.epoch_plan.EpochPlan`); dropout draws from the torch RNG
re-seeded from ``(seed, e)`` at the start of every epoch. So epoch ``e`` does
the same thing whether the run started at epoch 1 or resumed from a
checkpoint of epoch ``e - 1``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ooc.core.errors import InvalidValue, setting
from ooc.core.memory import peak_rss_bytes
from ooc.core.timers import Timers
from ooc.executor.loader.node_loader import GivenPipeline, NodeLoader
from ooc.executor.loader.presets import resolve_preset
from ooc.executor.loader.process_budget import process_total
from ooc.executor.loader.stack import EVAL_SEED_OFFSET, ModeOptions, build_stack
from ooc.executor.sizing.budget import plan_memory
from ooc.executor.training.checkpoint import (
    check_dataset,
    describe_model,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from ooc.executor.training.config import TrainConfig  # noqa: F401  (re-exported from here too)
from ooc.executor.training.finite import NonFiniteLoss, TrainingDiverged, UpdateWatch, check_step  # noqa: F401
from ooc.executor.training.models import GNN, build_model  # noqa: F401  (GNN: the docstrings' model class)
from ooc.executor.training.step import default_loss, eval_forward, model_call, train_step  # noqa: F401
from ooc.storage.dataset import open_dataset
from ooc.storage.locks import exclusive

#: Stages timed in every epoch (seconds); modes may add more.
STAGES = ("sample", "gather", "transfer", "compute")
#: Stages shown in the per-epoch line (when timed).
REPORT_STAGES = ("sample", "inspect_sample", "inspect_changesets", "load", "switch", "gather",
                 "read", "update", "convert", "transfer", "compute", "stall")

def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without CUDA is an error."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidValue(f"{setting('--device')} cuda: CUDA is not available on this machine "
                           f"(use cpu or auto)")
    try:
        return torch.device(device)
    except RuntimeError:
        raise InvalidValue(f"unknown device {device!r} (use auto, cpu or cuda)") from None


def epoch_torch_seed(seed: int, epoch: int) -> int:
    """Seed of the torch RNG (dropout) during epoch ``epoch``."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 31
    return x & ((1 << 63) - 1)


@dataclasses.dataclass
class _EpochSums:
    """What an epoch's batches add up to."""

    loss: float = 0.0        # summed over labeled seeds
    correct: int = 0
    count: int = 0           # labeled seeds
    nodes: int = 0           # nodes of the batches
    batches: int = 0
    growth_max: float = 0.0  # the largest weight growth of one step
    wait: float = 0.0        # seconds blocked on the loader

    def add(self, loss: float, growth: float, labeled: int, right: int, nodes: int) -> None:
        self.loss += loss * labeled
        self.correct += right
        self.count += labeled
        self.growth_max = max(self.growth_max, growth)
        self.nodes += nodes
        self.batches += 1


def _opened(dataset: Any) -> Any:
    """``dataset`` opened when it is a folder (as :class:`~ooc.NodeLoader` takes one), else
    as given when it is a dataset; anything else is refused in one line."""

    if isinstance(dataset, (str, Path)):
        return open_dataset(dataset)
    if not all(hasattr(dataset, a) for a in ("path", "num_classes", "train_idx", "labels")):
        raise InvalidValue(f"Trainer: dataset must be a dataset folder or an opened dataset "
                           f"(ooc.open_dataset(path)), not {type(dataset).__name__}")
    return dataset


def check_labelled_training(dataset: Any) -> None:
    """Refuse a dataset whose training split is empty or holds no labelled node (a label
    >= 0): training would have nothing to learn from, and its loss would be NaN."""
    train = np.asarray(dataset.train_idx)
    if len(train) == 0:
        raise InvalidValue(f"{dataset.path}: dataset has an empty training split")
    read = getattr(dataset, "read_labels", None)  # by page, nothing of labels.npy mapped
    labels = read(train) if read is not None else np.asarray(dataset.labels)[train]
    if not (labels >= 0).any():
        raise InvalidValue(f"{dataset.path}: no labelled node in the training split (its "
                           f"{len(train):,} nodes are all labelled -1 in labels.npy); label "
                           f"them or choose a training split of labelled nodes")


class Trainer:
    """Trains a :class:`GNN` on a dataset, one epoch at a time.

    Args:
        dataset: a dataset folder, or an opened dataset (:func:`ooc.open_dataset`).
        config: the run's settings.
        pipeline: ``(train_pipeline, eval_pipeline_factory, features)``;
            defaults to ``build_stack(dataset, config, options, plan, preset=preset)``.
        log: where one-line messages go (default: ``tqdm.write`` to stdout).
        allow_empty_train: accept a dataset without training nodes (a
            partition that is only evaluated; do not call ``train_epoch``).
        preset: a :class:`~ooc.executor.loader.presets.Preset` or cache policy object in
            place of ``config.mode`` (e.g. ``BeladyCache(page_mates=0.25)``).

    Typical use::

        t = Trainer(open_dataset(path), TrainConfig(epochs=10))
        t.fit()                               # or t.train_epoch() in a loop
        print(t.evaluate(t.dataset.test_idx))
    """

    def __init__(self, dataset, config: TrainConfig | None = None, pipeline=None,
                 log: Callable[[str], None] | None = None, options=None,
                 allow_empty_train: bool = False, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 preset=None):
        config = config if config is not None else TrainConfig()
        if not isinstance(config, TrainConfig):
            raise InvalidValue(f"Trainer: config must be a TrainConfig, not "
                               f"{type(config).__name__}")
        config.validate()
        self.dataset = dataset = _opened(dataset)
        self.config = config
        self.device = resolve_device(config.device)
        self.log = log or (lambda msg: tqdm.write(msg, file=sys.stdout))
        self._check_dataset(dataset, allow_empty_train)
        torch.manual_seed(config.seed)
        if model is None:
            model = self._build_model()
        elif not isinstance(model, torch.nn.Module):
            raise InvalidValue(f"model must be a torch.nn.Module, not {type(model).__name__}")
        self.model: torch.nn.Module = model.to(self.device)
        self._call = model_call(self.model)
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(
            self._parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.loss = loss if loss is not None else default_loss
        self._watch = UpdateWatch(list(self.model.parameters()))
        self.memory_plan = None
        self.mode_info: dict[str, Any] = {}
        self._pipeline = None
        self._closed = False

        #: what the loaders run: ``preset``, else ``config.mode``
        self.preset = preset = resolve_preset(config.mode if preset is None else preset)
        if pipeline is None:
            options = options or ModeOptions()
            budget = options.memory_budget or process_total()
            if budget:
                self.memory_plan = plan_memory(dataset, config, budget, options,
                                               model=self.model, preset=preset,
                                               seeds=self._train_seeds())
            pipeline = build_stack(dataset, config, options, plan=self.memory_plan,
                                   seeds=self._train_seeds(), preset=preset)
            self._pipeline = pipeline
            self.mode_info = dict(pipeline.info)
        self.train_producer, self.eval_producer_factory, self.features = pipeline
        # on CUDA the gathered rows are page-locked: one copy a batch to the device
        self.train_producer.pin_rows = self.device.type == "cuda"
        #: the training batches as ``Data`` (seeds' labels only): the loader code users run
        self.train_loader = self._train_loader()
        self.labels = dataset.labels
        self.epoch = 0  # the last completed epoch
        self.history: list[dict[str, Any]] = []
        self.timers = Timers(STAGES)
        #: called after every training and evaluation batch (a worker's heartbeat)
        self.on_batch: Callable[[], None] | None = None
        self.nodes_seen = 0
        self.batches_seen = 0

    # -- what a task decides (:class:`~ooc.executor.training.link.LinkTrainer` differs) ----
    def _check_dataset(self, dataset, allow_empty_train: bool) -> None:
        """Refuse a dataset this task cannot train on."""
        if dataset.num_classes < 1:
            raise InvalidValue(f"{dataset.path}: dataset has no labels (num_classes is 0)")
        if not allow_empty_train:
            check_labelled_training(dataset)

    def _build_model(self) -> torch.nn.Module:
        """The built-in model of ``config``: a classifier of the dataset's classes."""
        cfg, ds = self.config, self.dataset
        return build_model(cfg.model, ds.feature_dim, cfg.hidden, ds.num_classes,
                           cfg.num_layers, dropout=cfg.dropout, heads=cfg.heads)

    def _parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer trains."""
        return list(self.model.parameters())

    def _train_seeds(self) -> Any:
        """The training pipeline's seeds (None: the dataset's training nodes)."""
        return None

    def _train_loader(self) -> NodeLoader:
        """The training batches as ``Data`` (the seeds' labels only)."""
        return self._loader(self.train_producer, self.dataset.train_idx,
                            self.config.batch_size, self.config.seed)

    def _validate(self) -> dict[str, Any]:
        """The validation metrics of an epoch's record."""
        return {"val_acc": self.evaluate(self.dataset.val_idx)}

    def _loader(self, pipeline, seeds: np.ndarray, batch_size: int, seed: int) -> NodeLoader:
        """A :class:`NodeLoader` over ``pipeline`` (built for ``seeds`` in batches of
        ``batch_size`` sampled from ``seed``), which this trainer owns: the seeds' labels only."""
        cfg = self.config
        return NodeLoader(self.dataset, cfg.fanouts, seeds, batch_size=batch_size,
                          num_workers=int(getattr(pipeline, "workers", 0)), preset=self.preset,
                          seed=seed, num_threads=cfg.num_threads, labels="seeds",
                          source=GivenPipeline(pipeline))

    # -- epochs --------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidValue("Trainer is closed: its readers are released (make a new Trainer, "
                           "or call fit() inside its `with` block)")

    def train_epoch(self) -> dict[str, Any]:
        """Run epoch ``self.epoch + 1``; return (and record) its metrics."""
        self._check_open()
        cfg = self.config
        epoch = self.epoch + 1
        torch.manual_seed(epoch_torch_seed(cfg.seed, epoch))
        self.model.train()
        timers = Timers(STAGES)
        producer = self.train_producer
        self._watch.start()
        t_start = time.perf_counter()
        io0 = io_counters(producer)
        sums = self._train_batches(epoch, timers)
        self._add_stage_times(timers, sums.wait)
        train_time = time.perf_counter() - t_start
        io = io_delta(io0, io_counters(producer))
        if "feature_read_s" in io:
            timers.add("read", io.pop("feature_read_s"))
        self.nodes_seen += sums.nodes
        rec: dict[str, Any] = {
            "epoch": epoch,
            "loss": sums.loss / max(sums.count, 1),
            "train_acc": sums.correct / max(sums.count, 1),
            "time_s": round(train_time, 6),
            "timers": timers.as_dict(),
            "val_acc": None,  # filled when this epoch is evaluated (--eval-every)
            "io": io,
            "max_weight_growth": round(sums.growth_max, 6),
        }
        for k, v in timers.s.items():
            self.timers.add(k, v)
        if epoch % cfg.eval_every == 0 or (epoch == cfg.epochs and cfg.eval_final):
            t0 = time.perf_counter()
            rec.update(self._validate())
            rec["eval_time_s"] = round(time.perf_counter() - t0, 6)
        self.epoch = epoch
        self.history.append(rec)
        self.log(self.summary_line(rec))
        return rec

    def _train_batches(self, epoch: int, timers: Timers) -> "_EpochSums":
        """Train on every batch of ``epoch`` (a progress bar unless ``config.progress`` is
        off); the transfer and compute seconds go to ``timers``."""
        steps = len(self.train_producer)
        sums = _EpochSums()
        bar = tqdm(total=steps, desc=f"epoch {epoch}/{self.config.epochs}", unit="batch",
                   leave=False, disable=(None if self.config.progress else True),
                   dynamic_ncols=True)
        it = self.train_loader.batches(epoch)
        with contextlib.closing(bar):
            while True:
                t0 = time.perf_counter()
                data = next(it, None)
                sums.wait += time.perf_counter() - t0
                if data is None:
                    return sums
                with timers("transfer", sync=self.device):
                    data = data.to(self.device, non_blocking=True)
                with timers("compute"):
                    loss_v, growth, n, right = self._step(data, epoch, sums.batches + 1, steps)
                sums.add(loss_v, growth, n, right, int(data.num_nodes))
                self.batches_seen += 1
                if self.on_batch is not None:
                    self.on_batch()
                bar.update(1)
                bar.set_postfix(loss=f"{loss_v:.4f}", refresh=False)

    def _add_stage_times(self, timers: Timers, wait: float) -> None:
        """The loader's stage seconds of the epoch, its conversion, and the stall: time
        the loop waited (``wait``) for a batch beyond its conversion."""
        producer, loader = self.train_producer, self.train_loader
        stages = dict(producer.stage_times()) if hasattr(producer, "stage_times") else {}
        for stage, seconds in stages.items():
            timers.add(stage, seconds)
        timers.add("convert", loader.convert_seconds)
        timers.add("stall", max(0.0, wait - loader.convert_seconds))

    def _step(self, data, epoch: int, step: int, steps: int) -> tuple[float, float, int, int]:
        """One training step and its checks: ``(loss, weight growth, labeled seeds,
        correct predictions)``, read from the device in one transfer.

        Raises:
            TrainingDiverged: the loss or the weights are not finite, or the step
                grew the weights more than ``config.max_weight_growth``.
        """
        out, loss_v = train_step(self._call, self.optimizer, self.loss, data)
        growth = torch.tensor(math.nan)
        if math.isfinite(loss_v):
            growth = self._watch.after_step()
        y = data.y[:data.batch_size]
        labeled = y >= 0
        right = (out.argmax(-1)[labeled] == y[labeled]).sum()
        stats = torch.stack([growth.to(out.device, torch.float64), labeled.sum().double(),
                             right.double()]).tolist()
        check_step(self.dataset.path, epoch, step, steps, loss_v, stats[0],
                   self.config.max_weight_growth)
        return loss_v, stats[0], int(stats[1]), int(stats[2])

    def summary_line(self, rec: dict[str, Any]) -> str:
        t = rec["timers"]
        parts = [f"epoch {rec['epoch']:>3}/{self.config.epochs}",
                 f"loss {rec['loss']:.4f}", f"train_acc {rec['train_acc']:.4f}"]
        parts += [f"{k} {v:.4f}" for k, v in rec.items()
                  if k.startswith("val_") and isinstance(v, float)]
        stages = " ".join(f"{k} {t[k]:.2f}" for k in REPORT_STAGES if k in t)
        parts.append(f"{rec['time_s']:.2f}s ({stages})")
        io = rec.get("io") or {}
        if io.get("feature_lookups"):
            parts.append(f"hit {io.get('feature_hit_ratio', 0.0):.3f} "
                         f"reads {io.get('feature_read_ops', io.get('feature_rows', 0)):,} "
                         f"{io.get('feature_bytes_read', io.get('proc_read_bytes', 0)) / 2**20:.0f} MiB")
        return "  ".join(parts)

    def evaluate(self, ids: np.ndarray) -> float | None:
        """Accuracy on ``ids`` with sampled neighbourhoods (fixed eval seed); None if empty."""
        correct, count = self.evaluate_counts(ids)
        return correct / count if count else None

    @torch.no_grad()
    def evaluate_counts(self, ids: np.ndarray) -> tuple[int, int]:
        """``(correct, labeled)`` predictions on ``ids`` (summed over workers by averaging)."""
        self._check_open()
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return 0, 0
        self.model.eval()
        cfg = self.config
        loader = self._loader(self.eval_producer_factory(ids), ids,
                              cfg.eval_batch_size or cfg.batch_size, cfg.seed + EVAL_SEED_OFFSET)
        correct, count = 0, 0
        for data in loader.batches(0):
            data = data.to(self.device)
            pred = eval_forward(self._call, data).argmax(-1)
            y = data.y[:data.batch_size]
            labeled = y >= 0
            correct += int((pred[labeled] == y[labeled]).sum())
            count += int(labeled.sum())
            if self.on_batch is not None:
                self.on_batch()
        self.model.train()
        return correct, count

    def fit(self, epochs: int | None = None, checkpoint_dir: str | Path | None = None,
            args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Train until epoch ``epochs`` (default ``config.epochs``), checkpointing each epoch."""
        import contextlib


        target = self.config.epochs if epochs is None else int(epochs)
        lock = contextlib.nullcontext() if checkpoint_dir is None else \
            exclusive(Path(checkpoint_dir).resolve(), "checkpoint folder")
        with lock:
            while self.epoch < target:
                self.train_epoch()
                if checkpoint_dir is not None:
                    self.save(checkpoint_dir, args=args)
        return self.history

    def io_counters(self) -> dict[str, Any]:
        """The training loader's and this process's I/O counters so far
        (:func:`io_counters`); :func:`io_delta` of two gives what happened between them."""
        return io_counters(self.train_producer)

    def close(self) -> None:
        """Release the mode's readers, thread pools and runtime folder (idempotent)."""
        self._closed = True
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checkpoints ---------------------------------------------------------
    def save(self, checkpoint_dir: str | Path, args: dict[str, Any] | None = None) -> Path:
        """Checkpoint the last completed epoch into ``checkpoint_dir``."""
        cfg = asdict(self.config)
        return save_checkpoint(checkpoint_dir, self.epoch, self.model, self.optimizer,
                               args=args if args is not None else cfg, history=self.history,
                               extra={"config": cfg, "dataset": str(self.dataset.path),
                                      "num_nodes": self.dataset.num_nodes},
                               dataset=self.dataset)

    def resume(self, path: str | Path) -> dict[str, Any]:
        """Continue from a checkpoint file: weights, optimizer, epoch, history, RNG.

        Raises:
            OocError: the checkpoint is of another dataset (meta.json
                fingerprint) or another model.
        """
        state = load_checkpoint(path, map_location="cpu")
        check_dataset(state, self.dataset, path)
        mine = describe_model(self.model)
        theirs = dict(state["model_config"])
        if theirs != mine:
            diff = ", ".join(f"{k}={theirs.get(k)!r} (now {mine.get(k)!r})"
                             for k in sorted(set(mine) | set(theirs))
                             if theirs.get(k) != mine.get(k))
            raise InvalidValue(f"{path}: checkpoint is for a different model or dataset: {diff}")
        try:
            self.model.load_state_dict(state["model_state"])
        except RuntimeError as e:
            raise InvalidValue(f"{path}: model weights do not load "
                           f"({str(e).splitlines()[0][:200]})") from None
        if state.get("optimizer_state") is not None:
            try:
                self.optimizer.load_state_dict(state["optimizer_state"])
            except (ValueError, KeyError, RuntimeError, TypeError, AttributeError) as e:
                raise InvalidValue(f"{path}: optimizer state does not load ({e})") from None
        self.epoch = int(state["epoch"])
        self.history = list(state.get("history") or [])
        if state.get("rng"):
            set_rng_state(state["rng"], path)
        return state

    # -- report --------------------------------------------------------------
    def report(self, **extra: Any) -> dict[str, Any]:
        """The JSON-friendly summary of the run so far."""
        last_val = next((r["val_acc"] for r in reversed(self.history)
                         if r.get("val_acc") is not None), None)
        ds = self.dataset
        avg_nodes = self.nodes_seen / self.batches_seen if self.batches_seen else 0.0
        rep = {
            "mode": self.config.mode,
            "device": str(self.device),
            "dataset": {"path": str(ds.path), "name": ds.meta.get("name"),
                        "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                        "feature_dim": ds.feature_dim, "num_classes": ds.num_classes,
                        "train": int(len(ds.train_idx)), "val": int(len(ds.val_idx)),
                        "test": int(len(ds.test_idx))},
            "model": describe_model(self.model),
            "config": asdict(self.config),
            "val_acc": last_val,
            "test_acc": None,
            "epochs": self.history,
            "timers": self.timers.as_dict(),
            "avg_batch_nodes": avg_nodes,
            "avg_batch_node_fraction": avg_nodes / ds.num_nodes if ds.num_nodes else 0.0,
            "peak_rss_bytes": peak_rss_bytes(),
            "mode_info": self.mode_info,
            "memory_plan": self.memory_plan.as_dict() if self.memory_plan else None,
        }
        rep.update(extra)
        return rep


def _proc_io() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                if k in ("read_bytes", "syscr"):
                    out["proc_" + k] = int(v)
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["major_faults"] = int(ru.ru_majflt)
    return out


def io_counters(producer) -> dict[str, Any]:
    """The I/O counters so far of ``producer`` (its loader's ``io_stats()``, when it has
    one) and of this process (``/proc/self/io`` bytes and read calls, major faults);
    :func:`io_delta` of two is an epoch's."""
    st = dict(producer.io_stats()) if hasattr(producer, "io_stats") else {}
    st.update(_proc_io())
    return st


def io_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Counters of one epoch (numeric differences); the hit ratio of the epoch."""
    out: dict[str, Any] = {}
    for k, v in b.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.endswith("ratio"):
            out[k] = v - a.get(k, 0)
        elif k.endswith("ratio"):
            continue
        else:
            out[k] = v
    if out.get("feature_lookups"):
        out["feature_hit_ratio"] = 1 - out.get("feature_misses", 0) / out["feature_lookups"]
    h, m = out.get("neighbor_cache_hits"), out.get("neighbor_cache_misses")
    if h is not None and m is not None and h + m:
        out["neighbor_cache_hit_ratio"] = h / (h + m)
    return out
