"""ReLU followed by dropout in one autograd node that keeps one byte per element.

``F.dropout(F.relu(h), p)`` on the CPU keeps three float tensors of ``h``'s shape for
the backward pass: the ReLU's output, dropout's float noise and the result. In a
sampled batch the first layer's output is the largest tensor of the step (papers100M's
recipe, fanouts 15,10,5 and 1024 seeds: ~90k rows x 256), so those copies are most of a
training step's memory. :func:`relu_dropout` computes the same result from the same
random draws and keeps the result (the next layer's input) and a bool mask of the
elements that pass both (12 bytes per element -> 5).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _ReluDropout(torch.autograd.Function):
    """``relu(h) * noise`` with ``noise`` drawn as ATen's CPU dropout draws it
    (``empty_like(h).bernoulli_(1 - p).div_(1 - p)``); the backward pass multiplies the
    gradient by the same factor where the mask is set, as ``threshold_backward`` after
    the noise product does."""

    @staticmethod
    def forward(ctx, h: Tensor, p: float) -> Tensor:  # type: ignore[override]
        noise = torch.empty_like(h).bernoulli_(1.0 - p)
        keep = noise.bool()
        keep &= h > 0
        noise.div_(1.0 - p)
        # the factor as float32 computes it, so the gradients are bitwise those of F.dropout
        scale = float(torch.ones((), dtype=h.dtype).div_(1.0 - p))
        out = torch.relu(h).mul_(noise)
        del noise
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return (grad * ctx.scale).masked_fill_(keep.logical_not(), 0.0), None


def relu_dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(F.relu(h), p, training)``, with the same values, gradients and random
    draws; on the CPU in training with ``0 < p < 1`` it keeps ``h.numel()`` bytes for
    the backward pass besides the result instead of two float copies of ``h``.

    Args:
        h: [n, d] float rows (the layer's convolution output).
        p: the dropout probability.
        training: whether dropout applies.

    Returns:
        [n, d], ``h``'s dtype and device.
    """
    if not training or not 0.0 < p < 1.0 or h.device.type != "cpu" or not h.requires_grad:
        return F.dropout(F.relu(h), p=p, training=training)
    return _ReluDropout.apply(h, float(p))
