"""Edge splits for link prediction, made while a dataset is written.

A split holds some edges out of the message-passing adjacency (both directions of each
held-out pair leave ``indices.bin``, so no model sees a validation or test edge) and
stores them as positives with their negatives::

    val_edges.npy   int64 [2, k_val]      source and target ids
    val_neg.npy     int64 [k_val, K]      K negative targets for each positive's source
    test_edges.npy  int64 [2, k_test]
    test_neg.npy    int64 [k_test, K]

``meta.json``'s ``link_split`` field records how they were made. The pairs to hold out
are either drawn (:class:`LinkSplitSpec` ``val``/``test`` fractions: each unordered pair
``{u, v}``, ``u != v``, is held out by a seeded hash of the pair, so both directions
and every duplicate go together and the decision needs no memory) or given (arrays of
pairs, as OGB's link splits ship them). Negatives not given are drawn uniformly over
the nodes, seeded, once.

Cost: one pass over ``indptr``/``indices`` in node ranges of about ``buffer_bytes``
(compacting ``indices.bin`` in place), a new ``indptr`` (8 B per node), the held-out
edges themselves (16 B each while deduplicated) and, for given pairs, a sorted key per
given pair (9 B each).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.core.errors import DatasetError, IdOutOfRange, InvalidValue, NotFound
from ooc.storage._link_split_kernels import hold_out_chunk
from ooc.storage.pagecache import release_mapped

#: The ``meta.json`` field describing a dataset's link split.
META_KEY = "link_split"
#: The split's files, in ``meta["files"]`` when the dataset has a split.
SPLIT_FILES = ("val_edges.npy", "val_neg.npy", "test_edges.npy", "test_neg.npy")
#: Negative rows drawn per chunk (each chunk its own seeded stream).
NEG_ROWS = 1 << 16


@dataclass
class LinkSplitSpec:
    """How to split the edges of a dataset being written.

    Attributes:
        val, test: fractions of the edge pairs held out for validation and test (used
            when no pairs are given).
        seed: the seed of the held-out draw and of the negatives.
        num_neg: negatives per positive drawn where none are given (K).
        val_edges, test_edges: given pairs (int [2, k]) instead of fractions.
        val_neg, test_neg: given negatives (int [k, K]) of the given pairs.
        names: where the given arrays came from (file names), for errors and meta.json.
    """

    val: float = 0.0
    test: float = 0.0
    seed: int = 0
    num_neg: int = 1
    val_edges: np.ndarray | None = None
    test_edges: np.ndarray | None = None
    val_neg: np.ndarray | None = None
    test_neg: np.ndarray | None = None
    names: dict[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return self.val_edges is not None or self.test_edges is not None

    def check(self, num_nodes: int) -> None:
        """One-line :class:`InvalidValue` / :class:`IdOutOfRange` for a bad setting or
        array (named after its file)."""
        if isinstance(self.num_neg, bool) or int(self.num_neg) < 1:
            raise InvalidValue(f"--num-neg must be at least 1, got {self.num_neg}")
        if self.given:
            if self.val or self.test:
                raise InvalidValue("give either --link-split fractions or --val-edges/"
                                   "--test-edges files, not both")
        elif not (0 <= self.val and 0 <= self.test and 0 < self.val + self.test < 1):
            raise InvalidValue(f"--link-split VAL,TEST: fractions >= 0 with 0 < VAL + TEST "
                               f"< 1, got {self.val},{self.test}")
        for part in ("val", "test"):
            edges = getattr(self, f"{part}_edges")
            neg = getattr(self, f"{part}_neg")
            name = self.names.get(f"{part}_edges", f"{part}_edges")
            if edges is None:
                if neg is not None:
                    raise InvalidValue(f"{self.names.get(f'{part}_neg', f'{part}_neg')}: "
                                       f"negatives given without the {part} edges")
                continue
            edges = np.asarray(edges)
            if edges.ndim != 2 or edges.shape[0] != 2 or not np.issubdtype(edges.dtype,
                                                                          np.integer):
                raise InvalidValue(f"{name}: expected an integer array [2, k] of source and "
                                   f"target ids, got shape {edges.shape} of {edges.dtype}")
            _in_range(edges, num_nodes, name)
            setattr(self, f"{part}_edges", edges.astype(np.int64, copy=False))
            if neg is not None:
                nname = self.names.get(f"{part}_neg", f"{part}_neg")
                neg = np.asarray(neg)
                if neg.ndim == 1:
                    neg = neg.reshape(-1, 1)
                if neg.ndim != 2 or neg.shape[0] != edges.shape[1] or neg.shape[1] < 1 \
                        or not np.issubdtype(neg.dtype, np.integer):
                    raise InvalidValue(f"{nname}: expected an integer array [{edges.shape[1]}, "
                                       f"K] (K negatives per positive of {name}), got shape "
                                       f"{neg.shape} of {neg.dtype}")
                _in_range(neg, num_nodes, nname)
                setattr(self, f"{part}_neg", neg.astype(np.int64, copy=False))


def load_int_array(path: Path) -> np.ndarray:
    """An integer ``.npy`` file (edges or negatives) loaded whole; a one-line error naming
    the file when it is missing, unreadable or not integer."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"{path}: not found")
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InvalidValue(f"{path}: not a readable .npy file ({e})") from None
    if not np.issubdtype(a.dtype, np.integer):
        raise InvalidValue(f"{path}: dtype {a.dtype}; expected integer node ids")
    return a


def _in_range(a: np.ndarray, n: int, name: str) -> None:
    if a.size and (a.min() < 0 or a.max() >= n):
        bad = int(a.min()) if a.min() < 0 else int(a.max())
        raise IdOutOfRange(f"{name}: node id {bad} out of range [0, {n})")


def draw_negatives(num_nodes: int, k: int, num_neg: int, seed: int, stream: int,
                   out: np.ndarray) -> None:
    """Fill ``out`` (int64 [k, num_neg]) with node ids drawn uniformly, chunk by chunk,
    each chunk of :data:`NEG_ROWS` rows from its own stream of ``(seed, stream, chunk)``."""
    for a in range(0, k, NEG_ROWS):
        rng = np.random.default_rng([int(seed) & (2**63 - 1), 0x4C4E4B, int(stream), a])
        out[a:a + NEG_ROWS] = rng.integers(0, num_nodes, size=(min(NEG_ROWS, k - a), num_neg))


def _pair_keys(spec: LinkSplitSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unordered-pair keys ``min * n + max`` (int64) of the given pairs and their
    kind (int8: 1 validation, 2 test); a pair in both splits counts as validation."""
    keys, kinds = [], []
    for kind, edges in ((1, spec.val_edges), (2, spec.test_edges)):
        if edges is None or not edges.shape[1]:
            continue
        lo, hi = np.minimum(edges[0], edges[1]), np.maximum(edges[0], edges[1])
        keys.append(lo * n + hi)
        kinds.append(np.full(edges.shape[1], kind, np.int8))
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int8)
    k, kd = np.concatenate(keys), np.concatenate(kinds)
    uniq, first = np.unique(k, return_index=True)
    return uniq, kd[first]


def _node_ranges(indptr: np.ndarray, edges_per_range: int):
    """``(v0, v1)`` node ranges of about ``edges_per_range`` edges each (a node with more
    is a range of its own)."""
    n = indptr.shape[0] - 1
    v0 = 0
    while v0 < n:
        target = int(indptr[v0]) + max(1, edges_per_range)
        v1 = int(np.searchsorted(indptr, target, side="right")) - 1
        v1 = min(n, max(v1, v0 + 1))
        yield v0, v1
        v0 = v1


def _save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)


def hold_out(folder: Path, indices: np.ndarray, num_nodes: int, directed: bool,
             spec: LinkSplitSpec, buffer_bytes: int) -> tuple[int, dict[str, Any]]:
    """Split the edges of the dataset being written in ``folder`` (its ``indptr.npy`` and
    ``indices`` map, int32/int64 [E]) by ``spec``: compacts ``indices`` in place, writes a
    new ``indptr.npy`` and the :data:`SPLIT_FILES`. Returns the new edge count (the caller
    cuts ``indices.bin`` to it) and the ``meta.json`` field."""
    n = int(num_nodes)
    spec.check(n)
    old = np.load(folder / "indptr.npy", mmap_mode="r")
    e0 = int(old[-1])
    tmp_ptr = folder / "indptr.npy.split"
    newptr = np.lib.format.open_memmap(tmp_ptr, mode="w+", dtype=np.int64, shape=(n + 1,))
    newptr[0] = 0
    keys, kinds = _pair_keys(spec, n)
    step = max(1 << 16, int(buffer_bytes) // 17)
    w = 0
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for v0, v1 in _node_ranges(old, step):
        m = int(old[v1] - old[v0])
        src, dst, kind = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int8)
        w, held = hold_out_chunk(old, indices, v0, v1, w, newptr[v0:v1 + 1], n,
                                 int(spec.seed) & (2**63 - 1), float(spec.val),
                                 float(spec.test), keys, kinds, bool(directed), src, dst, kind)
        if held and not spec.given:
            found.append((src[:held].copy(), dst[:held].copy(), kind[:held].copy()))
        release_mapped(indices)
    newptr.flush()
    del newptr, old
    os.replace(tmp_ptr, folder / "indptr.npy")
    info: dict[str, Any] = {"method": "given" if spec.given else "random", "seed": int(spec.seed),
                            "edges_removed": e0 - w, "directed": bool(directed)}
    parts: dict[str, np.ndarray | None]
    if spec.given:
        parts = {"val": spec.val_edges, "test": spec.test_edges}
        info["files"] = dict(spec.names)
    else:
        info.update(val_fraction=float(spec.val), test_fraction=float(spec.test))
        parts = dict(_drawn_pairs(found, n))
    for stream, part in enumerate(("val", "test")):
        edges = parts[part]
        edges = np.zeros((2, 0), np.int64) if edges is None else edges
        _save(folder / f"{part}_edges.npy", np.ascontiguousarray(edges, dtype=np.int64))
        given_neg = getattr(spec, f"{part}_neg")
        k = edges.shape[1]
        if given_neg is not None:
            neg = np.ascontiguousarray(given_neg)
            _save(folder / f"{part}_neg.npy", neg)
        else:
            neg = np.lib.format.open_memmap(folder / f"{part}_neg.npy", mode="w+",
                                            dtype=np.int64, shape=(k, int(spec.num_neg)))
            draw_negatives(n, k, int(spec.num_neg), int(spec.seed), stream, neg)
            neg.flush()
        info[f"num_{part}"] = int(k)
        info[f"num_neg_{part}"] = int(neg.shape[1])
        info[f"{part}_negatives"] = "given" if given_neg is not None else "uniform"
        del neg
    return w, info


def _drawn_pairs(found, n: int) -> dict[str, np.ndarray]:
    """The held-out edges the kernel recorded, each pair once (int64 [2, k] per part,
    ordered by ``(source, target)``)."""
    if found:
        src = np.concatenate([f[0] for f in found])
        dst = np.concatenate([f[1] for f in found])
        kind = np.concatenate([f[2] for f in found])
    else:
        src = dst = np.zeros(0, np.int64)
        kind = np.zeros(0, np.int8)
    _, first = np.unique(src * n + dst, return_index=True)
    src, dst, kind = src[first], dst[first], kind[first]
    return {part: np.stack([src[kind == k], dst[kind == k]]) for k, part in ((1, "val"),
                                                                           (2, "test"))}


@dataclass
class LinkSplit:
    """A dataset's stored link split (see the module docstring for shapes)."""

    val_edges: np.ndarray
    val_neg: np.ndarray
    test_edges: np.ndarray
    test_neg: np.ndarray
    info: dict

    def edges(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        """``(positives int64 [2, k], negatives int64 [k, K])`` of ``"val"`` or ``"test"``."""
        if part not in ("val", "test"):
            raise InvalidValue(f"link split part {part!r}: expected 'val' or 'test'")
        return getattr(self, f"{part}_edges"), getattr(self, f"{part}_neg")


def load_link_split(path: Path, meta: dict, sha256_file: Callable[[Path], str]
                    ) -> LinkSplit | None:
    """The link split of the dataset folder ``path`` (None when it has none), every file
    checked against ``meta`` (listed, its size, its ``sha256_file`` digest when recorded)
    and its shape and id range.

    Raises:
        DatasetError: naming the file and the problem.
    """
    info = meta.get(META_KEY)
    if info is None:
        return None
    mp = path / "meta.json"
    if not isinstance(info, dict):
        raise DatasetError(mp, f"field {META_KEY!r} must be an object")
    n = int(meta["num_nodes"])
    arrays = {}
    for name in SPLIT_FILES:
        p = path / name
        entry = meta["files"].get(name)
        if not isinstance(entry, dict):
            raise DatasetError(mp, f"field {META_KEY!r} is set but it does not list {name}")
        if not p.is_file():
            raise DatasetError(p, "missing")
        if p.stat().st_size != entry.get("bytes"):
            raise DatasetError(p, f"{p.stat().st_size} bytes, meta.json says {entry.get('bytes')}")
        if entry.get("sha256") is not None and sha256_file(p) != entry["sha256"]:
            raise DatasetError(p, "checksum does not match meta.json (corrupted file)")
        try:
            a = np.load(p, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DatasetError(p, f"truncated or not a .npy file ({e})") from None
        if a.dtype != np.int64 or a.ndim != 2:
            raise DatasetError(p, f"expected a 2-D int64 array, got {a.dtype} {a.shape}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
            raise DatasetError(p, f"node id out of range [0, {n})")
        arrays[name[:-4]] = a
    for part in ("val", "test"):
        pos, neg = arrays[f"{part}_edges"], arrays[f"{part}_neg"]
        if pos.shape[0] != 2 or neg.shape[0] != pos.shape[1]:
            raise DatasetError(path / f"{part}_neg.npy", f"shape {neg.shape} does not match "
                                                        f"{part}_edges.npy's {pos.shape}")
    return LinkSplit(info=info, **arrays)
