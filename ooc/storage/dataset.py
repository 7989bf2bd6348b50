"""Opening and validating an on-disk dataset (format v1, DESIGN.md §4)."""
from __future__ import annotations

import hashlib
import json
import os
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.core.errors import DatasetError
from ooc.storage._reorder_kernels import first_repeat
from ooc.storage.bus_guard import check_size, watch
from ooc.storage.entries import EntryReader
from ooc.storage.features import Feature, NodeRows
from ooc.storage.layout import (
    FEATURE_DTYPES,
    PAGE,
    FeatureLayout,
    RowTable,
    RowView,
    index_dtype,
    padded_bytes,
)
from ooc.storage.link_split import META_KEY as LINK_SPLIT_KEY
from ooc.storage.link_split import load_link_split
from ooc.storage.offsets import NodeOffsets
from ooc.storage.reorder import rows_of

FORMAT_NAME = "ooc-dataset"
FORMAT_VERSION = 1
#: ``.npy`` files up to this size get a full sha256 in meta.json, checked when opened.
CHECKSUM_LIMIT = 16 << 20
#: Pages (evenly spread, first and last included) hashed into the sampled
#: checksum of each raw ``.bin`` file.
SAMPLE_PAGES = 64
#: A dataset whose meta.json records no id range (written before ooc recorded
#: one) has ``indices.bin`` scanned at open when it is at most this large.
INDEX_SCAN_LIMIT = 64 << 20
#: Bytes of ``indices.bin`` per CRC-32 that meta.json records (``block_crc32`` of its
#: entry); every block is checked when a run scans the file (:meth:`Dataset.check_indices`).
INDEX_BLOCK = 4 << 20
#: More classes than this in meta.json is taken as corruption (the output
#: layer would be sized from it).
MAX_CLASSES = 1 << 20
#: Most values per feature row meta.json may declare.
MAX_FEATURE_DIM = 1 << 24

REQUIRED_FILES = (
    "indptr.npy",
    "indices.bin",
    "features.bin",
    "labels.npy",
    "train_idx.npy",
    "val_idx.npy",
    "test_idx.npy",
)
#: Node id -> row of ``features.bin`` (int32/int64 [N], a permutation), present when
#: the rows are stored in another order than the node ids (``meta["feature_order"]``).
ROW_MAP_FILE = "feature_rows.npy"
#: The ``meta.json`` field of a dataset that reads its feature rows from another dataset's
#: ``features.bin`` instead of holding its own (a partition made with ``--features link``):
#: ``{"path": relative to the folder, "abs_path": absolute, "num_rows": rows of that file}``;
#: ``files["features.bin"]`` is that file's entry and ``feature_rows.npy`` maps each node
#: to its row there (distinct rows, not a permutation).
FEATURE_LINK = "features_link"


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sampled_pages(nbytes: int) -> np.ndarray:
    """Page numbers (int64, ascending) hashed by :func:`sampled_sha256`: every
    page of a file of at most ``SAMPLE_PAGES`` pages, else ``SAMPLE_PAGES``
    pages evenly spread from the first to the last."""
    npages = -(-int(nbytes) // PAGE)
    if npages <= SAMPLE_PAGES:
        return np.arange(npages, dtype=np.int64)
    return np.unique(np.linspace(0, npages - 1, SAMPLE_PAGES).round().astype(np.int64))


def sampled_sha256(path: Path, nbytes: int) -> str:
    """sha256 over the pages :func:`sampled_pages` picks (each ``PAGE`` bytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for p in sampled_pages(nbytes):
            f.seek(int(p) * PAGE)
            h.update(f.read(PAGE))
    return h.hexdigest()


def block_crc32s(path: Path, nbytes: int) -> list[int]:
    """CRC-32 of each ``INDEX_BLOCK`` bytes of the first ``nbytes`` of the file ``path``
    (the last block shorter), read with plain reads: the ``block_crc32`` that meta.json
    records for ``features.bin`` and every ``.npy`` too large for a full sha256, checked
    page by page by ``ooc.prepare verify`` (:mod:`ooc.storage.verify`)."""
    crcs = []
    with open(path, "rb") as f:
        for a in range(0, nbytes, INDEX_BLOCK):
            block = f.read(min(INDEX_BLOCK, nbytes - a))
            if len(block) < min(INDEX_BLOCK, nbytes - a):
                raise DatasetError(path, f"truncated: ends before byte {a + len(block)}")
            crcs.append(zlib.crc32(block))
    return crcs


def block_count(name: str, entry: dict, meta: dict) -> int:
    """How many ``block_crc32`` the entry of the file ``name`` must list: the blocks of the
    ids of ``indices.bin`` (its page padding is not covered), of every byte of another
    file."""
    nbytes = (meta["num_edges"] * np.dtype(meta["index_dtype"]).itemsize
              if name == "indices.bin" else entry["bytes"])
    return -(-nbytes // INDEX_BLOCK)


def meta_checksum(meta: dict) -> str:
    """sha256 (hex) of ``meta`` (a parsed ``meta.json``) without its ``checksum`` field,
    as canonical JSON (sorted keys, no spaces); the writer stores it as ``checksum``."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def index_range_error(path: str | os.PathLike, position: int, value: int, num_nodes: int) -> DatasetError:
    """The one-line error for a neighbour id outside ``[0, num_nodes)`` at
    element ``position`` of the ``indices.bin`` at ``path``."""
    return DatasetError(path, f"node id {value} at position {position} is out of range "
                              f"[0, {num_nodes}) (corrupted file)")


def scan_index_range(path: Path, dtype: np.dtype, num_edges: int,
                     num_nodes: int | None = None,
                     block_crc32: list[int] | None = None) -> tuple[int, int, list[int]]:
    """(min, max, per-block CRC-32s) of the ``num_edges`` ids of a raw index file, read
    in blocks of ``INDEX_BLOCK`` bytes with plain reads (a memmap scan would count as
    RSS). The CRC of block ``k`` covers the ids' bytes ``[k * INDEX_BLOCK, (k + 1) *
    INDEX_BLOCK)`` (the page padding after the last id is not covered).

    With ``num_nodes`` the first id outside ``[0, num_nodes)`` raises
    :func:`index_range_error`; with ``block_crc32`` (the list ``meta.json`` records)
    the first block whose CRC differs raises. An empty file gives ``(0, -1, [])``.
    """
    lo, hi = 0, -1
    crcs: list[int] = []
    step = INDEX_BLOCK // np.dtype(dtype).itemsize
    with open(path, "rb") as f:
        for a in range(0, num_edges, step):
            chunk = np.fromfile(f, dtype=dtype, count=min(step, num_edges - a))
            if chunk.size < min(step, num_edges - a):
                raise DatasetError(path, f"truncated: ends before id {a + chunk.size}")
            cmin, cmax = int(chunk.min()), int(chunk.max())
            if num_nodes is not None and (cmin < 0 or cmax >= num_nodes):
                j = int(np.flatnonzero((chunk < 0) | (chunk >= num_nodes))[0])
                raise index_range_error(path, a + j, int(chunk[j]), num_nodes)
            # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (a buffer at runtime)
            crcs.append(zlib.crc32(chunk))  # type: ignore[arg-type]
            k = len(crcs) - 1
            if block_crc32 is not None and (k >= len(block_crc32) or block_crc32[k] != crcs[k]):
                raise DatasetError(path, f"ids {a}..{a + chunk.size - 1} (bytes from "
                                         f"{a * chunk.itemsize}) do not match their checksum in "
                                         f"meta.json (corrupted file)")
            lo, hi = (cmin, cmax) if a == 0 else (min(lo, cmin), max(hi, cmax))
    return lo, hi, crcs


class MmapFeatures(RowTable, Feature):
    """Disk-backed feature table read through a memory map (page cache).

    ``read(ids)`` returns float rows of shape [len(ids), dim] in the file's
    dtype. This is the ``baseline`` path; the executor wraps the same file with
    O_DIRECT readers and caches. ``stats()`` counts requests, rows and ``bytes_read``
    (the rows' bytes copied out of the map, the counter the O_DIRECT readers keep; what
    the kernel read for them shows in the process's ``/proc/self/io``).
    """

    def __init__(self, path: Path, layout: FeatureLayout):
        self.path = Path(path)
        self.what = str(self.path)
        self.layout = layout
        self._mm: np.ndarray | None = None   # a memmap, or an empty array for an empty file
        self._view: RowView | None = None
        self.requests = self.rows = 0

    def _open(self) -> RowView:
        if self._view is None:
            if self.layout.file_bytes == 0:
                self._mm = np.zeros(0, dtype=np.uint8)
            else:
                self._mm = np.memmap(self.path, dtype=np.uint8, mode="r",
                                     shape=(self.layout.file_bytes,))
                watch(self.path)
            self._view = self.layout.view(self._mm)
        return self._view

    def _read_into(self, ids: np.ndarray, out: np.ndarray, rows: np.ndarray | None) -> None:
        view = self._open()
        check_size(self._mm, self.path, self.layout.file_bytes)
        if rows is None:
            out[:] = view[ids]
        else:
            out[rows] = view[ids]
        self.requests += 1
        self.rows += ids.shape[0]

    def stats(self) -> dict:
        return {"requests": self.requests, "rows": self.rows,
                "bytes_read": self.rows * self.layout.row_bytes}

    def close(self) -> None:
        self._view = None
        self._mm = None


#: Guards the lazily made per-dataset readers (the compact offsets, the entry readers).
_LAZY_LOCK = threading.Lock()


@dataclass
class Dataset:
    """An opened dataset folder.

    Attributes:
        path: the folder.
        meta: the parsed ``meta.json``.
        indptr: int64 [N+1] memmap of ``indptr.npy``, CSC: in-neighbours of v are
            ``indices[indptr[v]:indptr[v+1]]`` (paged in as it is read: file-backed
            memory the kernel can reclaim, not a resident copy).
        indices: int32 or int64 [E] memmap of ``indices.bin``.
        features: the feature table (``read(ids)`` -> [n, dim], by node id).
        row_of: node id -> row of ``features.bin`` (int32/int64 [N] memmap of
            ``feature_rows.npy``) when the rows are stored in a locality order, else None.
        features_file: the feature file (``features.bin`` here, or the linked dataset's).
        file_layout: that file's :class:`FeatureLayout` (``layout`` with the linked file's
            rows when linked: rows are addressed by ``row_of``).
        labels: int64 [N] memmap, -1 where unlabeled.
        train_idx, val_idx, test_idx: int64 node ids.
    """

    path: Path
    meta: dict
    indptr: np.ndarray
    indices: np.ndarray
    features: Any
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    layout: FeatureLayout = field(repr=False)
    row_of: np.ndarray | None = field(default=None, repr=False)
    linked_file: Path | None = field(default=None, repr=False)
    linked_rows: int = field(default=0, repr=False)
    _indices_checked: bool = field(default=False, repr=False, compare=False)
    _offsets: Any = field(default=None, repr=False, compare=False)
    _entry_readers: dict = field(default_factory=dict, repr=False, compare=False)
    _link_split: Any = field(default=None, repr=False, compare=False)

    @property
    def link_split(self):
        """The stored link split (:class:`~ooc.storage.link_split.LinkSplit`: held-out
        validation and test edges and their negatives), loaded and checked on first use;
        None when the dataset was written without one (``ooc.prepare --link-split``)."""
        if self._link_split is None and LINK_SPLIT_KEY in self.meta:
            self._link_split = load_link_split(self.path, self.meta, sha256_file)
        return self._link_split

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

    @property
    def features_file(self) -> Path:
        """The file the feature rows are read from: ``features.bin`` of this folder, or
        of the dataset it links (:data:`FEATURE_LINK`)."""
        return self.linked_file if self.linked_file is not None else self.file("features.bin")

    @property
    def file_layout(self) -> FeatureLayout:
        """The :class:`FeatureLayout` of :attr:`features_file`: ``layout``, or the same
        rows' layout over the linked file's ``linked_rows`` rows."""
        if self.linked_file is None:
            return self.layout
        return FeatureLayout(self.linked_rows, self.layout.dim, self.layout.dtype)

    def by_node(self, reader):
        """``reader`` of ``features.bin`` (ids = stored rows) read by node id: itself when
        the rows are in node order, else wrapped in
        :class:`~ooc.storage.features.NodeRows`. Every reader of the features goes
        through this."""
        if self.row_of is None:
            return reader

        return NodeRows(reader, self.row_of, str(self.features_file))

    def stored_order(self) -> np.ndarray | None:
        """The node ids in the order their rows lie in :attr:`features_file` (int32/int64
        [N]: ``order[k]`` is the node of the k-th stored row among this dataset's), None
        when they lie in node order."""
        if self.row_of is None:
            return None
        rows = np.asarray(self.row_of)
        ids = index_dtype(self.num_nodes)
        if self.linked_file is None:  # a permutation: its inverse

            return rows_of(rows, ids)
        return np.argsort(rows, kind="stable").astype(ids)

    def row_pages(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """``pages(ids)``: the 4 KiB page of ``features.bin`` each node's row lies in
        (int64 [n] for node ids int64 [n]), when rows share pages (a row under half a
        page); else None. Rows read for one node then bring the others on its page."""
        rpp = self.layout.rows_per_page
        if not rpp or rpp < 2:
            return None
        row_of = self.row_of

        def pages(ids: np.ndarray) -> np.ndarray:
            ids = np.asarray(ids, dtype=np.int64)
            rows = ids if row_of is None else np.asarray(row_of[ids], dtype=np.int64)
            return rows // rpp

        return pages

    def node_offsets(self):
        """``indptr`` in the sampler's compact form
        (:class:`~ooc.storage.offsets.NodeOffsets`, 4.125 bytes per node), made on first
        use and shared by every sampler of this dataset."""
        with _LAZY_LOCK:
            if self._offsets is None:
                self._offsets = NodeOffsets(self.indptr)
            return self._offsets

    def check_mapped(self) -> None:
        """Raise :class:`IOFailure` naming the file when one this dataset maps
        (``indptr.npy``, ``indices.bin``, ``labels.npy``, the row map) shrank after it was
        opened: a reader touching a page past its new end would die of SIGBUS. The
        trainer and inference call it between batches and chunks
        (:mod:`~ooc.storage.bus_guard`)."""
        for arr in (self.indptr, self.indices, self.labels, self.row_of):
            if isinstance(arr, np.memmap) and arr.filename is not None:
                check_size(arr, arr.filename, arr.offset + arr.nbytes)

    def read_labels(self, ids: np.ndarray) -> np.ndarray:
        """Labels of ``ids`` (int64 [n]; -1 unlabeled), read from ``labels.npy`` by page
        through the page cache (:meth:`entries`): nothing of the file is mapped into the
        process. Indexing the memmap instead maps what the kernel faults in around each
        id (hundreds of MiB for a thousand ids at random at papers100M's size, with large
        page-cache folios), and over an epoch every page (8 bytes a node).

        Raises:
            IdOutOfRange: an id outside ``[0, N)``.
        """
        return np.asarray(self.entries("labels.npy", self.labels, ids), dtype=np.int64)

    def entries(self, name: str, arr: np.ndarray, ids: np.ndarray, width: int = 1
                ) -> np.ndarray:
        """``arr[ids]`` for ``arr``, the memmap of the dataset's file ``name`` (an ``.npy``),
        read by page without mapping it (one :class:`~ooc.storage.entries.EntryReader`
        per file, made on first use); an array in memory is indexed directly. ``width`` >
        1: ``arr[ids[i] : ids[i] + width]`` as row ``i`` of an array [n, width]."""
        if not isinstance(arr, np.memmap):
            ids = np.asarray(ids, dtype=np.int64)
            return arr[ids] if width == 1 else arr[ids[:, None] + np.arange(width)]
        with _LAZY_LOCK:
            reader = self._entry_readers.get(name)
            if reader is None:
                reader = self._entry_readers[name] = EntryReader(
                    self.file(name), arr.offset, arr.dtype, arr.shape[0])
        return reader.read(ids, width)

    def in_degrees(self) -> np.ndarray:
        """int64 [N] in-degree of every node."""
        return np.diff(self.indptr)

    def out_degrees(self) -> np.ndarray:
        """int64 [N] out-degree of every node (one pass over ``indices``).

        Raises:
            DatasetError: naming ``indices.bin`` and the position of an id
                outside ``[0, N)``.
        """
        n = self.num_nodes
        deg = np.zeros(n, dtype=np.int64)
        step = 1 << 24
        for a in range(0, self.num_edges, step):
            chunk = np.asarray(self.indices[a:a + step])
            bad = (chunk < 0) | (chunk >= n)
            if bad.any():
                k = int(np.argmax(bad))
                raise index_range_error(self.file("indices.bin"), a + k, int(chunk[k]), n)
            deg += np.bincount(chunk, minlength=n)
        return deg

    def check_indices(self) -> None:
        """Scan all of ``indices.bin`` once per opened dataset (one streaming pass at the
        disk's speed): ids outside ``[0, N)``, and every block against the CRC-32 that
        ``meta.json`` records for it (a zeroed or overwritten page holds ids in range).

        Raises:
            DatasetError: naming the file and the first bad position or block.
        """
        if self._indices_checked:
            return
        crcs = self.meta["files"]["indices.bin"].get("block_crc32")
        scan_index_range(self.file("indices.bin"), self.index_dtype, self.num_edges, self.num_nodes,
                         crcs)
        self._indices_checked = True

    def fingerprint(self) -> dict:
        """What derived data (inference outputs, partitions, the neighbor cache) records of
        the dataset it was made from: ``meta`` (the checksum of ``meta.json``, which lists
        every file's size and checksums) and ``files`` (``{name: [bytes, ctime_ns, inode]}``
        of the raw ``.bin`` files, so writing into them in place shows).

        Why the inode change time and not a hash of the contents: the contents are 57 GB of
        features at papers100M's scale, and a hash of sampled pages misses a write outside
        them. Every write to a file (``write``, a written ``mmap`` page, ``truncate``) and
        every ``rename`` onto its name sets its ``ctime`` to the clock's time, and no system
        call sets ``ctime`` to a chosen value (``touch``/``utime`` restore an ``mtime``, not
        a ``ctime``), so a file rewritten to the same size with its ``mtime`` restored still
        shows; the inode shows a file replaced by another. A copy of the dataset (new
        inodes) counts as changed: derived data is then made again, never served stale.
        Cheap: two ``stat`` calls; what ``open_dataset`` checks of the contents (the sampled
        pages, the small files' sha256) is covered by ``meta``."""
        files = {}
        for name, p in (("indices.bin", self.file("indices.bin")),
                        ("features.bin", self.features_file)):
            st = p.stat()
            files[name] = [st.st_size, st.st_ctime_ns, st.st_ino]
        return {"meta": meta_checksum(self.meta), "files": files}

    def disk_bytes(self) -> int:
        """Bytes of the dataset's files on disk."""
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


def replace_problem(path: Path) -> str | None:
    """Why ``path`` may not be replaced by a new dataset, or None when it is
    an ooc dataset folder (one holding a ``meta.json`` of format ooc-dataset,
    valid or not)."""
    refuse = ("exists and is not an ooc dataset folder; --overwrite replaces only a dataset "
              "(remove it yourself or pick another --out)")
    if path.is_symlink() or not path.is_dir():
        return refuse
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return refuse
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        return refuse
    return None


def raw_format_hint(path: Path) -> str:
    """``; it looks like ... convert it with ooc.prepare ...`` when ``path`` holds a raw
    dataset ``ooc.prepare`` reads (OGB, Planetoid, IGB), else ``""``."""
    def has(*names: str) -> bool:
        return any((path / n).exists() for n in names)

    out = f"--out {path.name or 'data'}-ooc"
    if has("raw/edge.csv.gz", "raw/data.npz") or (has("split") and has("raw")):
        return f"; it looks like a raw OGB dataset: convert it with ooc.prepare ogb --root {path} {out}"
    for folder in (path, path / "raw"):
        names = [p.name for p in folder.glob("ind.*.graph")] if folder.is_dir() else []
        if names:
            root, name = (path.parent.parent, path.parent.name) if folder == path else \
                (path.parent, path.name)
            return (f"; it looks like PyG Planetoid raw files: convert them with ooc.prepare "
                    f"planetoid --root {root} --name {name} --out {name}-ooc")
    if any(next(path.glob(p), None) is not None  # IGB: ROOT/.../paper/node_feat.npy
           for p in ("node_feat.npy", "*/node_feat.npy", "*/*/node_feat.npy")):
        return f"; it looks like an IGB dataset: convert it with ooc.prepare igb --root {path} {out}"
    return ""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _meta_int(mp: Path, meta: dict, key: str, lo: int, hi: int | None = None) -> int:
    v = meta[key]
    if not _is_int(v):
        raise DatasetError(mp, f"field {key!r} must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise DatasetError(mp, f"field {key!r} must be {bound}, got {v}")
    return v


def _load_meta(path: Path) -> dict:
    """Parse ``meta.json`` and check every field's type and range (not yet
    against the files)."""
    mp = path / "meta.json"
    meta = _parse_meta(path, mp)
    if not isinstance(meta.get("checksum"), str):
        # without it an edit of any field (feature_order, counts, checksums) goes unseen
        raise DatasetError(mp, "has no 'checksum' field (written by hand or by an older "
                               "ooc, or edited); write the dataset again with ooc.prepare")
    _check_meta_fields(mp, meta)
    _check_meta_files(mp, meta["files"])
    if "index_range" in meta:
        r = meta["index_range"]
        if not (isinstance(r, list) and len(r) == 2 and all(_is_int(v) for v in r)):
            raise DatasetError(mp, f"field 'index_range' must be [min, max] integers, got {r!r}")
    return meta


def _parse_meta(path: Path, mp: Path) -> dict:
    """The JSON object of ``mp`` (the ``meta.json`` of the folder ``path``), checked to be
    an ooc dataset's of this format version and to hold every required field."""
    if not path.is_dir():
        raise DatasetError(path, "not a dataset folder (missing or not a directory)")
    if not mp.is_file():
        raise DatasetError(mp, "missing (not an ooc dataset folder)" + raw_format_hint(path))
    try:
        meta = json.loads(mp.read_text())
    except RecursionError:
        raise DatasetError(mp, "nested too deeply to be an ooc meta.json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(mp, f"not valid JSON ({e})") from None
    except OSError as e:
        raise DatasetError(mp, f"cannot be read ({e.strerror})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DatasetError(mp, f"not an ooc dataset (format is not {FORMAT_NAME!r})")
    if not _is_int(meta.get("version")) or meta["version"] != FORMAT_VERSION:
        raise DatasetError(mp, f"unknown format version {meta.get('version')!r} "
                               f"(this ooc reads version {FORMAT_VERSION})")
    for key in ("num_nodes", "num_edges", "feature_dim", "feature_dtype",
                "index_dtype", "num_classes", "files"):
        if key not in meta:
            raise DatasetError(mp, f"missing field {key!r}")
    return meta


def _check_meta_fields(mp: Path, meta: dict) -> None:
    """The counts, dtypes and optional fields of ``meta`` (parsed from ``mp``): each of
    its type and in range, the index dtype the one ``num_nodes`` needs, and any recorded
    feature layout field the one ``feature_dim`` and ``feature_dtype`` give."""
    n = _meta_int(mp, meta, "num_nodes", 0, 2**62)
    _meta_int(mp, meta, "num_edges", 0, 2**62)
    _meta_int(mp, meta, "feature_dim", 1, MAX_FEATURE_DIM)
    _meta_int(mp, meta, "num_classes", 0, MAX_CLASSES)
    if meta["feature_dtype"] not in FEATURE_DTYPES:
        raise DatasetError(mp, f"unsupported feature_dtype {meta['feature_dtype']!r} "
                               f"(one of {', '.join(FEATURE_DTYPES)})")
    if meta["index_dtype"] not in ("int32", "int64"):
        raise DatasetError(mp, f"unsupported index_dtype {meta['index_dtype']!r} (int32 or int64)")
    if np.dtype(meta["index_dtype"]) != index_dtype(n):
        raise DatasetError(mp, f"index_dtype {meta['index_dtype']} does not fit num_nodes {n} "
                               f"(expected {index_dtype(n).name})")
    layout = FeatureLayout(n, meta["feature_dim"], meta["feature_dtype"])
    for key, want in layout.to_meta().items():
        if key in meta and meta[key] != want:
            raise DatasetError(mp, f"field {key!r} is {meta[key]!r}, but feature_dim and "
                                   f"feature_dtype give {want!r}")
    for key, kind in (("directed", bool), ("name", str), ("source", dict)):
        if key in meta and not isinstance(meta[key], kind):
            raise DatasetError(mp, f"field {key!r} must be a {kind.__name__}, got {meta[key]!r}")


def _check_meta_files(mp: Path, files: Any) -> None:
    """The ``files`` field of the ``meta.json`` at ``mp``: an object with an entry for
    every required file, each with an integer ``bytes`` >= 0, sha256 hex digests where
    it has ``sha256``/``sampled_sha256``, and a list of integers as ``block_crc32``."""
    if not isinstance(files, dict):
        raise DatasetError(mp, f"field 'files' must be an object, got {files!r}")
    for name in REQUIRED_FILES:
        entry = files.get(name)
        if entry is None:
            raise DatasetError(mp, f"does not list {name}")
        if not isinstance(entry, dict) or "bytes" not in entry:
            raise DatasetError(mp, f"entry of {name} has no 'bytes'")
        if not _is_int(entry["bytes"]) or entry["bytes"] < 0:
            raise DatasetError(mp, f"'bytes' of {name} must be an integer >= 0, got {entry['bytes']!r}")
        for key in ("sha256", "sampled_sha256"):
            d = entry.get(key)
            if d is not None and not (isinstance(d, str) and len(d) == 64
                                      and all(c in "0123456789abcdef" for c in d)):
                raise DatasetError(mp, f"{key!r} of {name} is not a sha256 hex digest")
        crcs = entry.get("block_crc32")
        if crcs is not None and not (isinstance(crcs, list) and all(_is_int(c) for c in crcs)):
            raise DatasetError(mp, f"'block_crc32' of {name} must be a list of integers")


def _load_npy(path: Path, dtype, shape: tuple | None, mmap: bool = False) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(path, "missing")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        if mmap:
            watch(path)
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


def _npy_chunks(path: Path, arr: np.ndarray, step: int = 1 << 18):
    """``(start, values)`` chunks of the memory-mapped 1-D ``.npy`` array ``arr`` (from
    ``path``), read with plain reads: scanning a large array this way leaves none of its
    pages mapped into the process (a memmap scan would, counted as its RSS)."""
    assert isinstance(arr, np.memmap), "opened with mmap=True"  # its offset locates the data
    with open(path, "rb") as f:
        for a in range(0, arr.shape[0], step):
            f.seek(arr.offset + a * arr.itemsize)
            chunk = np.fromfile(f, dtype=arr.dtype, count=min(step, arr.shape[0] - a))
            if chunk.size < min(step, arr.shape[0] - a):
                raise DatasetError(path, "truncated (ends before its header's shape)")
            yield a, chunk


def _check_indptr(path: Path, indptr: np.ndarray, num_edges: int) -> None:
    """``indptr`` (int64 [N+1], memory-mapped) starts at 0, ends at ``num_edges`` and never
    decreases; one streaming pass of plain reads."""
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0 or last != num_edges:
        raise DatasetError(path, f"must start at 0 and end at num_edges={num_edges} "
                                 f"(got {first} .. {last})")
    prev = 0
    for a, chunk in _npy_chunks(path, indptr):
        down = np.flatnonzero(np.diff(chunk, prepend=prev) < 0)
        if down.size:
            raise DatasetError(path, f"not monotone (decreases at node {a + int(down[0]) - 1})")
        prev = int(chunk[-1])


def _split_overlap_table(splits: list[np.ndarray], num_nodes: int) -> tuple[int, int, int] | None:
    """:func:`split_overlap` with an owner table of ``num_nodes`` bytes (O(N), no sort)."""
    owner = np.full(num_nodes, -1, dtype=np.int8)
    for i, s in enumerate(splits):
        if s.size == 0:
            continue
        prev = owner[s]
        if (prev >= 0).any():
            k = int(np.argmax(prev >= 0))
            return int(prev[k]), i, int(s[k])
        owner[s] = i
        if np.count_nonzero(owner == i) < s.size:
            u, counts = np.unique(s, return_counts=True)
            return i, i, int(u[np.argmax(counts > 1)])
    return None


def split_overlap(splits: list[np.ndarray], num_nodes: int) -> tuple[int, int, int] | None:
    """The first problem among split id arrays (int64, in ``[0, num_nodes)``):
    ``(i, i, id)`` for an id twice in split ``i``, ``(i, j, id)`` for an id in
    splits ``i < j``; None when every id is in at most one split once. Memory grows with
    the splits, not with N: an owner table of N bytes when the splits hold at least N/8
    ids, else sorted arrays of the ids seen."""
    if 8 * sum(s.size for s in splits) >= num_nodes:  # a table of N bytes is the cheaper
        return _split_overlap_table(splits, num_nodes)
    seen = np.zeros(0, dtype=np.int64)        # sorted ids of the splits before
    owner = np.zeros(0, dtype=np.int64)       # their split, aligned with ``seen``
    for i, s in enumerate(splits):            # memory: the splits' size, not N
        if s.size == 0:
            continue
        if seen.size:
            at = np.minimum(np.searchsorted(seen, s), seen.size - 1)
            hit = seen[at] == s
            if hit.any():
                k = int(np.argmax(hit))
                return int(owner[at[k]]), i, int(s[k])
        u, counts = np.unique(s, return_counts=True)
        if u.size < s.size:
            return i, i, int(u[np.argmax(counts > 1)])
        order = np.argsort(np.concatenate([seen, u]), kind="stable")
        seen = np.concatenate([seen, u])[order]
        owner = np.concatenate([owner, np.full(u.size, i, dtype=np.int64)])[order]
    return None


def open_dataset(path: str | os.PathLike, verify: bool = False) -> Dataset:
    """Open and validate the dataset folder at ``path``.

    Cheap checks always run: format and version, ``meta.json``'s own checksum
    (required: a file without one is refused), every field of
    ``meta.json`` (types, ranges, consistency), every file present with the
    size ``meta.json`` records and the size its fields imply, checksums of
    small ``.npy`` files and of sampled pages of the ``.bin`` files, the
    recorded id range of ``indices.bin`` against ``num_nodes`` (a dataset
    written before ooc recorded it has a small ``indices.bin`` scanned),
    ``indptr`` starting at 0, monotone and ending at ``num_edges``, labels in
    ``[-1, num_classes)``, split ids in range, each in at most one split once.
    ``verify=True`` also scans all of ``indices.bin``.

    Raises:
        DatasetError: naming the file and the problem.
    """
    path = Path(path)
    meta = _load_meta(path)
    mp = path / "meta.json"
    n = meta["num_nodes"]
    layout = FeatureLayout(n, meta["feature_dim"], meta["feature_dtype"])
    linked, linked_rows = _linked_features(path, meta)
    feature_file = linked if linked is not None else path / "features.bin"
    file_layout = (layout if linked is None
                   else FeatureLayout(linked_rows, layout.dim, layout.dtype))
    _check_files(path, meta, file_layout, feature_file)
    indptr = _load_npy(path / "indptr.npy", np.int64, None, mmap=True)
    if indptr.shape[0] != n + 1:  # the file matched its recorded size: num_nodes is off
        raise DatasetError(mp, f"num_nodes {n} does not match indptr.npy ({indptr.shape[0]} "
                               f"entries: {indptr.shape[0] - 1} nodes); meta.json was changed "
                               f"after the dataset was written (write it again with "
                               f"ooc.prepare)")
    _check_indptr(path / "indptr.npy", indptr, meta["num_edges"])
    indices = _open_indices(path, meta, verify)
    labels = _open_labels(path, n, meta["num_classes"])
    splits = _load_splits(path, n)
    if meta["checksum"] != meta_checksum(meta):
        raise DatasetError(mp, "was edited after the dataset was written (its checksum does not "
                               "match its fields); write the dataset again with ooc.prepare")
    row_of = _load_row_map(path, meta, n, file_layout.num_rows if linked is not None else None)
    ds = Dataset(path=path, meta=meta, indptr=indptr, indices=indices,
                 features=None, labels=labels, train_idx=splits[0], val_idx=splits[1],
                 test_idx=splits[2], layout=layout, row_of=row_of, linked_file=linked,
                 linked_rows=linked_rows)
    ds.features = ds.by_node(MmapFeatures(feature_file, file_layout))
    return ds


def _linked_features(path: Path, meta: dict) -> tuple[Path | None, int]:
    """The feature file a dataset links (:data:`FEATURE_LINK`) and its rows, found by
    its path relative to the folder ``path``, else its absolute path; ``(None, 0)`` for
    a dataset with its own ``features.bin``.

    Raises:
        DatasetError: a malformed link, a link without a row map, or no file at either
            path (named, with what reads from it).
    """
    link = meta.get(FEATURE_LINK)
    if link is None:
        return None, 0
    mp = path / "meta.json"
    if not (isinstance(link, dict) and isinstance(link.get("path"), str)
            and isinstance(link.get("abs_path"), str) and _is_int(link.get("num_rows"))
            and link["num_rows"] >= 0):
        raise DatasetError(mp, f"field {FEATURE_LINK!r} must hold 'path', 'abs_path' and "
                               f"'num_rows', got {link!r}")
    if "feature_order" not in meta:
        raise DatasetError(mp, f"field {FEATURE_LINK!r} is set without 'feature_order' (the "
                               f"map of nodes to the linked file's rows)")
    near, far = Path(os.path.normpath(path / link["path"])), Path(link["abs_path"])
    for p in (near, far):
        if p.is_file():
            return p, int(link["num_rows"])
    raise DatasetError(near, f"missing: {path} reads its feature rows from this file (linked "
                             f"by ooc.partition --features link)"
                             + ("" if near == far else f"; also not at {far}"))


def _check_files(path: Path, meta: dict, layout: FeatureLayout, feature_file: Path) -> None:
    """The required files of the folder ``path`` against its ``meta`` (checked by
    :func:`_load_meta`): the sizes of ``features.bin`` (``layout``, the layout of
    ``feature_file``: this folder's or a linked one) and ``indices.bin`` that the counts
    imply and the number of block checksums of ``indices.bin``, then each file's size on
    disk and its sha256 (full or of sampled pages) where recorded."""
    mp = path / "meta.json"
    e = meta["num_edges"]
    files = meta["files"]
    idt = np.dtype(meta["index_dtype"])
    implied = {"features.bin": layout.file_bytes, "indices.bin": padded_bytes(e * idt.itemsize)}
    for name, want in implied.items():
        if files[name]["bytes"] != want:
            raise DatasetError(mp, f"lists {name} with {files[name]['bytes']} bytes, but its "
                                   f"num_nodes/num_edges/feature fields give {want}")
    for name, entry in files.items():
        crcs = entry.get("block_crc32") if isinstance(entry, dict) else None
        if crcs is None or not _is_int(entry.get("bytes")):
            continue
        if not isinstance(crcs, list) or len(crcs) != block_count(name, entry, meta):
            size = f"num_edges={e}" if name == "indices.bin" else f"{entry['bytes']} bytes"
            got = len(crcs) if isinstance(crcs, list) else repr(crcs)
            raise DatasetError(mp, f"lists {got} block checksums of {name}, but "
                                   f"{size} gives {block_count(name, entry, meta)}")
    for name in REQUIRED_FILES:
        p = feature_file if name == "features.bin" else path / name
        _check_size(p, files[name]["bytes"])
        digest = files[name].get("sha256")
        if digest is not None and sha256_file(p) != digest:
            raise DatasetError(p, "checksum does not match meta.json (corrupted file)")
        digest = files[name].get("sampled_sha256")
        if digest is not None and sampled_sha256(p, files[name]["bytes"]) != digest:
            raise DatasetError(p, "checksum of sampled pages does not match meta.json "
                                  "(corrupted file)")


def _open_indices(path: Path, meta: dict, verify: bool) -> np.ndarray:
    """``indices.bin`` of the folder ``path`` as an int32/int64 [E] memmap (an empty
    array when E is 0). The id range ``meta`` records must lie in ``[0, N)``; the file is
    scanned (:func:`scan_index_range`) with ``verify``, or when ``meta`` records no
    range and the file is at most ``INDEX_SCAN_LIMIT`` bytes."""
    mp = path / "meta.json"
    n, e = meta["num_nodes"], meta["num_edges"]
    files = meta["files"]
    idt = np.dtype(meta["index_dtype"])
    ipath = path / "indices.bin"
    if e and "index_range" in meta:
        lo, hi = meta["index_range"]
        if lo < 0 or hi >= n or lo > hi:
            raise DatasetError(mp, f"index_range [{lo}, {hi}] of indices.bin is not within "
                                   f"[0, {n}) (corrupted meta.json or file)")
    if e and (verify or ("index_range" not in meta and files["indices.bin"]["bytes"] <= INDEX_SCAN_LIMIT)):
        scan_index_range(ipath, idt, e, n, files["indices.bin"].get("block_crc32"))
    if not e:
        return np.zeros(0, dtype=idt)
    watch(ipath)
    return np.memmap(ipath, dtype=idt, mode="r", shape=(e,))


def _open_labels(path: Path, n: int, c: int) -> np.ndarray:
    """``labels.npy`` of the folder ``path`` as an int64 [n] memmap, every label checked
    to be in ``[-1, c)`` (one streaming pass of plain reads)."""
    labels = _load_npy(path / "labels.npy", np.int64, (n,), mmap=True)
    lmin, lmax = 0, -1
    for a, chunk in _npy_chunks(path / "labels.npy", labels):
        lmin, lmax = (min(lmin, int(chunk.min())) if a else int(chunk.min()),
                      max(lmax, int(chunk.max())))
    if n and (lmin < -1 or lmax >= c):
        raise DatasetError(path / "labels.npy",
                           f"label out of range [-1, {c}) (min {lmin}, max {lmax})")
    return labels


def _load_splits(path: Path, n: int) -> list[np.ndarray]:
    """The train, validation and test node ids (int64 [k] each, read into memory) of the
    folder ``path``, each id in ``[0, n)`` and in at most one split once."""
    names = ("train_idx.npy", "val_idx.npy", "test_idx.npy")
    splits = []
    for name in names:
        s = _load_npy(path / name, np.int64, None)
        if s.size and (s.min() < 0 or s.max() >= n):
            raise DatasetError(path / name, f"node id out of range [0, {n})")
        splits.append(s)
    clash = split_overlap(splits, n)
    if clash is not None:
        i, j, v = clash
        what = "twice" if i == j else f"also in {names[i]}"
        raise DatasetError(path / names[j], f"node {v} is listed {what}")
    return splits


def _load_row_map(path: Path, meta: dict, n: int, linked_rows: int | None = None
                  ) -> np.ndarray | None:
    """The memmap of ``feature_rows.npy`` when ``meta.json`` lists one, checked to be a
    permutation of ``0 .. n-1`` (one pass, an n-bit bitmap), else None. With
    ``linked_rows`` (the rows of a linked feature file) it holds ``n`` distinct rows of
    ``0 .. linked_rows-1`` instead."""
    if "feature_order" not in meta:
        return None

    p = path / ROW_MAP_FILE
    entry = meta["files"].get(ROW_MAP_FILE)
    if not isinstance(entry, dict) or not _is_int(entry.get("bytes")):
        raise DatasetError(path / "meta.json", f"field 'feature_order' is set but it does not "
                                               f"list {ROW_MAP_FILE}")
    _check_size(p, entry["bytes"])
    if entry.get("sha256") is not None and sha256_file(p) != entry["sha256"]:
        raise DatasetError(p, "checksum does not match meta.json (corrupted file)")
    rows = n if linked_rows is None else linked_rows
    dtype = np.int32 if rows < (1 << 31) else np.int64
    row_of = _load_npy(p, dtype, (n,), mmap=True)
    seen = np.zeros(-(-rows // 8), dtype=np.uint8)
    for a, chunk in _npy_chunks(p, row_of):
        k = first_repeat(np.ascontiguousarray(chunk), rows, seen)
        if k >= 0:
            what = (f"not a permutation of the {n} feature rows" if linked_rows is None
                    else f"not distinct rows of the linked file's {rows}")
            raise DatasetError(p, f"entry {a + k} ({int(chunk[k])}) is out of range or "
                                  f"repeated: {what}")
    return row_of
