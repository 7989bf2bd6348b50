"""The settings of a training run, without torch.

``TrainConfig`` is what the CLI, the loader, the memory planner and the
trainer share; its fields, defaults and limits are the declarations of
:data:`ooc.executor.settings.TRAIN`. Keeping it free of torch lets the planner's
kernel-compile child and the CLI's option checks run before torch is imported.
"""
from __future__ import annotations

from dataclasses import dataclass

from ooc.executor.settings import BY_NAME, TRAIN, check_all, keywords_checked

_S = BY_NAME


@keywords_checked
@dataclass
class TrainConfig:
    """Settings of a training run; each field is the setting of the same name in
    :data:`ooc.executor.settings.TRAIN` (default, limits, help), besides ``progress``
    (progress bars) and ``eval_final`` (evaluate after the last epoch)."""

    model: str = _S["model"].field()
    task: str = _S["task"].field()
    decoder: str = _S["decoder"].field()
    edges_per_epoch: int | None = _S["edges_per_epoch"].field()
    fanouts: list[int] = _S["fanouts"].field()
    batch_size: int = _S["batch_size"].field()
    eval_batch_size: int | None = _S["eval_batch_size"].field()
    hidden: int = _S["hidden"].field()
    dropout: float = _S["dropout"].field()
    heads: int = _S["heads"].field()
    lr: float = _S["lr"].field()
    weight_decay: float = _S["weight_decay"].field()
    epochs: int = _S["epochs"].field()
    seed: int = _S["seed"].field()
    eval_every: int = _S["eval_every"].field()
    device: str = _S["device"].field()
    num_threads: int | None = _S["num_threads"].field()
    progress: bool = True
    mode: str = _S["mode"].field()
    eval_final: bool = True
    #: the largest factor by which one step may grow the weights (see ``finite.py``)
    max_weight_growth: float = _S["max_weight_growth"].field()

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def validate(self) -> None:
        """Check every setting (one-line :class:`InvalidValue` naming it as the caller
        wrote it: the flag on a command line, the keyword from Python)."""
        check_all(self, TRAIN)
