"""The fused activation-and-dropout steps of the built-in models against torch's own,
side by side: ReLU (SAGE, GCN) and ELU (GAT), forward and backward.

    python -m bench activation --rows 88000 --dim 256 --dropout 0.6 --rounds 15

On a float32 [rows, dim] tensor (a hidden layer's output; 88k x 256 is layer 1 of
papers100M's training recipe, batch 1024 and fanouts 15,10,5), each round times, in
an order rotated every round: the fused forward (``relu_dropout`` / ``elu_dropout``),
its backward, and ``F.dropout(F.relu(h))`` / ``F.dropout(F.elu(h))`` forward and
backward. Prints the medians (ms) and the ratios; ``--report`` writes them as JSON.
"""
from __future__ import annotations

import argparse
import time

import ooc

ooc.configure_process()

import torch  # noqa: E402  (after configure_process: torch's threads as ooc sets them)
import torch.nn.functional as F  # noqa: E402

from ooc.executor.training.activation import elu_dropout, relu_dropout  # noqa: E402

from . import harness as H  # noqa: E402


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _case(act: str, fused: bool, h: torch.Tensor, p: float) -> tuple[float, float]:
    """Seconds of one forward and one backward pass."""
    x = h.detach().clone().requires_grad_()
    if fused:
        step = relu_dropout if act == "relu" else elu_dropout
        fwd = lambda: step(x * 1.0, p, True)  # noqa: E731
    else:
        f = F.relu if act == "relu" else F.elu
        fwd = lambda: F.dropout(f(x * 1.0), p, True)  # noqa: E731
    out: list[torch.Tensor] = []
    tf = _timed(lambda: out.append(fwd()))
    g = torch.ones_like(out[0])
    tb = _timed(lambda: out[0].backward(g))
    return tf, tb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench activation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=88_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.6)
    ap.add_argument("--rounds", type=int, default=15, help="measured rounds (after a warm-up)")
    ap.add_argument("--report", default=None)
    a = ap.parse_args(argv)
    if min(a.rows, a.dim, a.rounds) < 1 or not 0.0 <= a.dropout < 1.0:
        ap.error("--rows, --dim and --rounds must be at least 1, --dropout in [0, 1)")
    torch.manual_seed(0)
    h = torch.randn(a.rows, a.dim)

    def case(act: str, fused: bool):
        def run() -> dict[str, float]:
            tf, tb = _case(act, fused, h, a.dropout)
            return {"forward_ms": 1000 * tf, "backward_ms": 1000 * tb}
        return run

    cases = {f"{act}_{'fused' if fused else 'torch'}": case(act, fused)
             for act in ("relu", "elu") for fused in (True, False)}
    # the warm-up round loads the kernels and starts the pools
    rounds = H.run_rounds(cases, a.rounds)
    meds = H.medians(rounds)
    med = {f"{c}_{ps}": round(meds[c][f"{ps}_ms"], 2) for c in cases
           for ps in ("forward", "backward")}
    print(f"{a.rows} x {a.dim} float32, dropout {a.dropout}, {torch.get_num_threads()} threads, "
          f"medians of {a.rounds} (ms):")
    rep = {"rows": a.rows, "dim": a.dim, "dropout": a.dropout, "median_ms": med}
    print(table(rep))
    if a.report:
        H.write_report(a.report, "activation", rep, spec={"rows": a.rows, "dim": a.dim},
                       samples=rounds, args=a)
    return 0


def table(rep: dict) -> str:
    """Per activation and pass: the fused and torch's medians (ms) and their ratio."""
    med = rep["median_ms"]
    rows = []
    for act in ("relu", "elu"):
        for ps in ("forward", "backward"):
            fu, to = med[f"{act}_fused_{ps}"], med[f"{act}_torch_{ps}"]
            rows.append([act, ps, f"{fu:.1f}", f"{to:.1f}", f"{to / fu:.2f}x"])
    return H.markdown(["activation", "pass", "fused", "torch", "torch / fused"], rows,
                      ["l", "l", "r", "r", "r"])


if __name__ == "__main__":
    raise SystemExit(main())
