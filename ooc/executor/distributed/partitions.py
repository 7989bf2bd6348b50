"""The partition folder of a multi-worker run: how many partitions, where, made when missing.

``P`` comes from ``--partitions`` or the workload allocation rule
(:func:`~ooc.executor.distributed.averaging.allocate_partitions`); the folder
from ``--partition-dir`` or :func:`default_partition_dir`, opened by every
process on its own machine (a shared folder or a copy per node).

Who partitions (:func:`ensure_partitions_locked`): every process that needs the
folder (the launcher, or each torchrun worker on each node) takes its lock in
turn; the first partitions the dataset with SPRING when the folder is missing or
stale, the others then find it made and reuse it. With a folder per node each
node makes its own; SPRING with the same seed makes the same partitions from the
same dataset, and the workers check that with :func:`partition_set_fingerprint`
before training (:mod:`.worker`).
An existing folder is used only when it holds this dataset's partitions with these
settings (:func:`ensure_partitions`).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ooc.core.errors import InvalidValue, setting
from ooc.executor.distributed.averaging import DEFAULT_COMPUTE_FRACTION, allocate_partitions, dataset_bytes
from ooc.partition import partition_dataset, reuse_problem
from ooc.partition.split import part_name
from ooc.storage import open_dataset
from ooc.storage.locks import exclusive_wait


def default_partition_dir(data: str | os.PathLike, parts: int, halo_hops: int = 1) -> Path:
    """``<data>.partitions/spring_p<P>`` (``spring_p<P>_h<H>`` for an ``H``-hop halo) beside
    the dataset (the partitioner refuses to write inside the dataset folder)."""
    d = Path(data).resolve()
    name = f"spring_p{int(parts)}" + (f"_h{int(halo_hops)}" if int(halo_hops) != 1 else "")
    return d.parent / f"{d.name}.partitions" / name


def resolve_partitions(data: str | os.PathLike, workers: int, parts: int | None,
                       memory_budget: int | None, compute_fraction: float | None,
                       num_nodes: int | None = None) -> tuple[int, dict[str, Any]]:
    """``P`` and how it was chosen (the allocation rule when ``parts`` is None); a ``P``
    above ``num_nodes`` (when given) is refused naming ``--partitions``."""
    p, info = _partitions(data, workers, parts, memory_budget, compute_fraction)
    if num_nodes is not None and p > num_nodes:
        how = (f"{setting('--partitions')} {p}" if parts is not None else
               f"the allocation rule's {p} partitions ({info['rule']})")
        change = (f"give {setting('--partitions')} at most {num_nodes}" if parts is not None
                  else f"give {setting('--partitions')} or a larger "
                       f"{setting('--memory-budget')}")
        raise InvalidValue(f"{how} exceeds the dataset's {num_nodes} nodes; {change}")
    return p, info


def _partitions(data: str | os.PathLike, workers: int, parts: int | None,
                memory_budget: int | None, compute_fraction: float | None
                ) -> tuple[int, dict[str, Any]]:
    """``P`` and how it was chosen, unchecked against the dataset's size."""
    s = dataset_bytes(data)
    frac = DEFAULT_COMPUTE_FRACTION if compute_fraction is None else float(compute_fraction)
    info: dict[str, Any] = {"data_bytes": s, "memory_budget": memory_budget,
                            "compute_fraction": frac, "workers": workers}
    if parts is not None:
        if int(parts) < 1:
            raise InvalidValue(f"{setting('--partitions')} must be >= 1, got {parts}")
        info["rule"] = "given"
        return int(parts), info
    p = allocate_partitions(s, workers, memory_budget, compute_fraction=frac)
    info["rule"] = ("p = q (no --memory-budget)" if memory_budget is None else
                    "p = q (S <= q(M - T))" if p == workers else "p = ceil(S / (M - T))")
    return p, info


def ensure_partitions(data: str | os.PathLike, parts: int, part_dir: str | os.PathLike | None,
                      seed: int = 0, log: Callable[[str], None] = print,
                      halo_hops: int = 1, overwrite: bool = False,
                      check_halo: bool = False) -> Path:
    """The partition folder for ``parts`` partitions; partitioned with SPRING if missing,
    each partition linking the dataset's feature file (``--features link``).

    ``halo_hops``: hops of in-neighbourhood each partition holds for its owned
    nodes (1: SDT-GNN's full in-neighbour lists; the number of layers: every
    owned node's sampled neighbourhood is the one of the whole graph). An
    existing folder is used when it holds ``parts`` partitions (of ``halo_hops`` hops
    with ``check_halo``) whose ``source_fingerprint`` is the dataset's
    (:meth:`~ooc.storage.Dataset.fingerprint`); one made from an older version of the
    dataset at the same path is partitioned again in place. Partitions of another
    dataset, or with other settings, are replaced only with ``overwrite`` (and, as
    ever, only when ooc made them).

    Raises:
        InvalidValue: the folder holds something else, and ``overwrite`` is not given.
    """

    out = Path(part_dir) if part_dir else default_partition_dir(data, parts, halo_hops)
    stale = _reuse_or_remake(out, data, parts, halo_hops if check_halo else None, overwrite)
    if stale is None:
        return out
    t0 = time.perf_counter()
    why = f"{stale}; " if isinstance(stale, str) else ""
    log(f"ooc.train: {why}partitioning {data} into {parts} parts with SPRING -> {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    # the workers run on this machine: each partition reads the dataset's feature file
    rep = partition_dataset(data, out, parts, "spring", seed=seed, halo_hops=halo_hops,
                            overwrite=bool(stale) or overwrite, features="link")
    log(f"ooc.train: partitioned in {time.perf_counter() - t0:.1f}s (edge cut "
        f"{rep['edge_cut_ratio']:.3f}, replication {rep['replication_factor']:.2f}, with "
        f"the {halo_hops}-hop halo {rep.get('halo_replication_factor', 0):.2f})")
    return out


def _reuse_or_remake(out: Path, data: str | os.PathLike, parts: int, halo_hops: int | None,
                     overwrite: bool) -> str | bool | None:
    """None when ``out`` holds the partitions wanted (``parts`` of them, ``halo_hops`` hops
    unless None, from ``data`` as it is now, intact: :func:`~ooc.partition.reuse_problem`);
    why not, when it holds ``data``'s partitions made before ``data`` changed or damaged
    since (made again in place); False when they are to be made (``out`` is missing, or
    ``overwrite``).

    Raises:
        InvalidValue: ``out`` holds anything else and ``overwrite`` is not given.
    """

    meta = out / "partition.json"
    if not meta.is_file():
        if out.exists() and not overwrite:
            raise InvalidValue(f"{out}: exists but has no partition.json (not a partition "
                               f"folder); pass --overwrite or another --partition-dir")
        return False
    try:
        rec = json.loads(meta.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise InvalidValue(f"{meta}: unreadable ({e})") from None
    rec = rec if isinstance(rec, dict) else {}
    fingerprint = open_dataset(data).fingerprint()
    current = rec.get("source_fingerprint") == fingerprint
    if current or _same_path(rec.get("data"), data):  # this dataset's, now or before it changed
        other = _other_settings(rec, parts, halo_hops)
    else:
        other = f"the partitions of another dataset ({rec.get('data')}), not of {data}"
    if other is None:
        return reuse_problem(out, fingerprint)
    if overwrite:
        return False
    raise InvalidValue(f"{out}: holds {other}; pass --overwrite to partition again there, or "
                       f"another --partition-dir")


def _other_settings(rec: dict, parts: int, halo_hops: int | None) -> str | None:
    """How the partition set ``rec`` (its ``partition.json``) differs from ``parts``
    partitions of ``halo_hops`` hops (None: any), or None."""
    if rec.get("p") != parts:
        return f"{rec.get('p')} partitions, not --partitions {parts}"
    if halo_hops is not None and rec.get("halo_hops", 1) != halo_hops:
        return f"partitions of a {rec.get('halo_hops', 1)}-hop halo, not --halo-hops {halo_hops}"
    return None


def _same_path(a: Any, b: str | os.PathLike) -> bool:
    """Whether ``a`` (a path, or None) and ``b`` name the same folder."""
    if not isinstance(a, str) or not a:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False



def ensure_partitions_locked(data: str | os.PathLike, parts: int,
                             part_dir: str | os.PathLike | None, timeout_s: float,
                             seed: int = 0, log: Callable[[str], None] = print,
                             halo_hops: int = 1, overwrite: bool = False,
                             check_halo: bool = False) -> Path:
    """:func:`ensure_partitions` under a lock beside the folder, waited for up to
    ``timeout_s`` seconds: of several processes (workers on one node, or nodes sharing
    the folder) the first makes the partitions, the others reuse them."""
    out = Path(part_dir) if part_dir else default_partition_dir(data, parts, halo_hops)
    with exclusive_wait(out.parent / f"{out.name}.making", "partition folder", timeout_s):
        return ensure_partitions(data, parts, out, seed, log=log, halo_hops=halo_hops,
                                 overwrite=overwrite, check_halo=check_halo)


def dataset_digest(meta: dict[str, Any]) -> str:
    """A digest of a dataset's content: its files' sizes and checksums in ``meta.json``
    (not their paths or times: two copies of one dataset on two machines agree)."""
    return _digest([json.dumps(meta.get("files"), sort_keys=True).encode()])


def partition_set_fingerprint(part_dir: Path, parts: int) -> str:
    """A digest of a partition folder's content: the assignment (``owner.npy``), the halo
    and every partition's files (sizes and checksums). Equal on two machines when they
    hold the same partitions of the same dataset."""

    rec = json.loads((part_dir / "partition.json").read_text())
    files = [json.loads((part_dir / part_name(j) / "meta.json").read_text()).get("files")
             for j in range(parts)]
    head = json.dumps([parts, rec.get("halo_hops"), files], sort_keys=True).encode()
    with open(part_dir / "owner.npy", "rb") as f:
        return _digest(itertools.chain([head], iter(lambda: f.read(1 << 24), b"")))


def _digest(blocks: Iterable[bytes]) -> str:
    """The first 16 hex digits of the SHA-256 of ``blocks`` in order."""
    h = hashlib.sha256()
    for b in blocks:
        h.update(b)
    return h.hexdigest()[:16]
