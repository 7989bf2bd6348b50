"""The settings of a training run (the CLI's options), without torch.

``TrainConfig`` is what the CLI, the loader, the memory planner and the
trainer share; keeping it free of torch lets the planner's kernel-compile
child and the CLI's option checks run before torch is imported.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...storage.errors import InvalidValue


@dataclass
class TrainConfig:
    """Settings of a training run (the CLI's options)."""

    model: str = "sage"
    fanouts: list[int] = field(default_factory=lambda: [10, 10])
    batch_size: int = 1024
    eval_batch_size: int | None = None
    hidden: int = 128
    dropout: float = 0.5
    heads: int = 4
    lr: float = 0.005
    weight_decay: float = 5e-4
    epochs: int = 3
    seed: int = 0
    eval_every: int = 1
    device: str = "auto"
    num_threads: int | None = None
    progress: bool = True
    mode: str = "ooc"
    eval_final: bool = True
    #: the largest factor by which one step may grow the weights (see ``finite.py``)
    max_weight_growth: float = 10.0

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def validate(self) -> None:
        """Range-check every setting (one-line :class:`OocError` naming the CLI option)."""
        from ...cli import check_range

        if not self.fanouts or any((f == 0 or f < -1) for f in self.fanouts):
            raise InvalidValue(f"bad fanouts {self.fanouts}: need one per layer, each > 0 or -1 (all)")
        for name, option, lo, hi in LIMITS:
            check_range(option, getattr(self, name), lo, hi, integer=True)
        check_range("--lr", self.lr, 0, None, lo_open=True)
        check_range("--weight-decay", self.weight_decay, 0, None)
        check_range("--dropout", self.dropout, 0, 1, hi_open=True)
        check_range("--max-weight-growth", self.max_weight_growth, 1, None, lo_open=True)


#: Integer settings of :class:`TrainConfig`: (field, CLI option, lowest, highest); a
#: None value passes (``num_threads``: all cores; ``eval_batch_size``: ``batch_size``).
LIMITS = (("batch_size", "--batch-size", 1, 1 << 30),
          ("eval_batch_size", "--eval-batch-size", 1, 1 << 30),
          ("hidden", "--hidden", 1, 1 << 16), ("heads", "--heads", 1, 256),
          ("epochs", "--epochs", 1, 10**9), ("eval_every", "--eval-every", 1, None),
          ("seed", "--seed", 0, (1 << 63) - 1), ("num_threads", "--threads", 1, 4096))
