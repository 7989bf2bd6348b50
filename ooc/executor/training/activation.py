"""ReLU (or GAT's ELU) followed by dropout in one autograd node that keeps one byte per
element.

``F.dropout(F.relu(h), p)`` on the CPU keeps three float tensors of ``h``'s shape for
the backward pass (the ReLU's output, dropout's float noise and the result) and draws its
noise with ``bernoulli_``, one element at a time from torch's generator: a large share of
a training step on a few cores for the first layer's output of papers100M's recipe
(fanouts 15,10,5 and 1024 seeds: ~90k rows x 256). :func:`relu_dropout`
computes ``relu(h) * noise`` in one parallel pass whose noise is counter-based
(splitmix64 of the element's position and a seed, :mod:`._activation_kernels`), the seed
drawn from torch's default generator, so ``torch.manual_seed`` reproduces a run; it keeps
the result (the next layer's input) and a bool mask of the elements that pass both (12
bytes per element -> 5). The values and gradients are those of ``F.dropout(F.relu(h))``
for the same mask: kept elements are ``h * (1 / (1 - p))`` with the factor in ``h``'s
dtype, the others 0; each element is kept with probability ``round((1 - p) 2^32) / 2^32``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ooc.executor.training import _activation_kernels as K

#: dtypes the kernels take; others go through ``F.dropout``
KERNEL_DTYPES = (torch.float32, torch.float64)


def keep_threshold(p: float) -> int:
    """A 32-bit draw below this keeps its element: ``round((1 - p) * 2^32)``."""
    return min(1 << 32, max(0, round((1.0 - float(p)) * (1 << 32))))


def draw_seed() -> int:
    """One draw of torch's default generator (a 63-bit seed for a call's noise)."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


def _scale(p: float, dtype: torch.dtype) -> np.generic:
    """``1 / (1 - p)`` as ``dtype`` computes it (ATen's dropout divides its noise so)."""
    return torch.ones(1, dtype=dtype).div_(1.0 - p).numpy()[0]


def _forward(kernel, h: Tensor, p: float) -> tuple[Tensor, Tensor, np.generic]:
    """Run a forward ``kernel`` of :mod:`._activation_kernels` on ``h`` with a fresh seed:
    (the result, the bool keep mask, the scale ``1 / (1 - p)`` in ``h``'s dtype)."""
    src = h.detach().contiguous()
    out = torch.empty_like(src)
    keep = torch.empty(src.shape, dtype=torch.bool)
    scale = _scale(p, src.dtype)
    kernel(src.view(-1).numpy(), np.uint64(draw_seed()), np.uint64(keep_threshold(p)), scale,
           out.view(-1).numpy(), keep.view(-1).numpy())
    return out, keep, scale


class _ReluDropout(torch.autograd.Function):
    """``relu(h) * noise`` (noise ``1 / (1 - p)`` where kept, else 0); the backward
    pass multiplies the gradient by the same factor where the mask is set, as
    ``threshold_backward`` after the noise product does."""

    @staticmethod
    def forward(ctx, h: Tensor, p: float) -> Tensor:  # type: ignore[override]
        out, keep, ctx.scale = _forward(K.relu_dropout_forward, h, p)
        ctx.save_for_backward(keep)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        g = grad.contiguous()
        out = torch.empty_like(g)
        K.masked_scale(g.view(-1).numpy(), keep.view(-1).numpy(), ctx.scale, out.view(-1).numpy())
        return out, None


class _EluDropout(torch.autograd.Function):
    """``elu(h) * noise``; the backward pass takes ELU's derivative from the result (as
    torch's ELU backward does from its own), which the next layer keeps anyway: besides
    it only the byte mask is saved (stock: ELU's float result and dropout's mask)."""

    @staticmethod
    def forward(ctx, h: Tensor, p: float) -> Tensor:  # type: ignore[override]
        out, keep, ctx.scale = _forward(K.elu_dropout_forward, h, p)
        ctx.save_for_backward(keep, out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        keep, out = ctx.saved_tensors
        g = grad.contiguous()
        res = torch.empty_like(g)
        K.elu_masked_scale(g.view(-1).numpy(), keep.view(-1).numpy(), out.view(-1).numpy(),
                           ctx.scale, res.view(-1).numpy())
        return res, None


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels for float32, the models' dtype."""
    h = np.array([1.0, -1.0, 2.0], dtype=np.float32)
    out, keep = np.empty_like(h), np.empty(3, dtype=np.bool_)
    scale = _scale(0.5, torch.float32)
    K.relu_dropout_forward(h, np.uint64(1), np.uint64(keep_threshold(0.5)), scale, out, keep)
    K.masked_scale(h, keep, scale, out)
    K.elu_dropout_forward(h, np.uint64(1), np.uint64(keep_threshold(0.5)), scale, out, keep)
    K.elu_masked_scale(h, keep, out, scale, np.empty_like(h))


def _takes_kernels(h: Tensor, p: float, training: bool) -> bool:
    """Whether the fused kernels apply: training on the CPU with ``0 < p < 1``, ``h`` of
    float32 or float64 with a gradient to compute."""
    return (training and 0.0 < p < 1.0 and h.device.type == "cpu" and h.requires_grad
            and h.dtype in KERNEL_DTYPES)


def relu_dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(F.relu(h), p, training)``: the same values and gradients for the
    elements it keeps; on the CPU in training with ``0 < p < 1``, ``h`` of float32 or
    float64 and a gradient to compute, the noise comes from :mod:`._activation_kernels`
    (see the module docstring) and it keeps ``h.numel()`` bytes for the backward pass
    besides the result instead of two float copies of ``h``.

    Args:
        h: [n, d] float rows (the layer's convolution output).
        p: the dropout probability.
        training: whether dropout applies.

    Returns:
        [n, d], ``h``'s dtype and device.
    """
    if not _takes_kernels(h, p, training):
        return F.dropout(F.relu(h), p=p, training=training)
    return _ReluDropout.apply(h, float(p))


def elu_dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(F.elu(h), p, training)`` as :func:`relu_dropout` does ReLU's (GAT's
    activation): the same draws, the kept elements ``elu(h) / (1 - p)``, the others 0;
    arguments and result as :func:`relu_dropout`'s."""
    if not _takes_kernels(h, p, training):
        return F.dropout(F.elu(h), p=p, training=training)
    return _EluDropout.apply(h, float(p))
