"""relu_dropout gives F.dropout(F.relu(h))'s values, gradients and random draws, and keeps
one byte per element for the backward pass instead of float copies."""
import pytest
import torch
import torch.nn.functional as F

from ooc.executor.training.activation import relu_dropout
from ooc.executor.training.models import build_model


def _saved(fn, h):
    """Output of fn(h) and the (dtype, numel) of every tensor autograd saved for it."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(h)
    return out, saved


@pytest.mark.parametrize("p", [0.5, 0.3, 0.1])
def test_values_gradients_and_draws_equal_stock_dropout(p):
    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(2000, 37, generator=gen)
    h0[0, :5] = 0.0                                   # exact zeros: no gradient either way
    g = torch.randn(2000, 37, generator=gen)
    outs = []
    for fn in (lambda h: F.dropout(F.relu(h), p, True), lambda h: relu_dropout(h, p, True)):
        x = h0.clone().requires_grad_()
        torch.manual_seed(1)
        y = fn(x * 1.0)
        (y * g).sum().backward()
        outs.append((y.detach(), x.grad, torch.rand(3)))   # the next draws: same RNG use
    (ya, ga, ra), (yb, gb, rb) = outs
    assert torch.equal(ya, yb) and torch.equal(ga, gb) and torch.equal(ra, rb)
    assert (ya == 0).float().mean() > p / 2           # dropout did drop


def test_keeps_a_bool_mask_instead_of_float_copies():
    h = torch.randn(300, 64, requires_grad=True)
    _, stock = _saved(lambda x: F.dropout(F.relu(x * 1.0), 0.5, True), h)
    _, fused = _saved(lambda x: relu_dropout(x * 1.0, 0.5, True), h)
    n = 300 * 64
    assert sum(k for d, k in stock if d == torch.float32) >= 2 * n
    assert [(d, k) for d, k in fused if k == n] == [(torch.bool, n)]


def test_eval_and_no_grad_take_the_stock_path():
    h = torch.randn(50, 8)
    assert torch.equal(relu_dropout(h, 0.5, False), F.relu(h))
    torch.manual_seed(3)
    a = relu_dropout(h, 0.5, True)                    # no grad: stock dropout
    torch.manual_seed(3)
    assert torch.equal(a, F.dropout(F.relu(h), 0.5, True))


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_model_training_step_is_unchanged(kind, monkeypatch):
    """A training step of the built-in model gives the same loss and gradients as with
    the stock activation and dropout."""
    from ooc.executor.training import models

    torch.manual_seed(0)
    n, e = 200, 1200
    x = torch.randn(n, 16)
    ei = torch.randint(0, n, (2, e))
    results = []
    for stock in (False, True):
        if stock:
            monkeypatch.setattr(models, "relu_dropout",
                                lambda h, p, training: F.dropout(F.relu(h), p, training))
        torch.manual_seed(5)
        m = build_model(kind, 16, 32, 4, 3)
        m.train()
        torch.manual_seed(6)
        loss = m(x, ei).square().mean()
        loss.backward()
        results.append((loss.detach(), [q.grad.clone() for q in m.parameters()]))
    (la, ga), (lb, gb) = results
    assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(ga, gb))
