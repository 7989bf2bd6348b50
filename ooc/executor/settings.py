"""The settings of a training run, declared once.

Each :class:`Setting` gives a name (the Python keyword and the field of
:class:`~ooc.executor.training.config.TrainConfig` or
:class:`~ooc.executor.loader.stack.ModeOptions`), its default, limits and help. From
these declarations come:

* the fields and defaults of ``TrainConfig`` (:data:`TRAIN`), ``ModeOptions``
  (:data:`MODE`) and the loader's ``SamplingSettings`` (:data:`SAMPLING`, which
  ``TrainConfig`` has too), and their ``validate()``;
* the options of ``python -m ooc.train`` (:func:`add_arguments`), with :data:`RUN`,
  the settings only the command line has (checkpoints, workers and partitions);
* the keyword defaults of :class:`ooc.NodeLoader` (:func:`default`).

A refused value is one :class:`~ooc.core.errors.InvalidValue` line that names the
setting the way its caller wrote it: ``--batch-size`` on a command line,
``batch_size`` from Python.

Torch-free: the CLI checks every setting before torch is imported.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

import numpy as np

from ooc.core.errors import InvalidValue, UnknownSetting, setting
from ooc.core.sizes import check_range, format_size, parse_size
from ooc.executor.loader.presets import PRESET_NAMES
from ooc.storage.io_backends import REGISTRY

_C = TypeVar("_C", bound=type)

#: Kinds of setting: how a value is checked and how the command line reads it.
KINDS = ("int", "float", "size", "choice", "text", "fanouts", "flag")


def _presets() -> tuple[str, ...]:
    return PRESET_NAMES


def _backends() -> tuple[str, ...]:
    return ("auto",) + tuple(REGISTRY)


@dataclass(frozen=True)
class Setting:
    """One setting.

    Attributes:
        name: the Python keyword (and dataclass field).
        default: the value when not given (sizes in bytes, fanouts a tuple).
        help: the command line's help text (``%(default)s`` is not used: the default is
            appended when it is not None).
        kind: one of :data:`KINDS`.
        lo, hi: bounds of an int, float or size (None: unbounded); ``lo_open`` and
            ``hi_open`` make them strict.
        choices: the accepted values of a ``choice`` (or a function giving them, for
            lists known only at run time).
        flag: the command-line option when it is not ``--`` + the name with dashes.
        metavar: the command line's placeholder.
    """

    name: str
    default: Any
    help: str
    kind: str = "int"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    flag: str = ""
    metavar: str | None = None

    @property
    def option(self) -> str:
        """The command-line option, e.g. ``--batch-size``."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The key of the command line's parsed settings (and of a checkpoint's ``args``)."""
        return self.option[2:].replace("-", "_")

    def label(self) -> str:
        """The setting's name as the caller wrote it (flag or keyword)."""
        return setting(self.option, self.name)

    def allowed(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else self.choices

    def check(self, value: Any) -> Any:
        """``value`` checked (a size given as text becomes bytes); None passes for a setting
        whose default is None. Raises :class:`InvalidValue` naming the setting."""
        if value is None and self.default is None:
            return None
        if self.kind in ("int", "float"):
            check_range(self.label(), value, self.lo, self.hi, lo_open=self.lo_open,
                        hi_open=self.hi_open, integer=self.kind == "int")
        elif self.kind == "size":
            value = self.size(value)
        elif self.kind == "choice" and value not in self.allowed():
            raise InvalidValue(f"{self.label()} {value!r}: expected one of "
                               f"{', '.join(self.allowed())}")
        elif self.kind == "fanouts":
            value = check_fanouts(value, self.label())
        return value

    def size(self, value: Any) -> int:
        """Bytes of a size setting (``512MiB``, ``8GiB`` or an int)."""
        try:
            n = parse_size(value) if not isinstance(value, bool) else None
        except InvalidValue:
            n = None
        if n is None:
            raise InvalidValue(f"{self.label()} {value!r}: not a size (e.g. 512MiB, 8GiB)")
        if self.lo is not None and n < self.lo:
            hint = " (leave the setting out for no budget)" if self.name == "memory_budget" else ""
            raise InvalidValue(f"{self.label()} {value}: must be at least {int(self.lo)} "
                               f"byte{'s' if self.lo != 1 else ''}{hint}")
        return n

    def from_cli(self, value: Any) -> Any:
        """The Python value of what the command line holds (fanouts text to a list)."""
        if self.kind == "fanouts" and isinstance(value, str):
            return parse_fanouts(value, self.label())
        if self.kind == "size" and value is not None:
            return self.size(value)
        return value

    def cli_default(self) -> Any:
        """The default as the command line writes it."""
        if self.kind == "fanouts":
            return ",".join(str(v) for v in self.default)
        if self.kind == "size" and self.default:
            return format_size(self.default).replace(" ", "").replace(".0", "")
        return self.default

    def field(self) -> Any:
        """A dataclass field with this default."""
        if isinstance(self.default, (list, tuple)):
            return dataclasses.field(default_factory=lambda: list(self.default))
        return dataclasses.field(default=self.default)

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add this setting's option to a parser."""
        kw: dict[str, Any] = {"help": self.help}
        if self.default is not None and self.kind not in ("flag",):
            kw["help"] += f" (default {self.cli_default()})"
        if self.kind == "flag":
            kw["action"] = "store_true"
        elif self.kind == "int":
            kw["type"], kw["metavar"] = int, "N"
        elif self.kind == "float":
            kw["type"], kw["metavar"] = float, "X"
        elif self.kind == "choice":
            kw["choices"] = self.allowed()
            kw["metavar"] = "{" + ",".join(self.allowed()) + "}"
        if self.metavar:
            kw["metavar"] = self.metavar
        parser.add_argument(self.option, **kw)


def parse_fanouts(text: str, label: str = "--fanouts") -> list[int]:
    """``"15,10,5"`` -> ``[15, 10, 5]``; :class:`InvalidValue` naming ``label``. An empty
    field (``10,,10``, ``10,10,``) is refused: a layer left out would train a shallower
    model than the one written."""
    fields = str(text).replace(" ", "").split(",")
    if "" in fields:
        where = (f"field {fields.index('') + 1} of {len(fields)} is empty" if str(text).strip()
                 else "no value")
        raise InvalidValue(f"{label} {text!r}: {where}; write one integer per layer between "
                           f"the commas, e.g. 10,10")
    try:
        values = [int(t) for t in fields]
    except ValueError:
        raise InvalidValue(f"{label} {text!r}: expected comma-separated integers, e.g. 10,10") \
            from None
    return check_fanouts(values, label, shown=repr(text))


def check_fanouts(values: Any, label: str = "fanouts", shown: str | None = None) -> list[int]:
    """A list of ints, one per layer, each > 0 or -1 (all); else :class:`InvalidValue`
    naming ``label`` and the value as given (``shown``)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidValue(f"{label} {values!r}: a list with one int per layer, e.g. [10, 10]")
    given = list(values)
    whole = all((isinstance(f, (int, np.integer)) and not isinstance(f, bool))
                or (isinstance(f, float) and f.is_integer()) for f in given)
    fanouts = [int(f) for f in given] if whole else []
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise InvalidValue(f"{label} {shown or given}: one value per layer, each > 0 or -1 "
                           f"(all)")
    return fanouts


_PRESET_HELP = ("preset: baseline = memmaps and the page cache, no app caches (PyG+); static "
                "= neighbor cache + static degree-ordered feature cache, O_DIRECT (Ali+PG); ooc "
                "= neighbor cache + superbatch inspector + Belady feature cache, O_DIRECT (Ginex)")

#: How batches are sampled (fields of ``SamplingSettings``, the loader's; ``TrainConfig``
#: has them too, in :data:`TRAIN`).
SAMPLING: tuple[Setting, ...] = (
    Setting("fanouts", (10, 10), "neighbours sampled per layer, -1 = all; sets the number of "
            "layers", "fanouts", metavar="F1,F2,.."),
    Setting("batch_size", 1024, "seeds per batch", lo=1, hi=1 << 30),
    Setting("seed", 0, "random seed", lo=0, hi=(1 << 63) - 1),
    Setting("num_threads", None, "sampler threads (default: all cores)", lo=1, hi=4096,
            flag="--threads"),
)
_SAMPLING = {s.name: s for s in SAMPLING}

#: The model, the optimisation and the sampling (fields of ``TrainConfig``).
TRAIN: tuple[Setting, ...] = (
    Setting("mode", "ooc", _PRESET_HELP, "choice", choices=_presets),
    Setting("model", "sage", "GNN: GraphSAGE, GCN or GAT", "choice", choices=("sage", "gcn", "gat")),
    Setting("task", "node", "node: classify nodes; link: predict edges (the dataset's link "
            "split from ooc.prepare --link-split; the GNN encodes, --decoder scores pairs; "
            "--model defaults to gcn; GraphSAGE with the dot decoder wants --lr 0.0005, "
            "at 0.005 its scores can collapse to one value, AUC 0.5)",
            "choice", choices=("node", "link")),
    Setting("decoder", "dot", "link task: score of a pair from its ends' embeddings, dot "
            "product or an MLP of their elementwise product", "choice", choices=("dot", "mlp")),
    Setting("edges_per_epoch", None, "link task: positive edges an epoch trains on, a new "
            "seeded sample each epoch (default: every training edge)", lo=1, hi=1 << 62),
    _SAMPLING["fanouts"],
    _SAMPLING["batch_size"],
    Setting("eval_batch_size", None, "seeds per evaluation batch (default: --batch-size)",
            lo=1, hi=1 << 30),
    Setting("hidden", 128, "hidden width", lo=1, hi=1 << 16),
    Setting("heads", 4, "GAT attention heads", lo=1, hi=256),
    Setting("lr", 0.005, "Adam learning rate", "float", lo=0, lo_open=True),
    Setting("weight_decay", 5e-4, "Adam weight decay", "float", lo=0),
    Setting("dropout", 0.5, "dropout", "float", lo=0, hi=1, hi_open=True),
    Setting("max_weight_growth", 10.0, "stop when one step grows the weights more than X "
            "times (an exploding update; normal steps stay within a few percent)", "float",
            lo=1, lo_open=True, metavar="X"),
    Setting("epochs", 3, "train until this epoch", lo=1, hi=10**9),
    _SAMPLING["seed"],
    Setting("device", "auto", "auto: CUDA when available", "choice",
            choices=("auto", "cpu", "cuda")),
    Setting("eval_every", 1, "evaluate on the validation split every N epochs", lo=1),
    _SAMPLING["num_threads"],
)

#: The caches and the I/O (fields of ``ModeOptions``; keywords of ``NodeLoader``).
MODE: tuple[Setting, ...] = (
    Setting("memory_budget", None, "bound the process's memory: the caches get what is left "
            "after the measured working memory and a reserve", "size", lo=1, metavar="SIZE"),
    Setting("feature_cache_size", None, "feature cache bytes (default: from --memory-budget, "
            "else 10%% of the features)", "size", lo=0, metavar="SIZE"),
    Setting("neighbor_cache_size", None, "neighbor cache bytes (default: from "
            "--memory-budget, else 25%% of the full cache)", "size", lo=0, metavar="SIZE"),
    Setting("superbatch_size", None, "batches per superbatch (ooc; default: the largest whose "
            "runtime files fit --runtime-disk-budget)", lo=1),
    Setting("runtime_dir", None, "runtime files (default <data>/runtime)", "text",
            metavar="DIR"),
    Setting("runtime_disk_budget", 1 << 30, "disk for runtime files", "size", lo=1,
            metavar="SIZE"),
    Setting("queue_depth", 64, "io_uring queue depth", lo=1, hi=4096),
    Setting("io_threads", 16, "baseline memmap copy threads", lo=1, hi=1024),
    Setting("io_backend", "auto", "how features and neighbour lists are read from disk: auto "
            "= the first that works here (a native backend is probed in a child process "
            "first; a fallback is one note on stderr)", "choice", choices=_backends),
    Setting("page_reads", False, "read whole 4 KiB pages even where the device takes 512 B "
            "O_DIRECT reads (by default a feature row or neighbour list smaller than a page "
            "is read as the 512 B sectors it occupies)", "flag"),
    Setting("read_gap", 12 << 10, "read through gaps of at most SIZE between the bytes a "
            "request wants (one read instead of two: a read costs an SSD more than a few "
            "pages' transfer): between feature rows smaller than a page in bytes, else whole "
            "pages; 0: read only the wanted rows' sectors and lists' pages", "size", lo=0,
            metavar="SIZE"),
)

#: Settings only ``python -m ooc.train`` has: evaluation, checkpoints, model averaging.
RUN: tuple[Setting, ...] = (
    Setting("no_eval", False, "skip validation/test evaluation", "flag"),
    Setting("checkpoint_every", 1, "epochs between checkpoints", lo=1),
    Setting("workers", None, "Q worker processes with model averaging (torch.distributed gloo "
            "on 127.0.0.1, or the torchrun environment); 1 simulates the partitions "
            "sequentially in this process", lo=1, hi=256),
    Setting("partitions", None, "P partitions, partition j on worker j mod Q (default: the "
            "workload-allocation rule from --memory-budget)", lo=1, hi=1 << 16),
    Setting("sync_every", 1, "average the local models every K epochs", lo=1),
    Setting("optimizer_sync", "average", "at each sync, average the local Adam states with "
            "the weights, or restart every local Adam", "choice", choices=("average", "reset")),
    Setting("halo_hops", None, "hops of in-neighbourhood each partition holds when --workers "
            "partitions the graph itself (default: the number of layers, so sampled "
            "neighbourhoods are the whole graph's; 1 = SDT-GNN's full in-neighbour lists "
            "only, smaller partitions)", lo=1, hi=64),
    Setting("compute_fraction", None, "T/M: share of the per-worker --memory-budget the "
            "computation needs (default 2/3)", "float", lo=0, hi=1, lo_open=True, hi_open=True),
    Setting("partition_dir", None, "partition folder (default <data>.partitions/spring_p<P>, "
            "partitioned with SPRING when missing)", "text", metavar="DIR"),
    Setting("overwrite", False, "replace the checkpoints of another run in --checkpoint-dir, "
            "and ooc's partitions of another dataset or other settings in --partition-dir "
            "(never files ooc did not write)", "flag"),
)

#: Every setting by name.
BY_NAME: dict[str, Setting] = {s.name: s for s in TRAIN + MODE + RUN}


def default(name: str) -> Any:
    """The declared default of setting ``name``."""
    return BY_NAME[name].default


def check_all(obj: Any, settings: Sequence[Setting]) -> None:
    """Check every setting of ``obj`` (a ``TrainConfig`` or ``ModeOptions``), storing sizes
    given as text as bytes; the first bad one raises :class:`InvalidValue`."""
    for s in settings:
        value = s.check(getattr(obj, s.name))
        if value is not getattr(obj, s.name):
            setattr(obj, s.name, value)


def check_keywords(owner: str, given: Iterable[str], valid: Sequence[str]) -> None:
    """Refuse the first of ``given`` (keyword arguments of ``owner``) that is not in
    ``valid``: :class:`UnknownSetting` naming it and the closest valid keyword (or all of
    them when none is close)."""
    for key in given:
        if key in valid:
            continue
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the settings: {', '.join(valid)}"
        raise UnknownSetting(f"{owner}: no setting {key!r} ({hint})")


def keywords_checked(cls: _C) -> _C:
    """A dataclass whose constructor refuses an unknown keyword with
    :func:`check_keywords` (Python's own error would be a bare ``TypeError``)."""
    init = vars(cls)["__init__"]  # the one the dataclass wrote
    names = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        check_keywords(cls.__name__, kwargs, names)
        init(self, *args, **kwargs)

    cls.__init__ = checked  # type: ignore[misc]
    return cls


def add_arguments(parser: argparse.ArgumentParser, settings: Sequence[Setting]) -> None:
    """Add the options of ``settings`` to a command line's parser."""
    for s in settings:
        s.add_to(parser)
