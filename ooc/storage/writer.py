"""Writing a dataset folder (format v1) into a temp folder, renamed when complete."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ooc.core.errors import DatasetError, IdOutOfRange, InvalidValue, OocError
from ooc.storage.atomic import atomic_dir, write_json
from ooc.storage.dataset import (
    CHECKSUM_LIMIT,
    FEATURE_LINK,
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_CLASSES,
    REQUIRED_FILES,
    ROW_MAP_FILE,
    block_crc32s,
    meta_checksum,
    open_dataset,
    replace_problem,
    sampled_sha256,
    scan_index_range,
    sha256_file,
    split_overlap,
)
from ooc.storage.link_split import META_KEY as LINK_SPLIT_KEY
from ooc.storage.link_split import SPLIT_FILES as LINK_SPLIT_FILES
from ooc.storage.link_split import LinkSplitSpec, hold_out
from ooc.storage.layout import (
    FEATURE_DTYPES,
    PAGE,
    FeatureLayout,
    RowView,
    index_dtype,
    padded_bytes,
    read_rows,
)
from ooc.storage.pagecache import release_mapped
from ooc.storage.reorder import OrderStats, RowPlacer, locality_order, permute_rows, rows_of
from ooc.storage.reserve import is_no_room, map_for_writing, npy_for_writing

#: ``reorder`` values of :class:`DatasetWriter` (``--reorder`` of ``ooc.prepare``).
REORDERS = ("auto", "locality", "none")
#: Feature rows :meth:`DatasetWriter.check_features` masks at a time: the masks stay small
#: beside the chunk.
CHECK_ROWS = 1 << 16


class DatasetWriter:
    """Streams a dataset into ``<out>.tmp-*`` and renames it to ``out`` on success.

    Usage::

        with DatasetWriter(out, num_nodes=N, feature_dim=D) as w:
            w.write_indptr(indptr)                 # int64 [N+1]
            w.indices()[:] = indices                # memmap int32/int64 [E]
            w.features()[0:N] = x                   # rows, any float dtype
            w.write_labels(labels, num_classes)     # int64 [N], -1 unlabeled
            w.write_splits(train, val, test)        # int64 ids

    Leaving the block with an exception removes the temp folder; leaving it
    normally scans ``indices.bin`` once (ids in range; the min and max go to
    ``meta.json`` as ``index_range``), writes ``meta.json`` with checksums,
    validates the result with :func:`open_dataset` and renames. ``OSError``
    (e.g. a full disk) becomes an :class:`OocError` naming the output folder.

    Feature rows are checked for NaN and infinities as stored (a float16
    overflow counts): rows passed to :meth:`check_features` while streaming,
    the rest read back at the end. Any is an error unless
    ``allow_nonfinite``; the count goes to ``meta.json`` as
    ``nonfinite_features``. ``overwrite`` replaces only an ooc dataset folder.

    ``reorder``: ``locality`` stores the feature rows in a locality order
    (:func:`~ooc.storage.reorder.locality_order`: neighbours' rows share pages) once the
    rest is written, with ``feature_rows.npy`` mapping node ids to rows; node ids, labels,
    splits and the adjacency stay as given. ``auto`` does so when rows are smaller than
    a page (larger rows are read a row at a time, so their order changes nothing);
    ``none`` keeps node order. ``buffer_bytes`` bounds the memory the reorder uses.

    ``link_split``: a :class:`~ooc.storage.link_split.LinkSplitSpec`; the held-out edges
    leave the adjacency once it is written, before anything reads it (the reorder, the
    checksums), and are stored with their negatives (:mod:`ooc.storage.link_split`).
    """

    def __init__(self, out: str | os.PathLike, num_nodes: int, feature_dim: int,
                 feature_dtype: str = "float32", name: str = "", directed: bool = True,
                 overwrite: bool = False, source: dict[str, Any] | None = None,
                 allow_nonfinite: bool = False, features_name: str = "features",
                 reorder: str = "none", buffer_bytes: int = 256 << 20,
                 link_split: LinkSplitSpec | None = None):
        if reorder not in REORDERS:
            raise InvalidValue(f"reorder must be one of {', '.join(REORDERS)}, got {reorder!r}")
        if feature_dtype not in FEATURE_DTYPES:
            raise InvalidValue(f"feature dtype must be one of {FEATURE_DTYPES}, got {feature_dtype!r}")
        if num_nodes < 0 or feature_dim < 1:
            raise InvalidValue(f"bad dataset shape: num_nodes={num_nodes}, feature_dim={feature_dim}")
        self.out = Path(out)
        self.num_nodes = int(num_nodes)
        self.layout = FeatureLayout(self.num_nodes, int(feature_dim), feature_dtype)
        self.name = name or self.out.name
        self.directed = directed
        self.overwrite = overwrite
        self.source = dict(source or {})
        self.extra_meta: dict[str, Any] = {}
        self.num_edges: int | None = None
        self.num_classes: int | None = None
        self._ctx: contextlib.AbstractContextManager[Path] | None = None
        self.tmp: Path | None = None
        self._indices: np.ndarray | None = None     # a memmap, or an empty array when E == 0
        self._features: np.ndarray | None = None    # likewise
        self.allow_nonfinite = allow_nonfinite
        self.features_name = features_name
        self.reorder = reorder
        self.buffer_bytes = int(buffer_bytes)
        self.nonfinite = 0
        self.first_nonfinite = -1
        self._rows_checked = 0
        self._row_of: np.ndarray | None = None      # the locality order's node -> row map
        self._order_stats: Any = None
        self._placer: Any = None                    # a RowPlacer while rows stream in
        self._placed = 0                            # buckets of the rows placed as streamed
        self._given_order: dict[str, Any] | None = None  # meta of a row order set by the caller
        self._link: dict[str, Any] | None = None    # the feature file linked instead of written
        self.link_split = link_split
        if link_split is not None:
            link_split.check(self.num_nodes)

    # -- context -----------------------------------------------------------
    def __enter__(self) -> "DatasetWriter":
        self._ctx = atomic_dir(self.out, overwrite=self.overwrite, replaceable=replace_problem,
                               locked="dataset", what="dataset")
        self.tmp = self._ctx.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        assert self._ctx is not None  # set by __enter__, which ran if __exit__ runs
        try:
            if exc_type is None:
                self._finish()
        except BaseException as e:  # noqa: BLE001 - re-raised through the context
            self._close_maps()
            self._ctx.__exit__(type(e), e, e.__traceback__)
            if isinstance(e, OSError):
                raise self._os_error(e) from None
            raise
        self._close_maps()
        try:
            self._ctx.__exit__(exc_type, exc, tb)  # renames into place when exc is None
        except OSError as e:
            raise self._os_error(e) from None
        if isinstance(exc, OSError):
            raise self._os_error(exc) from None
        return False

    @property
    def _dir(self) -> Path:
        """The temp folder being written (exists between ``__enter__`` and ``__exit__``)."""
        if self.tmp is None:
            raise InvalidValue(f"DatasetWriter({self.out}): write parts inside its with block")
        return self.tmp

    def _os_error(self, e: OSError) -> OocError:
        if isinstance(e, OocError):  # raised by ooc with its own one-line message
            return e
        what = "disk full" if is_no_room(e) else (e.strerror or str(e))
        where = e.filename or self.out
        return OocError(f"{where}: {what} while writing dataset {self.out}; nothing was written")

    def _close_maps(self) -> None:
        for mm in (self._indices, self._features):
            if isinstance(mm, np.memmap):
                mm.flush()
        self._indices = self._features = None
        if self._placer is not None:
            self._placer.close()
            self._placer = None

    # -- parts ---------------------------------------------------------------
    def write_indptr(self, indptr: np.ndarray) -> None:
        """Write the CSC row pointer, int64 [N+1]; fixes ``num_edges``."""
        indptr = np.asarray(indptr, dtype=np.int64)
        if indptr.shape != (self.num_nodes + 1,):
            raise InvalidValue(f"indptr has shape {indptr.shape}, expected ({self.num_nodes + 1},)")
        np.save(self._dir / "indptr.npy", indptr)
        self.num_edges = int(indptr[-1])

    def indptr_sink(self) -> "NpySink":
        """``indptr.npy`` written in pieces (int64 [N+1], in order, through a file map
        whose pages leave the RSS after each piece); :meth:`NpySink.close` fixes
        ``num_edges`` from its last entry."""
        def done(mm: np.ndarray) -> None:
            self.num_edges = int(mm[-1])
        return NpySink(self._dir / "indptr.npy", self.num_nodes + 1, done)

    def indices(self, num_edges: int | None = None) -> np.ndarray:
        """Writable memmap of ``indices.bin`` (int32 or int64 [E]), page-padded."""
        if self._indices is None:
            e = self.num_edges if num_edges is None else int(num_edges)
            if e is None:
                raise InvalidValue("write_indptr (or pass num_edges) before indices()")
            dt = index_dtype(self.num_nodes)
            self._indices = map_for_writing(self._dir / "indices.bin", dt, (e,),
                                            padded_bytes(e * dt.itemsize))
        return self._indices

    def shrink_indices(self, num_edges: int) -> None:
        """Cut ``indices.bin`` to its first ``num_edges`` ids (after deduplication removed
        edges) and map it again at that length; :meth:`indices` then returns the new map."""
        idt = index_dtype(self.num_nodes)
        self._indices = None
        path = self._dir / "indices.bin"
        # shortened, the file keeps the blocks reserved for its first bytes: no new room needed
        os.truncate(path, padded_bytes(num_edges * idt.itemsize))
        self._indices = (np.memmap(path, dtype=idt, mode="r+", shape=(num_edges,)) if num_edges
                         else np.zeros(0, dtype=idt))

    def features(self) -> RowView:
        """Writable row view of ``features.bin``: ``w.features()[a:b] = rows``."""
        if self._features is None:
            nbytes = self.layout.file_bytes
            self._features = map_for_writing(self._dir / "features.bin", np.uint8, (nbytes,))
        return self.layout.view(self._features)

    def check_features(self, start: int, rows: np.ndarray) -> None:
        """Count NaN/inf in feature rows ``start .. start+len(rows)`` ([n, D],
        any float dtype; counted after conversion to the stored dtype). Rows
        must come in order; rows not passed here are read back at the end."""
        if start != self._rows_checked:
            return
        step = CHECK_ROWS
        for a in range(0, rows.shape[0], step):
            with np.errstate(over="ignore"):  # an overflow to inf is what is being counted
                part = np.asarray(rows[a:a + step], dtype=self.layout.dtype)
            bad = ~np.isfinite(part)
            if bad.any():
                if self.first_nonfinite < 0:
                    self.first_nonfinite = start + a + int(np.argmax(bad.any(axis=1)))
                self.nonfinite += int(bad.sum())
        self._rows_checked = start + rows.shape[0]

    def write_labels(self, labels: Any, num_classes: int | None = None,
                     source: str = "labels") -> None:
        """Labels [N] of any integer, bool or float dtype (:func:`class_ids`: -1, or NaN,
        where unlabeled); at most ``MAX_CLASSES`` classes. ``source`` (the input file)
        goes into errors."""
        labels = np.asarray(labels)
        if labels.shape != (self.num_nodes,):
            raise InvalidValue(f"{source}: labels have shape {labels.shape}, expected "
                               f"({self.num_nodes},)")
        self.write_labels_chunks([labels], num_classes, source)

    def write_labels_chunks(self, chunks, num_classes: int | None = None,
                            source: str = "labels") -> None:
        """Labels from ``chunks`` (arrays in node order, N in all, each checked by
        :func:`class_ids`), written as they come: memory holds one chunk."""
        sink = NpySink(self._dir / "labels.npy", self.num_nodes)
        top = at = 0
        for part in chunks:
            part = class_ids(np.asarray(part).reshape(-1), source, first=at)
            if part.size:
                top = max(top, int(part.max()) + 1)
            sink.write(part)
            at += part.size
        sink.close()
        self.num_classes = int(num_classes if num_classes is not None else top)
        if self.num_classes > MAX_CLASSES or top > self.num_classes:
            raise InvalidValue(f"labels: {max(top, self.num_classes)} classes (largest label {top - 1}); "
                           f"labels must be below num_classes <= {MAX_CLASSES}")

    def write_splits(self, train: np.ndarray, val: np.ndarray, test: np.ndarray,
                     names: tuple[str, str, str] = ("train_idx", "val_idx", "test_idx")) -> None:
        """Split node ids (int64); ``names`` (e.g. the input files) go into errors.

        Raises:
            OocError: an id out of range, listed twice in a split, or in two splits.
        """
        splits = []
        for name, ids in zip(names, (train, val, test), strict=True):
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
                v = int(ids.min()) if ids.min() < 0 else int(ids.max())
                raise IdOutOfRange(f"{name}: node id {v} out of range [0, {self.num_nodes})")
            splits.append(ids)
        clash = split_overlap(splits, self.num_nodes)
        if clash is not None:
            i, j, v = clash
            what = f"lists node {v} twice" if i == j else f"and {names[i]} both list node {v}"
            raise InvalidValue(f"{names[j]}: {what} (each node may be in at most one split, once)")
        for key, ids in zip(("train_idx", "val_idx", "test_idx"), splits, strict=True):
            np.save(self._dir / f"{key}.npy", ids)

    # -- finish ------------------------------------------------------------
    def _finish(self) -> None:
        if self.num_edges is None:
            raise InvalidValue("dataset has no adjacency (write_indptr was not called)")
        self.indices()
        if self.link_split is not None:
            self._hold_out(self.link_split)
        if self._placer is not None:
            raise InvalidValue("feature rows were placed but not finished (FeatureSink.sync)")
        if not self._placed and self._link is None:
            self.features()
        if self.num_classes is None:
            self.write_labels(np.full(self.num_nodes, -1, dtype=np.int64), 0)
        for name in ("train_idx.npy", "val_idx.npy", "test_idx.npy"):
            if not (self._dir / name).exists():
                np.save(self._dir / name, np.zeros(0, dtype=np.int64))
        self._close_maps()
        self._check_remaining_features()
        if self.nonfinite and not self.allow_nonfinite:
            raise InvalidValue(f"{self.features_name}: {self.nonfinite} feature values are NaN or "
                           f"infinite as {self.layout.dtype} (first at node {self.first_nonfinite}); "
                           f"pass --allow-nonfinite to keep them")
        idt = index_dtype(self.num_nodes)
        self._reorder_features()
        try:
            lo, hi, crcs = scan_index_range(self._dir / "indices.bin", idt, self.num_edges,
                                            self.num_nodes)
        except DatasetError as e:
            raise InvalidValue(f"{self.out}: the written dataset is invalid: {e.problem}") from None
        files = {}
        link = self._link
        if link is not None:
            self.extra_meta[FEATURE_LINK] = {
                "path": os.path.relpath(link["file"], self.out.resolve()),
                "abs_path": str(link["file"]), "num_rows": link["num_rows"]}
        for name in REQUIRED_FILES + ((ROW_MAP_FILE,) if "feature_order" in self.extra_meta
                                      else ()) + (LINK_SPLIT_FILES if LINK_SPLIT_KEY in
                                                  self.extra_meta else ()):
            if name == "features.bin" and link is not None:
                files[name] = dict(link["entry"])
                continue
            p = self._dir / name
            entry: dict[str, Any] = {"bytes": p.stat().st_size}
            if name.endswith(".npy") and entry["bytes"] <= CHECKSUM_LIMIT:
                entry["sha256"] = sha256_file(p)
            elif name.endswith(".bin"):
                entry["sampled_sha256"] = sampled_sha256(p, entry["bytes"])
            if name == "indices.bin":
                entry["block_crc32"] = crcs
            elif "sha256" not in entry:  # every page covered: ooc.prepare verify checks them
                entry["block_crc32"] = block_crc32s(p, entry["bytes"])
            files[name] = entry
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "directed": self.directed,
            "index_dtype": idt.name,
            "index_range": [lo, hi],
            **self.layout.to_meta(),
            "num_classes": self.num_classes,
            "nonfinite_features": self.nonfinite,
            "files": files,
            "source": self.source,
            **self.extra_meta,
        }
        meta["checksum"] = meta_checksum(meta)
        write_json(self._dir / "meta.json", meta)
        try:
            open_dataset(self._dir)
        except DatasetError as e:
            raise InvalidValue(f"{self.out}: the written dataset is invalid: {e.problem}") from None

    def _hold_out(self, spec: LinkSplitSpec) -> None:
        """Take the link split's held-out edges out of the written adjacency and store
        them (:func:`~ooc.storage.link_split.hold_out`)."""
        assert self.num_edges is not None  # _finish checked
        kept, info = hold_out(self._dir, self.indices(), self.num_nodes, self.directed, spec,
                              self.buffer_bytes)
        if isinstance(self._indices, np.memmap):
            self._indices.flush()
        self.shrink_indices(kept)
        self.num_edges = kept
        self.extra_meta[LINK_SPLIT_KEY] = info

    def _reorders(self) -> bool:
        lay, n = self.layout, self.num_nodes
        return not (self.reorder == "none" or n < 2 or self._given_order is not None
                    or (self.reorder == "auto" and lay.rows_per_page < 2))

    def _feature_order(self) -> np.ndarray:
        """``row_of`` (node id -> row, int32/int64 [N]) of the locality order, computed once
        from the written adjacency."""
        if self._row_of is None:
            assert self.num_edges is not None  # the adjacency is written: the order reads it
            n = self.num_nodes
            indptr = np.load(self._dir / "indptr.npy", mmap_mode="r")
            idt = index_dtype(n)
            indices = (np.memmap(self._dir / "indices.bin", dtype=idt, mode="r",
                                 shape=(self.num_edges,)) if self.num_edges else np.zeros(0, idt))
            self._order_stats = OrderStats(0, [], 0, 0)
            order = locality_order(indptr, indices,
                                   window_bytes=max(1 << 20, self.buffer_bytes // 4),
                                   stats=self._order_stats)
            del indptr, indices
            self._row_of = rows_of(order)
        return self._row_of

    def store_rows_in(self, row_of: np.ndarray, kind: str, **info: Any) -> None:
        """Declare that the caller writes ``features.bin`` in its own row order: node ``v``'s
        row is ``row_of[v]`` (int [N], a permutation of ``0 .. N-1``, saved as
        ``feature_rows.npy``). ``meta.json``'s ``feature_order`` becomes ``{"kind": kind,
        **info}``; no locality order is computed. Rows go to :meth:`features` by stored row."""
        if row_of.shape != (self.num_nodes,):
            raise InvalidValue(f"{self.out}: the row order has {row_of.shape[0]} entries for "
                               f"{self.num_nodes} nodes")
        self._row_of = np.asarray(row_of, dtype=np.int32 if self.num_nodes < (1 << 31)
                                  else np.int64)
        self._given_order = {"kind": kind, **info}

    def link_features(self, file: Path, num_rows: int, entry: dict[str, Any],
                      row_of: np.ndarray, nonfinite: int = 0) -> None:
        """Read the feature rows from another dataset's ``file`` instead of writing
        ``features.bin`` (see :data:`~ooc.storage.dataset.FEATURE_LINK`): node ``v``'s row is
        row ``row_of[v]`` of it (int [N], distinct rows of ``0 .. num_rows-1``, saved as
        ``feature_rows.npy``). ``entry``: that file's entry in its own ``meta.json``
        (``bytes`` and ``sampled_sha256``), checked whenever this dataset is opened;
        ``nonfinite``: the count of non-finite values that file's dataset records."""
        if row_of.shape != (self.num_nodes,):
            raise InvalidValue(f"{self.out}: the row map has {row_of.shape[0]} entries for "
                               f"{self.num_nodes} nodes")
        file = Path(file).resolve()
        self._row_of = np.asarray(row_of, dtype=np.int32 if num_rows < (1 << 31) else np.int64)
        self._given_order = {"kind": "linked"}
        self._link = {"file": file, "num_rows": int(num_rows),
                      "entry": {k: entry[k] for k in ("bytes", "sampled_sha256") if k in entry}}
        self.nonfinite = int(nonfinite)
        self._rows_checked = self.num_nodes  # rows of a dataset that checked them

    def row_placer(self):
        """A :class:`~ooc.storage.reorder.RowPlacer` that stores feature rows in the
        locality order as they stream in (node order), or None when rows stay in node order
        or the adjacency is not written yet (then :meth:`_finish` permutes the file).
        :meth:`finish_placed` writes ``features.bin`` from it."""
        if self.num_edges is None or not self._reorders() or self._placed:
            return None
        if self._placer is None:
            self._placer = RowPlacer(self._dir / "features.bin", self.layout,
                                     self._feature_order(), self.buffer_bytes)
        return self._placer

    def finish_placed(self) -> None:
        """Write ``features.bin`` from :meth:`row_placer`'s rows (every row must be in)."""
        placer, self._placer = self._placer, None
        try:
            self._placed = placer.finish()
        finally:
            placer.close()

    def _reorder_features(self) -> None:
        """Store ``features.bin`` in a locality order (see the class docstring): already
        done when the rows were placed as they streamed in, else the file is permuted. A
        row order given by :meth:`store_rows_in` is only saved."""
        if self._given_order is not None:
            assert self._row_of is not None  # set with it
            np.save(self._dir / ROW_MAP_FILE, self._row_of)
            self.extra_meta["feature_order"] = self._given_order
            self._row_of = None
            return
        if not self._reorders():
            return

        row_of = self._feature_order()
        buckets = self._placed
        if not buckets:
            src, dst = self._dir / "features.bin", self._dir / "features.reordered"
            buckets = permute_rows(src, dst, self.layout, row_of, self.buffer_bytes,
                                   remove_src=True)
            os.replace(dst, src)
        np.save(self._dir / ROW_MAP_FILE, row_of)
        stats = self._order_stats
        self.extra_meta["feature_order"] = {
            "kind": "locality", "groups": stats.groups, "largest_group": stats.largest_group,
            "sweeps": stats.sweeps, "votes": stats.votes, "longest_list": stats.longest,
            "buckets": buckets}
        self._row_of = None

    def _check_remaining_features(self, step_bytes: int = 16 << 20) -> None:
        """Read back (plain reads: no mapping in RSS) the feature rows
        :meth:`check_features` did not see."""
        lay, n = self.layout, self.num_nodes
        if self._rows_checked >= n:
            return
        if self._placed:  # the file is in the locality order: every row was checked as placed
            raise InvalidValue(f"{self.features_name}: rows from {self._rows_checked} on were "
                               f"never written")
        unit = lay.rows_per_page or 1                       # rows per whole-page group
        group_bytes = PAGE * (1 if lay.rows_per_page else lay.pages_per_row)
        step = unit * max(1, step_bytes // group_bytes)
        with open(self._dir / "features.bin", "rb") as f:
            a = (self._rows_checked // unit) * unit
            while a < n:
                b = min(n, a + step)
                self.check_features(self._rows_checked,
                                    read_rows(f, lay, a, b)[self._rows_checked - a:])
                a = b


class NpySink:
    """An int64 ``.npy`` of ``length`` entries written front to back in pieces through a
    file map; each piece is flushed and its pages dropped from the RSS.

    ``close`` checks that every entry was written and calls ``done(array)``."""

    def __init__(self, path: Path, length: int, done=None):
        self.path = path
        self.length = int(length)
        self.done = done
        self.at = 0
        self.mm = npy_for_writing(path, np.int64, (self.length,))

    def write(self, part: np.ndarray) -> None:
        """Append ``part`` (int64 [k])."""

        k = part.shape[0]
        if self.at + k > self.length:
            raise InvalidValue(f"{self.path.name}: {self.at + k} entries written, it holds "
                               f"{self.length}")
        self.mm[self.at:self.at + k] = part
        self.at += k
        self._flush()
        release_mapped(self.mm)

    def close(self) -> None:
        if self.at != self.length:
            raise InvalidValue(f"{self.path.name}: {self.at} of {self.length} entries written")
        if self.done is not None:
            self.done(self.mm)
        self._flush()
        del self.mm

    def _flush(self) -> None:
        if isinstance(self.mm, np.memmap):  # an empty file maps nothing
            self.mm.flush()


def csc_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """In-memory CSC of the edges ``src -> dst``.

    Returns ``indptr`` int64 [N+1] and ``indices`` int64 [E] where the
    in-neighbours of v are ``indices[indptr[v]:indptr[v+1]]`` (sorted by
    source id within a node). For small graphs and tests; ingest of large
    edge lists streams instead.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order = np.lexsort((src, dst))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src[order]


def class_ids(labels: np.ndarray, source: str = "labels", first: int = 0,
              row: str = "node") -> np.ndarray:
    """int64 class ids of ``labels`` (1-D; integer, bool or float), checked in their own
    dtype before the cast, so a uint64 ``2**64 - 1`` is refused rather than read as -1: a
    label is -1 (unlabeled; NaN too in a float array) or an integer in ``[0,
    MAX_CLASSES)``.

    Raises:
        InvalidValue: another dtype, or the first other value, named with its position
            (``row`` and ``first`` + its index, e.g. ``node 49`` or ``line 50``) and
            ``source``.
    """
    a = np.asarray(labels)
    if a.dtype.kind not in "biuf":
        raise InvalidValue(f"{source}: labels have dtype {a.dtype}; expected integers "
                           f"(-1: unlabeled)")
    unlabeled = a == -1
    whole: Any = True
    if a.dtype.kind == "f":
        unlabeled |= np.isnan(a)
        with np.errstate(invalid="ignore"):
            whole = a == np.floor(a)  # an infinity passes here and fails the range
    bad = ~unlabeled & ~((a >= 0) & (a < MAX_CLASSES) & whole)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidValue(f"{source}: {row} {first + i}: label {a[i].item()} is not a class "
                           f"id in [0, {MAX_CLASSES}) nor -1 (unlabeled)")
    return np.where(unlabeled, -1, a).astype(np.int64)


def write_dataset(out: str | os.PathLike, indptr: np.ndarray, indices: np.ndarray,
                  features: np.ndarray, labels: np.ndarray | None = None,
                  train_idx: np.ndarray | None = None, val_idx: np.ndarray | None = None,
                  test_idx: np.ndarray | None = None, num_classes: int | None = None,
                  feature_dtype: str | None = None, **kwargs: Any) -> Path:
    """Write in-memory arrays as a dataset folder and return its path.

    ``features`` is [N, D]; ``feature_dtype`` defaults to its dtype when that
    is float16, else float32. Extra keyword arguments go to DatasetWriter.
    """
    features = np.asarray(features)
    n, d = features.shape
    if feature_dtype is None:
        feature_dtype = "float16" if features.dtype == np.float16 else "float32"
    with DatasetWriter(out, n, d, feature_dtype, **kwargs) as w:
        w.write_indptr(indptr)
        w.indices()[:] = indices
        w.check_features(0, features)
        w.features()[0:n] = features
        if labels is not None:
            w.write_labels(labels, num_classes)
        empty = np.zeros(0, dtype=np.int64)
        w.write_splits(empty if train_idx is None else train_idx,
                       empty if val_idx is None else val_idx,
                       empty if test_idx is None else test_idx)
    return Path(out)
