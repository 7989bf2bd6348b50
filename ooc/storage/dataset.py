"""Opening and validating an on-disk dataset (format v1, DESIGN.md §4)."""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DatasetError
from .layout import FEATURE_DTYPES, FeatureLayout, RowTable, RowView, index_dtype, padded_bytes

FORMAT_NAME = "ooc-dataset"
FORMAT_VERSION = 1
#: Files whose sha256 is recorded in meta.json and checked when opened.
CHECKSUM_LIMIT = 16 << 20

REQUIRED_FILES = (
    "indptr.npy",
    "indices.bin",
    "features.bin",
    "labels.npy",
    "train_idx.npy",
    "val_idx.npy",
    "test_idx.npy",
)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class MmapFeatures(RowTable):
    """Disk-backed feature table read through a memory map (page cache).

    ``read(ids)`` returns float rows of shape [len(ids), dim] in the file's
    dtype. This is the ``baseline`` path; the executor wraps the same file with
    O_DIRECT readers and caches.
    """

    def __init__(self, path: Path, layout: FeatureLayout):
        self.path = Path(path)
        self.layout = layout
        self._mm: np.memmap | None = None
        self._view: RowView | None = None

    def _open(self) -> RowView:
        if self._view is None:
            if self.layout.file_bytes == 0:
                self._mm = np.zeros(0, dtype=np.uint8)
            else:
                self._mm = np.memmap(self.path, dtype=np.uint8, mode="r",
                                     shape=(self.layout.file_bytes,))
            self._view = self.layout.view(self._mm)
        return self._view

    def advise_random(self) -> None:
        """Turn kernel readahead off for this mapping (MADV_RANDOM)."""
        self._open()
        if isinstance(self._mm, np.memmap) and self._mm._mmap is not None:
            self._mm._mmap.madvise(mmap.MADV_RANDOM)

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (int64 [n]) as an array [n, dim] of the file's dtype."""
        return self._open()[np.asarray(ids, dtype=np.int64)]

    def close(self) -> None:
        self._view = None
        self._mm = None


@dataclass
class Dataset:
    """An opened dataset folder.

    Attributes:
        path: the folder.
        meta: the parsed ``meta.json``.
        indptr: int64 [N+1], CSC: in-neighbours of v are
            ``indices[indptr[v]:indptr[v+1]]`` (in memory).
        indices: int32 or int64 [E] memmap of ``indices.bin``.
        features: the feature table (``read(ids)`` -> [n, dim]).
        labels: int64 [N] memmap, -1 where unlabeled.
        train_idx, val_idx, test_idx: int64 node ids.
    """

    path: Path
    meta: dict
    indptr: np.ndarray
    indices: np.ndarray
    features: MmapFeatures
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    layout: FeatureLayout = field(repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.meta["num_edges"])

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def feature_dim(self) -> int:
        return self.layout.dim

    @property
    def feature_dtype(self) -> np.dtype:
        return np.dtype(self.layout.dtype)

    @property
    def index_dtype(self) -> np.dtype:
        return np.dtype(self.meta["index_dtype"])

    def file(self, name: str) -> Path:
        return self.path / name

    def in_degrees(self) -> np.ndarray:
        """int64 [N] in-degree of every node."""
        return np.diff(self.indptr)

    def out_degrees(self) -> np.ndarray:
        """int64 [N] out-degree of every node (one pass over ``indices``)."""
        deg = np.zeros(self.num_nodes, dtype=np.int64)
        step = 1 << 24
        for a in range(0, self.num_edges, step):
            deg += np.bincount(self.indices[a:a + step], minlength=self.num_nodes)
        return deg

    def disk_bytes(self) -> int:
        """Bytes of the dataset's files on disk."""
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


def _load_meta(path: Path) -> dict:
    mp = path / "meta.json"
    if not path.is_dir():
        raise DatasetError(path, "not a dataset folder (missing or not a directory)")
    if not mp.is_file():
        raise DatasetError(mp, "missing (not an ooc dataset folder)")
    try:
        meta = json.loads(mp.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(mp, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DatasetError(mp, f"not an ooc dataset (format is not {FORMAT_NAME!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise DatasetError(mp, f"unknown format version {meta.get('version')!r} "
                               f"(this ooc reads version {FORMAT_VERSION})")
    for key in ("num_nodes", "num_edges", "feature_dim", "feature_dtype",
                "index_dtype", "num_classes", "files"):
        if key not in meta:
            raise DatasetError(mp, f"missing field {key!r}")
    if meta["feature_dtype"] not in FEATURE_DTYPES:
        raise DatasetError(mp, f"unsupported feature_dtype {meta['feature_dtype']!r}")
    return meta


def _load_npy(path: Path, dtype, shape: tuple | None, mmap: bool = False) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(path, "missing")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DatasetError(path, f"truncated or not a .npy file ({e})") from None
    if arr.dtype != np.dtype(dtype):
        raise DatasetError(path, f"dtype is {arr.dtype}, expected {np.dtype(dtype)}")
    if shape is not None and arr.shape != shape:
        raise DatasetError(path, f"shape is {arr.shape}, expected {shape}")
    if shape is None and arr.ndim != 1:
        raise DatasetError(path, f"expected a 1-D array, got shape {arr.shape}")
    return arr


def _check_size(path: Path, expected: int) -> None:
    if not path.is_file():
        raise DatasetError(path, "missing")
    actual = path.stat().st_size
    if actual != expected:
        what = "truncated" if actual < expected else "too large"
        raise DatasetError(path, f"{what}: {actual} bytes, meta.json says {expected}")


def open_dataset(path: str | os.PathLike, verify: bool = False) -> Dataset:
    """Open and validate the dataset folder at ``path``.

    Cheap checks always run: format and version, every file present with the
    size ``meta.json`` records, dtypes and shapes, checksums of small files,
    ``indptr`` starting at 0, monotone and ending at ``num_edges``, labels in
    ``[-1, num_classes)``, split ids in range. ``verify=True`` also scans
    ``indices.bin`` for ids out of range.

    Raises:
        DatasetError: naming the file and the problem.
    """
    path = Path(path)
    meta = _load_meta(path)
    n, e = int(meta["num_nodes"]), int(meta["num_edges"])
    files = meta["files"]
    for name in REQUIRED_FILES:
        if name not in files:
            raise DatasetError(path / "meta.json", f"does not list {name}")
        _check_size(path / name, int(files[name]["bytes"]))
        digest = files[name].get("sha256")
        if digest is not None and sha256_file(path / name) != digest:
            raise DatasetError(path / name, "checksum does not match meta.json (corrupted file)")

    idt = np.dtype(meta["index_dtype"])
    if idt != index_dtype(n):
        raise DatasetError(path / "meta.json", f"index_dtype {idt} does not fit num_nodes {n}")
    layout = FeatureLayout(n, int(meta["feature_dim"]), meta["feature_dtype"])
    _check_size(path / "features.bin", layout.file_bytes)
    _check_size(path / "indices.bin", padded_bytes(e * idt.itemsize))

    indptr = _load_npy(path / "indptr.npy", np.int64, (n + 1,))
    if indptr[0] != 0 or indptr[-1] != e:
        raise DatasetError(path / "indptr.npy",
                           f"must start at 0 and end at num_edges={e} "
                           f"(got {indptr[0]} .. {indptr[-1]})")
    if n and np.any(indptr[1:] < indptr[:-1]):
        bad = int(np.argmax(indptr[1:] < indptr[:-1]))
        raise DatasetError(path / "indptr.npy", f"not monotone (decreases at node {bad})")
    indices = (np.memmap(path / "indices.bin", dtype=idt, mode="r", shape=(e,))
               if e else np.zeros(0, dtype=idt))
    if verify and e:
        # plain chunked reads: a memmap scan would count the whole file as RSS
        step = 1 << 22
        with open(path / "indices.bin", "rb") as f:
            for a in range(0, e, step):
                chunk = np.fromfile(f, dtype=idt, count=min(step, e - a))
                if chunk.min() < 0 or chunk.max() >= n:
                    raise DatasetError(path / "indices.bin",
                                       f"node id out of range [0, {n}) near edge {a}")

    labels = _load_npy(path / "labels.npy", np.int64, (n,), mmap=True)
    c = int(meta["num_classes"])
    if n and (labels.min() < -1 or labels.max() >= c):
        raise DatasetError(path / "labels.npy",
                           f"label out of range [-1, {c}) (min {labels.min()}, max {labels.max()})")
    splits = []
    for name in ("train_idx.npy", "val_idx.npy", "test_idx.npy"):
        s = _load_npy(path / name, np.int64, None)
        if s.size and (s.min() < 0 or s.max() >= n):
            raise DatasetError(path / name, f"node id out of range [0, {n})")
        splits.append(s)
    return Dataset(path=path, meta=meta, indptr=indptr, indices=indices,
                   features=MmapFeatures(path / "features.bin", layout), labels=labels,
                   train_idx=splits[0], val_idx=splits[1], test_idx=splits[2], layout=layout)
