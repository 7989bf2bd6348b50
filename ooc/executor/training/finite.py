"""Finite numbers in training: a step whose loss or weights stop being finite, or
whose update blows the weights up, stops the run.

The watch costs no extra GPU/CPU synchronisation: :class:`UpdateWatch` leaves
its growth factor on the device, and the trainer reads it in the same
``tolist()`` as the step's accuracy counts (which it reads anyway).

The growth factor of a step is the largest, over the parameter tensors
``w_i``, of ``(|w_i'| + f_i) / (|w_i| + f_i)`` (``|.|``: Frobenius norm before
and after the step), with the floor ``f_i = rms(all weights) * sqrt(numel_i)``:
a tensor counts as at least as large as an average tensor of its size, so a
bias that starts at zero grows from the model's scale, not from zero. A step
that moves the weights by ``d`` grows a tensor by at least ``|d| / |w| - 1``
when ``|d|`` dominates, so an update orders of magnitude larger than the
weights shows up here without keeping a copy of the old weights. Normal steps
stay within a few percent of 1 (measured on Cora and the synthetic default;
README); a NaN or infinite weight makes the factor NaN or infinite.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ooc.core.errors import OocError, setting


class TrainingDiverged(OocError, FloatingPointError):
    """Training produced a non-finite loss or weights, or a step blew the weights up;
    the run stops (no checkpoint of that epoch)."""


class NonFiniteLoss(TrainingDiverged):
    """The training loss became NaN or infinite; the step was not taken."""


class ExplodingUpdate(TrainingDiverged):
    """A step left non-finite weights or grew them past the allowed factor."""


def _norms(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Frobenius norms of ``params``, float32 [len(params)] on their device (no sync)."""
    with torch.no_grad():
        return torch.stack([n.float() for n in torch._foreach_norm(list(params))])


class UpdateWatch:
    """The growth factor of every optimizer step, left on the device.

    ``start()`` before the first step of an epoch (weights may have been loaded
    or averaged in between); ``after_step()`` after each ``optimizer.step()``
    returns the step's factor as a 0-d tensor. The norms after one step are
    those before the next, so each step costs one norm pass over the weights.
    """

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params = [p for p in params if p.requires_grad]
        numel = torch.tensor([float(p.numel()) for p in self.params])
        self._sqrt_numel = numel.sqrt()
        self._total = float(numel.sum()) or 1.0
        self._before: torch.Tensor | None = None

    def start(self) -> None:
        self._before = _norms(self.params) if self.params else None
        if self._before is not None:
            self._sqrt_numel = self._sqrt_numel.to(self._before.device)

    def after_step(self) -> torch.Tensor:
        """The factor of the step just taken (float32 0-d tensor, on the weights' device)."""
        if not self.params:
            return torch.ones(())
        if self._before is None:
            self.start()
        before = self._before
        assert before is not None  # start() sets it when there are params
        after = _norms(self.params)
        rms = torch.sqrt((before * before).sum() / self._total)
        floor = rms * self._sqrt_numel + 1e-30
        self._before = after
        return ((after + floor) / (before + floor)).max()


def check_step(path, epoch: int, step: int, steps: int, loss: float, growth: float,
               limit: float) -> None:
    """Raise :class:`NonFiniteLoss` or :class:`ExplodingUpdate` naming the epoch and the
    step (1-based, of ``steps``) when ``loss`` or ``growth`` is out of bounds."""
    at = f"epoch {epoch}, batch {step} of {steps}"
    keep = f"training stopped before saving epoch {epoch}"
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"{path}: training loss is {loss} at {at} (non-finite features or "
                            f"weights, or {setting('--lr')} too high); {keep}")
    if not math.isfinite(growth):
        raise ExplodingUpdate(f"{path}: the weights are not finite after the step of {at} "
                              f"({setting('--lr')} too high?); {keep}")
    if growth > limit:
        raise ExplodingUpdate(f"{path}: the step of {at} grew the weights {growth:.3g}x, above "
                              f"{setting('--max-weight-growth')} {limit:g} ({setting('--lr')} too high?); "
                              f"{keep}")
