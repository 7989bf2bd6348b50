"""relu_dropout: F.dropout(F.relu(h))'s values and gradients for the elements it keeps,
its noise drawn by a counter-based kernel (checked against a numpy statement of the
draw), seeded from torch's generator; one byte per element kept for the backward pass.
GAT's elu_dropout: the same draws with ELU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ooc.executor.training import activation
from ooc.executor.training.activation import relu_dropout
from ooc.executor.training.models import build_model

GOLDEN, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _reference_keep(seed: int, n: int, p: float) -> np.ndarray:
    """bool [n]: which elements the draw of ``seed`` keeps, in numpy (splitmix64 of
    ``seed + GOLDEN * (pair + 1)``; element 2k takes the high 32 bits, 2k + 1 the low)."""
    with np.errstate(over="ignore"):
        j = np.arange(1, (n + 1) // 2 + 1, dtype=np.uint64)
        z = np.uint64(seed) + np.uint64(GOLDEN) * j
        z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
        z = z ^ (z >> np.uint64(31))
    draws = np.empty(2 * z.size, dtype=np.uint64)
    draws[0::2], draws[1::2] = z >> np.uint64(32), z & np.uint64(0xFFFFFFFF)
    return draws[:n] < round((1.0 - p) * 2**32)


def _seed_after(torch_seed: int) -> int:
    """The seed relu_dropout draws right after ``torch.manual_seed(torch_seed)``."""
    torch.manual_seed(torch_seed)
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


def _saved(fn, h):
    """Output of fn(h) and the (dtype, numel) of every tensor autograd saved for it."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(h)
    return out, saved


_LAST_SEED: list[int] = []


@pytest.fixture(autouse=True)
def _record_seed(monkeypatch):
    """Record each seed relu_dropout draws (the draw itself is unchanged)."""
    real = activation.draw_seed

    def recorded() -> int:
        s = real()
        _LAST_SEED.append(s)
        return s

    monkeypatch.setattr(activation, "draw_seed", recorded)
    yield
    _LAST_SEED.clear()


def _seed_after_last() -> int:
    return _LAST_SEED[-1]


@pytest.mark.parametrize("p", [0.5, 0.3, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_are_stock_dropouts_for_the_drawn_mask(p, dtype):
    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(2001, 37, generator=gen, dtype=dtype)   # odd count: the last draw
    h0[0, :5] = 0.0                                   # exact zeros: no gradient
    g = torch.randn(2001, 37, generator=gen, dtype=dtype)
    x = h0.clone().requires_grad_()
    y = relu_dropout(x * 1.0, p, True)
    (y * g).sum().backward()
    keep = torch.from_numpy(_reference_keep(_seed_after_last(), h0.numel(), p)).view(h0.shape)
    keep &= h0 > 0
    # stock dropout with this mask as its noise: relu(h) * (mask / (1 - p))
    noise = keep.to(dtype).div_(1.0 - p)
    xs = h0.clone().requires_grad_()
    ys = F.relu(xs * 1.0) * noise
    (ys * g).sum().backward()
    assert torch.equal(y, ys) and torch.equal(x.grad, xs.grad)
    assert not torch.signbit(y).any()                 # dropped and negative: +0.0
    assert (y == 0).to(torch.float64).mean() > p / 2  # dropout did drop


def test_draws_come_from_torchs_generator_and_match_the_reference():
    """The seed is one draw of torch's default generator (``manual_seed`` reproduces a
    call, the generator moves on by that draw) and the kernel's mask is the numpy
    statement's, element for element."""
    n = 3001
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        x = torch.ones(n, dtype=torch.float32, requires_grad=True)
        outs.append((relu_dropout(x * 1.0, 0.4, True).detach(), torch.rand(3)))
    (a, ra), (b, rb) = outs
    assert torch.equal(a, b) and torch.equal(ra, rb)
    seed = _seed_after(7)
    assert _LAST_SEED[-1] == seed
    assert torch.rand(3).equal(ra)                    # one draw, as relu_dropout took
    assert np.array_equal((a != 0).numpy(), _reference_keep(seed, n, 0.4))
    torch.manual_seed(8)
    c = relu_dropout(torch.ones(n, requires_grad=True) * 1.0, 0.4, True)
    assert not torch.equal(a, c.detach())


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_keep_rate_and_neighbouring_draws(p):
    """Kept with probability 1 - p, in both halves of a draw, and neighbours independent
    (joint rate (1 - p)^2), each within 6 standard deviations on 2^20 elements."""
    torch.manual_seed(0)
    n = 1 << 20
    kept = (relu_dropout(torch.ones(n, requires_grad=True) * 1.0, p, True) != 0).numpy()
    q = 1.0 - p

    def close(rate: float, prob: float, m: int) -> bool:
        return abs(rate - prob) <= 6 * (prob * (1 - prob) / m) ** 0.5

    assert close(kept.mean(), q, n)
    assert close(kept[0::2].mean(), q, n // 2) and close(kept[1::2].mean(), q, n // 2)
    assert close((kept[:-1] & kept[1:]).mean(), q * q, n - 1)
    assert close((kept[:-2] & kept[2:]).mean(), q * q, n - 2)


def test_nan_stays_nan():
    x = torch.tensor([float("nan"), -1.0, 2.0] * 100, requires_grad=True)
    y = relu_dropout(x * 1.0, 0.5, True)
    assert torch.isnan(y[0::3]).all() and (y[1::3] == 0).all()


def test_keeps_a_bool_mask_instead_of_float_copies():
    h = torch.randn(300, 64, requires_grad=True)
    _, stock = _saved(lambda x: F.dropout(F.relu(x * 1.0), 0.5, True), h)
    _, fused = _saved(lambda x: relu_dropout(x * 1.0, 0.5, True), h)
    n = 300 * 64
    assert sum(k for d, k in stock if d == torch.float32) >= 2 * n
    assert [(d, k) for d, k in fused if k == n] == [(torch.bool, n)]


def test_eval_no_grad_and_other_dtypes_take_the_stock_path():
    h = torch.randn(50, 8)
    assert torch.equal(relu_dropout(h, 0.5, False), F.relu(h))
    torch.manual_seed(3)
    a = relu_dropout(h, 0.5, True)                    # no grad: stock dropout
    torch.manual_seed(3)
    assert torch.equal(a, F.dropout(F.relu(h), 0.5, True))
    hb = torch.randn(50, 8, dtype=torch.bfloat16, requires_grad=True)
    torch.manual_seed(3)
    a = relu_dropout(hb, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(a, F.dropout(F.relu(hb), 0.5, True)) and not _LAST_SEED


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_model_training_step_is_stock_dropout_with_the_drawn_masks(kind, monkeypatch):
    """A training step of the built-in model gives the loss and gradients of the same
    model whose activation is ``F.relu(h) * noise`` (GAT: ``F.elu``) with the reference's
    masks (GAT's ELU derivative comes from its result: equal within rounding)."""
    from ooc.executor.training import models

    act, name = (F.elu, "elu_dropout") if kind == "gat" else (F.relu, "relu_dropout")

    def reference(h, p, training):
        keep = torch.from_numpy(_reference_keep(activation.draw_seed(), h.numel(), p))
        return act(h) * keep.view(h.shape).to(h.dtype).div_(1.0 - p)

    torch.manual_seed(0)
    n, e = 200, 1200
    x = torch.randn(n, 16, dtype=torch.float64)
    ei = torch.randint(0, n, (2, e))
    results = []
    for ref in (False, True):
        if ref:
            monkeypatch.setattr(models, name, reference)
        torch.manual_seed(5)
        m = build_model(kind, 16, 32, 4, 3).double()
        m.train()
        torch.manual_seed(6)
        loss = m(x, ei).square().mean()
        loss.backward()
        results.append((loss.detach(), [q.grad.clone() for q in m.parameters()]))
    (la, ga), (lb, gb) = results
    if kind == "gat":
        assert torch.allclose(la, lb, rtol=1e-12)
        assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(ga, gb, strict=True))
    else:
        assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(ga, gb, strict=True))


@pytest.mark.parametrize("n", [1, 2, 7, 3 * (1 << 15) + 1])
def test_kernels_across_blocks_and_an_odd_tail(n):
    """Forward and backward over several parallel blocks and an odd last element: the
    reference mask, kept values scaled, the gradient scaled where kept."""
    from ooc.executor.training import _activation_kernels as K

    h = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    g = np.random.default_rng(n + 1).standard_normal(n).astype(np.float32)
    scale, thr = np.float32(1 / 0.7), np.uint64(activation.keep_threshold(0.3))
    out, keep, grad = np.empty_like(h), np.empty(n, np.bool_), np.empty_like(g)
    K.relu_dropout_forward(h, np.uint64(12345), thr, scale, out, keep)
    K.masked_scale(g, keep, scale, grad)
    want = _reference_keep(12345, n, 0.3) & (h > 0)
    assert np.array_equal(keep, want)
    assert np.array_equal(out, np.where(want, h * scale, np.float32(0)))
    assert np.array_equal(grad, np.where(want, g * scale, np.float32(0)))


@pytest.mark.parametrize("p", [0.5, 0.2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elu_values_and_gradients_are_stock_dropouts_for_the_drawn_mask(p, dtype):
    """GAT's ELU: the draw alone decides (no sign condition); kept values ``elu(h) /
    (1 - p)``; gradients as ``F.elu(h) * noise``'s (its derivative taken from the result,
    so within rounding)."""
    from ooc.executor.training.activation import elu_dropout

    gen = torch.Generator().manual_seed(1)
    h0 = torch.randn(1001, 37, generator=gen, dtype=dtype) * 3
    g = torch.randn(1001, 37, generator=gen, dtype=dtype)
    x = h0.clone().requires_grad_()
    y = elu_dropout(x * 1.0, p, True)
    (y * g).sum().backward()
    keep = torch.from_numpy(_reference_keep(_seed_after_last(), h0.numel(), p)).view(h0.shape)
    noise = keep.to(dtype).div_(1.0 - p)
    xs = h0.clone().requires_grad_()
    ys = F.elu(xs * 1.0) * noise
    (ys * g).sum().backward()
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert torch.equal(y == 0, ~keep)                 # ELU is 0 only at 0: zeros = dropped
    assert torch.allclose(y, ys, **tol) and torch.allclose(x.grad, xs.grad, **tol)
    assert ((y < 0) & keep).any()                     # negative values kept, unlike ReLU
    assert not torch.signbit(y[~keep]).any()


def test_elu_special_values_are_stock_elu_times_the_noise():
    """NaN, infinities, zeros and negatives, kept or dropped, come out as ``F.elu(h) *
    noise`` does (``inf * 0`` is NaN there too; a dropped -inf is 0)."""
    from ooc.executor.training.activation import elu_dropout

    vals = [float("nan"), float("-inf"), float("inf"), -0.0, 0.0, -2.5, -1e-8, 3.0]
    h = torch.tensor(vals * 64, dtype=torch.float32, requires_grad=True)
    y = elu_dropout(h * 1.0, 0.5, True).detach()
    h = h.detach()
    keep = torch.from_numpy(_reference_keep(_seed_after_last(), h.numel(), 0.5))
    want = F.elu(h) * keep.to(torch.float32).div_(0.5)
    assert keep.any() and (~keep).any()
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    assert torch.allclose(y[~torch.isnan(y)], want[~torch.isnan(want)], rtol=1e-6, atol=0)


@pytest.mark.parametrize("n", [1, 7, 3 * (1 << 15) + 1])
def test_elu_kernels_across_blocks(n):
    from ooc.executor.training import _activation_kernels as K

    h = np.random.default_rng(n).standard_normal(n).astype(np.float64)
    g = np.random.default_rng(n + 1).standard_normal(n)
    scale = np.float64(1 / 0.6)
    out, keep, grad = np.empty_like(h), np.empty(n, np.bool_), np.empty_like(g)
    K.elu_dropout_forward(h, np.uint64(99), np.uint64(activation.keep_threshold(0.4)), scale,
                          out, keep)
    K.elu_masked_scale(g, keep, out, scale, grad)
    want = _reference_keep(99, n, 0.4)
    elu = np.where(h > 0, h, np.expm1(h))
    assert np.array_equal(keep, want)
    assert np.allclose(out, np.where(want, elu * scale, 0.0), rtol=1e-14, atol=0)
    assert np.allclose(grad, np.where(want, g * scale * np.where(h > 0, 1.0, np.exp(h)), 0.0),
                       rtol=1e-12, atol=1e-14)


def test_elu_keeps_the_mask_and_its_own_result():
    from ooc.executor.training.activation import elu_dropout

    h = torch.randn(300, 64, requires_grad=True)
    _, stock = _saved(lambda x: F.dropout(F.elu(x * 1.0), 0.5, True), h)
    out, fused = _saved(lambda x: elu_dropout(x * 1.0, 0.5, True), h)
    assert sorted(fused, key=str) == sorted([(torch.bool, h.numel()), (torch.float32, h.numel())],
                                            key=str)
    assert sum(torch.finfo(d).bits // 8 if d.is_floating_point else 1 for d, _ in stock) >= 5
    h2 = torch.randn(5, 3)
    assert torch.equal(elu_dropout(h2, 0.5, False), F.elu(h2))

