"""Model averaging and workload allocation (SDT-GNN §III-C, §III-D; DESIGN.md §6).

Pure functions, no process group:
:mod:`ooc.executor.distributed.averaging_trainer` drives them.

* **Workload allocation** (:func:`allocate_partitions`): with ``q`` workers of
  ``M`` bytes each, ``T`` of which the computation needs, and ``S`` bytes of
  graph + feature data on disk, the graph is cut into ``p = q`` partitions
  when ``S <= q (M - T)``, else into ``ceil(S / (M - T))``. ``T`` defaults to
  ``2/3 M`` (the paper's conservative estimate).
* **Assignment** (:func:`assign_partitions`): partition ``j`` goes to worker
  ``j mod q``; a worker trains its local models one after the other.
* **Averaging** (:func:`weighted_sum`, :func:`finish_average`): the averaged
  weights are ``w = sum_j alpha_j w_j`` with ``alpha_j = n_j / sum_i n_i``,
  ``n_j`` the training nodes of partition ``j``. Each worker computes its
  partial sum ``sum_{j mine} n_j w_j`` (float64), the partial sums and the
  weights are summed over workers (``all_reduce``), and the quotient is
  loaded into every local model.
* **Optimizer state** (:func:`optimizer_entries`, :func:`optimizer_state`):
  with ``--optimizer-sync average`` (default) the local Adam states (``step``,
  ``exp_avg``, ``exp_avg_sq`` of every parameter) are averaged with the same
  weights in the same ``all_reduce`` and every local model continues from
  them; ``reset`` restarts each local Adam from zero, as federated-averaging
  clients do. Restarting Adam every epoch makes each step a fresh
  ``lr * sign(g)``-like step and the averaged model learns slowly (measured
  with ``python -m bench averaging``).
"""
from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from ooc.core.errors import InvalidValue, setting
from ooc.executor.training.finite import TrainingDiverged

#: Default share of the per-worker memory budget that the computation needs (T / M).
DEFAULT_COMPUTE_FRACTION = 2.0 / 3.0

def dataset_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk of a dataset folder's own files (S in the allocation rule).

    Counts the regular files directly inside ``path`` (CSC, features, labels,
    splits, metadata); sub-folders such as runtime files are not data.
    """
    p = Path(path)
    if not p.is_dir():
        raise InvalidValue(f"{p}: not a dataset folder")
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file())


def allocate_partitions(data_bytes: int, workers: int, memory_budget: int | None,
                        compute_bytes: int | None = None,
                        compute_fraction: float = DEFAULT_COMPUTE_FRACTION) -> int:
    """The number of partitions ``p`` (SDT-GNN §III-C).

    Args:
        data_bytes: ``S``, the dataset's bytes on disk.
        workers: ``q >= 1``.
        memory_budget: ``M``, bytes per worker; None: unbounded, ``p = q``.
        compute_bytes: ``T``, bytes the computation needs (``0 <= T < M``);
            None: ``compute_fraction * M``.
        compute_fraction: ``T / M`` when ``compute_bytes`` is None (in [0, 1)).

    Returns:
        ``q`` if ``S <= q (M - T)``, else ``ceil(S / (M - T))``.
    """
    if int(workers) < 1:
        raise InvalidValue(f"{setting('--workers')} must be >= 1, got {workers}")
    if data_bytes < 0:
        raise InvalidValue(f"dataset size must be >= 0, got {data_bytes}")
    if memory_budget is None:
        return int(workers)
    m = int(memory_budget)
    if m <= 0:
        raise InvalidValue(f"{setting('--memory-budget')} must be > 0, got {memory_budget}")
    # exact rational arithmetic: 2/3 M is not a float, and the rule has a boundary
    if compute_bytes is None:
        if not 0.0 <= compute_fraction < 1.0:
            raise InvalidValue(f"{setting('--compute-fraction')} must be in [0, 1), got {compute_fraction}")
        t = Fraction(compute_fraction).limit_denominator(10**6) * m
    else:
        t = Fraction(compute_bytes)
        if not 0 <= t < m:
            raise InvalidValue(f"compute memory T={compute_bytes} must be in [0, M={m})")
    free = m - t
    if data_bytes <= workers * free:
        return int(workers)
    return int(math.ceil(Fraction(int(data_bytes)) / free))


def assign_partitions(parts: int, workers: int) -> list[list[int]]:
    """Cyclic assignment: ``out[r]`` lists the partitions of worker ``r`` (``j mod q == r``).

    With ``p < q`` the last ``q - p`` workers get none.
    """
    if parts < 1 or workers < 1:
        raise InvalidValue(f"need parts >= 1 and workers >= 1, got {parts} and {workers}")
    return [list(range(r, parts, workers)) for r in range(workers)]


#: Per-parameter entries of the trainer's optimizer (``torch.optim.Adam``) that are averaged.
ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq")
#: Prefix of optimizer entries in the flat state that one ``all_reduce`` sums.
OPTIM_PREFIX = "optim."


def optimizer_entries(state: Mapping[int, Mapping[str, torch.Tensor]],
                      params: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """An Adam ``state_dict()["state"]`` as flat entries ``optim.{i}.{key}``.

    ``params``: the model's parameters in optimizer order (their shapes give
    the zeros of a parameter without state yet: an optimizer that never
    stepped). ``step`` is a float32 scalar, the moments have the parameter's
    shape.
    """
    out: dict[str, torch.Tensor] = {}
    for i, p in enumerate(params):
        s = state.get(i, {})
        step = s.get("step", 0.0)
        out[f"{OPTIM_PREFIX}{i}.step"] = torch.as_tensor(step, dtype=torch.float32).reshape(())
        for key in ADAM_KEYS[1:]:
            v = s.get(key)
            out[f"{OPTIM_PREFIX}{i}.{key}"] = v if v is not None else torch.zeros_like(p.detach())
    return out


def optimizer_state(entries: Mapping[str, torch.Tensor], num_params: int
                    ) -> dict[int, dict[str, torch.Tensor]]:
    """Inverse of :func:`optimizer_entries`: an Adam ``state`` dict (fresh tensors)."""
    return {i: {key: entries[f"{OPTIM_PREFIX}{i}.{key}"].detach().clone() for key in ADAM_KEYS}
            for i in range(num_params)}


def averageable(value: torch.Tensor) -> bool:
    """Whether a state entry is averaged (floating tensors); others are kept as they are."""
    return torch.is_tensor(value) and value.is_floating_point()


def weighted_sum(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
                 ) -> dict[str, torch.Tensor]:
    """``sum_j weights[j] * states[j][k]`` for every floating entry ``k``, in float64 on the CPU.

    ``states`` may be empty (a worker without partitions): the result is then
    empty and :func:`zeros_like_state` gives the zero partial sum instead.
    """
    if len(states) != len(weights):
        raise InvalidValue(f"{len(states)} states but {len(weights)} weights")
    out: dict[str, torch.Tensor] = {}
    for state, w in zip(states, weights, strict=True):
        for k, v in state.items():
            if not averageable(v):
                continue
            term = v.detach().to("cpu", torch.float64) * float(w)
            if k in out:
                out[k] += term
            else:
                out[k] = term
    return out


def zeros_like_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A float64 zero for every floating entry of ``state`` (an empty partial sum)."""
    return {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in state.items()
            if averageable(v)}


def finish_average(total: Mapping[str, torch.Tensor], weight: float,
                   like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The averaged state: ``total / weight`` in the dtypes and devices of ``like``.

    Entries of ``like`` that are not averaged (integer buffers) are copied.

    Raises:
        TrainingDiverged: an entry of the sum is NaN or infinite (a local model or its
            Adam state is not finite); every worker sums the same totals, so every
            worker raises, and no model takes the average in.
    """
    if not weight > 0:
        raise InvalidValue("model averaging: the partitions have no training nodes in total")
    bad = next((k for k, v in total.items() if not bool(torch.isfinite(v).all())), None)
    if bad is not None:
        raise TrainingDiverged(f"model averaging: {bad} is not finite in the sum of the local "
                               f"models (a local model diverged); nothing was averaged in")
    out: dict[str, torch.Tensor] = {}
    for k, v in like.items():
        if k in total:
            out[k] = (total[k] / float(weight)).to(device=v.device, dtype=v.dtype)
        else:
            out[k] = v.detach().clone()
    return out


def flatten(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> torch.Tensor:
    """The entries ``keys`` of ``state`` as one flat float64 tensor (one all_reduce)."""
    return torch.cat([state[k].reshape(-1) for k in keys]) if keys else torch.zeros(0,
                                                                               dtype=torch.float64)


def unflatten(flat: torch.Tensor, like: Mapping[str, torch.Tensor], keys: Sequence[str]
              ) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten`."""
    out, off = {}, 0
    for k in keys:
        n = like[k].numel()
        out[k] = flat[off:off + n].reshape(like[k].shape)
        off += n
    return out
