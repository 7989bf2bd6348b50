"""The Zarr output of layer-wise inference: the partial folder, its progress record,
the layer arrays, predictions and the atomic swap into place.

Layout of a finished output (a Zarr v3 group): ``h1`` .. ``hL`` float32
[N, d_l] chunked by ``chunk_rows`` rows, ``pred`` int64 [N], ``row_of_node``
int64 [N] when rows are not in node id order, and ``progress.json`` while it is
written; once finished, the progress record, the ownership marker and the CRC-32 of
every chunk file (:mod:`.chunk_crc`) are in the group's ``ooc`` attributes.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ooc.core.errors import IdOutOfRange, InvalidValue, IOFailure, NotFound
from ooc.executor.inference.chunk_crc import CRC_KEY, check_chunks, check_output, record
from ooc.executor.inference.chunk_rows import ChunkFileRows
from ooc.storage.atomic import carry_user_files, exchange, write_json
from ooc.storage.dataset import Dataset
from ooc.storage.ownership import MARKER, made_by_ooc, mark, marker, user_entries

PROGRESS_FILE = "progress.json"


def fsync_path(path: Path) -> None:
    """fsync a file or folder; a path that cannot be opened is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partial_path(out: str | os.PathLike) -> Path:
    """Where :func:`~ooc.executor.inference.layerwise.layerwise_inference` builds ``out``
    before renaming it: ``.<name>.partial`` in the same folder."""
    out = Path(out)
    return out.parent / f".{out.name}.partial"


def read_embeddings(out: str | os.PathLike, name: str, ids: np.ndarray | None = None) -> np.ndarray:
    """Rows of array ``name`` (``h1`` .. ``hL``, ``pred``) of the finished inference
    output ``out`` for node ids ``ids`` (int [n], each in ``[0, N)``; all nodes, in node id
    order, when None), undoing the processing order, in the stored dtype (intermediate
    layers are float16 when written so).

    The chunk files read (those of the rows asked for, and ``row_of_node``) are checked
    against the CRC-32s :func:`seal` recorded (:mod:`.chunk_crc`); an output sealed by an
    ooc that recorded none is read as it is, with no check.

    Raises:
        NotFound: ``out`` does not exist.
        InvalidValue: ``out`` is not a finished output of ``ooc.infer`` (a dataset, a
            partial output, ...), or it holds no array ``name``.
        IdOutOfRange: an id outside ``[0, N)``.
        DatasetError: a chunk file read is missing, of another size or does not match its
            checksum (edited or corrupted after the run).
    """
    return EmbeddingReader(out, name).read(ids)


class EmbeddingReader:
    """Rows of array ``name`` of the finished inference output ``out``, read by node id
    many times (:func:`read_embeddings` for one read): the output is opened and checked
    once, each chunk file's CRC-32 is checked the first time a read touches it, the
    processing order's ``row_of_node`` is held in memory (4 B a node below 2^31 nodes)
    once read, and scattered rows of a layer are read by the page from its chunk files
    (:class:`~.chunk_rows.ChunkFileRows`), not chunk by whole chunk. Raises as
    :func:`read_embeddings`."""

    def __init__(self, out: str | os.PathLike, name: str):
        self.out = Path(out)
        self.group = _open_output(self.out)
        self.arr = _output_array(self.group, out, name)
        self.name = name
        self.num_nodes = int(self.arr.shape[0])
        self._sealed = _sealed(self.out)
        self._checked: set[int] = set()    # chunks of the array whose CRC matched
        self._row_of: np.ndarray | None = None
        self._pages: ChunkFileRows | None = None
        arr = self.arr
        if arr.ndim == 2 and arr.chunks[1] == arr.shape[1] and not arr.compressors:
            # a layer's raw chunk files: scattered rows read by the page, not whole chunks
            self._pages = ChunkFileRows(self.out / name, self.num_nodes, int(arr.chunks[0]),
                                        int(arr.shape[1]), arr.dtype)

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Stored rows (int64) of node ``ids``."""
        if "row_of_node" not in self.group:
            return ids
        if self._row_of is None:
            check_chunks(self.out, self._sealed, self.group, "row_of_node")
            row_of = np.asarray(self.group["row_of_node"][:])
            small = np.int32 if self.num_nodes < 2**31 else np.int64
            self._row_of = row_of.astype(small, copy=False)
        return self._row_of[ids].astype(np.int64)

    def read(self, ids: np.ndarray | None = None) -> np.ndarray:
        """The rows of node ``ids`` (int [k]; every node in id order when None)."""
        ids = _node_ids(ids, self.num_nodes, self.out)
        rows = self._rows(ids)
        check_chunks(self.out, self._sealed, self.group, self.name, rows, skip=self._checked)
        arr = self.arr
        if rows.size and np.all(np.diff(rows) == 1):
            return np.asarray(arr[int(rows[0]):int(rows[-1]) + 1])
        if self._pages is not None:  # float32 as read, back to the stored dtype (exact)
            return self._pages.read(rows).astype(arr.dtype, copy=False)
        return np.asarray(arr.oindex[rows] if arr.ndim == 1 else arr.oindex[rows, :])


#: The ``format`` attribute of the Zarr group ooc.infer writes.
FORMAT = "ooc-layerwise-inference"
_PASS_OUT = "pass the --out folder of ooc.infer"


def _open_output(out: Path):
    """The Zarr group of the finished inference output ``out``, or one line saying what
    ``out`` is instead."""
    import zarr

    if not (out.exists() or out.is_symlink()):
        raise NotFound(f"{out}: not found ({_PASS_OUT})")
    if not out.is_dir():
        raise InvalidValue(f"{out}: is a file, not an inference output; {_PASS_OUT}")
    if (out / "meta.json").is_file():
        raise InvalidValue(f"{out}: is an ooc dataset, not an inference output; {_PASS_OUT}")
    if (out / "partition.json").is_file():
        raise InvalidValue(f"{out}: is a partition folder of ooc.partition, not an inference "
                           f"output; {_PASS_OUT}")
    try:
        group = zarr.open_group(str(out), mode="r")
        attrs = dict(group.attrs)
    except (ValueError, OSError, TypeError):  # no group there (zarr's errors are ValueErrors
        attrs = {}                            # and OSErrors), or an unreadable zarr.json
    if attrs.get("format") != FORMAT:
        raise InvalidValue(f"{out}: is not an inference output (no Zarr group of ooc.infer "
                           f"there); {_PASS_OUT}")
    if not attrs.get("complete"):
        raise InvalidValue(f"{out}: is an unfinished inference output (the same ooc.infer "
                           f"command resumes it); read the --out folder once it completes")
    return group


def _output_array(group, out: str | os.PathLike, name: str):
    """The layer or prediction array ``name`` of ``group`` (one line when absent)."""
    import zarr

    layers = int(group.attrs["num_layers"])
    if not isinstance(name, str) or name not in [f"h{l + 1}" for l in range(layers)] + ["pred"]:
        raise InvalidValue(f"{out}: no array {name!r}: the output of a {layers}-layer model "
                           f"has h1 .. h{layers} and pred")
    if name not in group:
        dropped = group.attrs.get("dropped")
        if isinstance(dropped, list) and name in dropped:
            raise InvalidValue(f"{out}: {name} was not kept (a layer is deleted once the next "
                               f"is complete; keep_layers=True / --keep-layers keeps it)")
        raise InvalidValue(f"{out}: {name} is missing from the output (it has "
                           f"{', '.join(sorted(group.array_keys()))})")
    arr = group[name]
    if not isinstance(arr, zarr.Array):
        raise InvalidValue(f"{out}: {name} is a group, not an array")
    return arr


def _node_ids(ids: Any, n: int, out: str | os.PathLike) -> np.ndarray:
    """``ids`` as int64 [k] checked in ``[0, n)`` (``arange(n)`` for None)."""
    if ids is None:
        return np.arange(n, dtype=np.int64)
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise InvalidValue(f"ids must be a 1-d array of integer node ids, got {a.dtype} of "
                           f"shape {a.shape}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= n):  # before int64 wraps a uint64
        bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
        raise IdOutOfRange(f"{out}: node id {bad} out of range [0, {n})")
    return a.astype(np.int64)


# ----------------------------------------------------------------------------- progress
def read_progress(folder: Path) -> dict | None:
    """``folder/progress.json`` as a dict, or the record :func:`seal` moved into a finished
    output's group attributes; None when absent or unreadable."""
    try:
        old = json.loads((folder / PROGRESS_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        old = _sealed(folder).get("progress")
    return old if isinstance(old, dict) and isinstance(old.get("fingerprint"), dict) else None


def _sealed(folder: Path) -> dict:
    """The ``ooc`` attributes of the Zarr group in ``folder`` ({} when none)."""
    try:
        attrs = json.loads((folder / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    ooc = attrs.get("ooc") if isinstance(attrs, dict) else None
    return ooc if isinstance(ooc, dict) else {}


def seal(work: Path, group) -> None:
    """Move the finished run's progress record and ownership marker into the group's
    attributes (``attrs["ooc"]``), so the output folder holds nothing but Zarr's own files
    (Zarr warns about any other file when the group is opened), with the CRC-32 of every
    chunk file of every array (:func:`.chunk_crc.record`)."""

    made = marker(work)
    if made is not None:
        made["files"] = sorted(p.name for p in work.iterdir() if p.name not in (PROGRESS_FILE, MARKER))
    group.attrs["ooc"] = {"progress": read_progress(work), "made": made,
                          CRC_KEY: record(work, group)}
    for name in (PROGRESS_FILE, MARKER):
        with contextlib.suppress(FileNotFoundError):
            (work / name).unlink()


def check_finished(out: Path, full: bool = False) -> None:
    """Check the finished output ``out`` before it is reused: its chunk files' sizes and
    the CRCs of a sample of them, or of all when ``full`` (:func:`.chunk_crc.check_output`;
    a one-line :class:`~ooc.core.errors.DatasetError` when one fails)."""
    import zarr

    check_output(out, _sealed(out), zarr.open_group(str(out), mode="r"), full)


@dataclass
class Progress:
    """What ``progress.json`` of the partial folder records, and the hook called per chunk.

    ``state``: ``fingerprint`` (the run), ``layers_done``, ``layer`` (the one
    being written), ``chunks_done`` (its finished output chunks), ``complete``.
    """
    path: Path
    state: dict
    on_chunk: Callable[[int, int], None] | None = None

    @classmethod
    def open(cls, work: Path, fingerprint: dict,
             on_chunk: Callable[[int, int], None] | None = None) -> "Progress":
        """Resume the record of ``work`` when it is of the same run; else empty ``work``."""
        state = {"fingerprint": fingerprint, "layers_done": 0, "layer": 0, "chunks_done": 0,
                 "complete": False}
        old = read_progress(work)
        if old is not None and old.get("fingerprint") == fingerprint:
            state = old
        else:  # a partial output of another run: start over (the ownership marker and
            # entries of the user's carried in by a replacement that was cut short stay)

            keep = {MARKER, *user_entries(work)}
            for p in work.iterdir():
                if p.name not in keep:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        return cls(work / PROGRESS_FILE, state, on_chunk)

    @property
    def resumed(self) -> bool:
        return bool(self.state["layers_done"] or self.state["chunks_done"])

    def save(self) -> None:
        write_json(self.path, self.state)

    def first_chunk(self, l: int, exists: bool) -> int:
        """The first output chunk of layer ``l`` still to write (0 unless resuming it)."""
        return int(self.state["chunks_done"]) if (self.state["layer"] == l and exists) else 0

    def chunk_written(self, c: int) -> None:
        """Output chunk ``c`` of the current layer is durably written."""
        self.state["chunks_done"] = c + 1
        self.save()

    def layer_written(self, l: int) -> None:
        self.state.update(layers_done=l + 1, layer=l + 1, chunks_done=0)
        self.save()

    def finish(self) -> None:
        self.state["complete"] = True
        self.save()


# ----------------------------------------------------------------------------- the group
def open_group(work: Path, order_name: str, chunk_rows: int, num_layers: int,
               perm: np.ndarray | None, rowof: np.ndarray):
    """Open (or create) the Zarr group in ``work`` and write its attributes and,
    for a processing order other than node ids, ``row_of_node``."""
    import zarr

    group = zarr.open_group(str(work), mode="a")
    group.attrs.update({"format": "ooc-layerwise-inference", "order": order_name,
                        "chunk_rows": chunk_rows, "num_layers": num_layers,
                        "arrays": [f"h{i + 1}" for i in range(num_layers)], "complete": False})
    if perm is not None and "row_of_node" not in group:  # int64 whatever rowof's dtype
        step = row_map_chunk(rowof.shape[0], chunk_rows)
        arr = group.create_array("row_of_node", shape=rowof.shape, dtype="int64",
                                 chunks=(step,), compressors=None)
        for a in range(0, rowof.shape[0], step):
            arr[a:a + step] = rowof[a:a + step]
    return group


def layer_array(group, name: str, n: int, d_out: int, chunk_rows: int,
                dtype: str = "float32"):
    """``group[name]`` when it exists, else a new [n, d_out] array of ``dtype``."""
    if name in group:
        return group[name]
    return group.create_array(name, shape=(n, d_out), dtype=dtype,
                              chunks=(chunk_rows, d_out), compressors=None, fill_value=0.0,
                              overwrite=True)


def drop_layer(group, name: str) -> None:
    """Delete layer array ``name`` (an input no later layer reads) and record it in the
    group's ``dropped`` attribute, so :func:`read_embeddings` can say why it is gone."""
    if name in group:
        del group[name]
    old = group.attrs.get("dropped")
    dropped = list(old) if isinstance(old, list) else []
    if name not in dropped:
        group.attrs["dropped"] = dropped + [name]


#: ``row_of_node``'s rows per Zarr chunk at least (it is written once, in large pieces).
ROW_MAP_CHUNK = 1 << 20
#: The file system's allocation unit where it cannot be read (:func:`disk_bytes`).
FS_BLOCK = 4096


def row_map_chunk(n: int, chunk_rows: int) -> int:
    """Rows per chunk of ``row_of_node`` (int64 [n]): large, but not past ``n`` (Zarr
    writes a chunk whole, so a chunk beyond the array would be written as padding)."""
    return max(1, min(n, max(chunk_rows, ROW_MAP_CHUNK)))


def array_disk_bytes(n: int, rows_per_chunk: int, row_bytes: int, block: int = FS_BLOCK) -> int:
    """Disk of a Zarr array of ``n`` rows of ``row_bytes``, uncompressed, in chunks of
    ``rows_per_chunk`` rows: every chunk written whole (the last one too, padded), each
    chunk file in whole ``block``s, and a block of metadata (``zarr.json``)."""
    chunks = -(-n // max(1, rows_per_chunk))
    per_chunk = -(-rows_per_chunk * row_bytes // block) * block
    return chunks * per_chunk + block


def disk_bytes(n: int, dims: list[int], itemsizes: list[int], keep_layers: bool,
               row_of_node: bool, chunk_rows: int | None = None, block: int = FS_BLOCK) -> int:
    """The most disk an output of ``n`` rows takes while it is computed: layer ``l+1``
    (``dims[l+1]`` wide, ``itemsizes[l]`` bytes a value) beside its input layer, or every
    layer when ``keep_layers``; then ``pred`` (int64) and ``row_of_node`` (int64) too.
    Each array counts as Zarr writes it (:func:`array_disk_bytes`: whole chunks of
    ``chunk_rows`` rows, default one chunk of every row, in whole ``block``s), and the
    group's metadata and the progress file a block each."""
    rows = n if chunk_rows is None else chunk_rows
    size = [0] + [array_disk_bytes(n, rows, d * b, block)
                  for d, b in zip(dims[1:], itemsizes, strict=True)]  # size[0]: the features
    pred = array_disk_bytes(n, rows, 8, block)
    rowof = array_disk_bytes(n, row_map_chunk(n, rows), 8, block) if row_of_node else 0
    base = 2 * block + rowof
    if keep_layers:
        return base + sum(size) + pred
    beside_input = max(size[l] + size[l + 1] for l in range(len(size) - 1))
    return base + max(beside_input, size[-1] + pred)


def write_chunk(group, arr, name: str, c: int, c0: int, buf: np.ndarray) -> None:
    """Write rows ``c0..`` of output chunk ``c`` and fsync its file."""
    arr[c0:c0 + buf.shape[0]] = buf
    fsync_path(Path(group.store.root) / name / "c" / str(c) / "0")


def _split_codes(dataset: Dataset, n: int) -> np.ndarray:
    """int8 [N]: 1 train, 2 val, 3 test, 0 none."""
    split_of = np.zeros(n, dtype=np.int8)
    for code, ids in ((1, dataset.train_idx), (2, dataset.val_idx), (3, dataset.test_idx)):
        split_of[ids] = code
    return split_of


def predictions(dataset: Dataset, group, name: str, perm: np.ndarray, chunk_rows: int,
                num_chunks: int, write: bool = True) -> dict:
    """Write ``pred`` (argmax of the last layer, processing order) and accuracies when
    the last layer has one column a class (``write=False``: read ``pred`` as it is)."""
    n = perm.shape[0]
    arr = group[name]
    if write:
        pred_arr = group.create_array("pred", shape=(n,), dtype="int64", chunks=(chunk_rows,),
                                      compressors=None, fill_value=-1, overwrite=True)
    else:
        pred_arr = group["pred"]
    # an output of another width than the classes (a link model's embeddings) predicts none
    has_labels = dataset.num_classes > 0 and int(arr.shape[1]) == dataset.num_classes
    split_of = _split_codes(dataset, n) if has_labels else None
    correct = np.zeros(4, dtype=np.int64)
    total = np.zeros(4, dtype=np.int64)
    for c in range(num_chunks):
        c0, c1 = c * chunk_rows, min(n, (c + 1) * chunk_rows)
        if write:
            p = np.asarray(arr[c0:c1]).argmax(axis=1).astype(np.int64)
            pred_arr[c0:c1] = p
        else:
            p = np.asarray(pred_arr[c0:c1])
        if split_of is not None:  # has_labels
            nodes = perm[c0:c1]
            y = dataset.read_labels(nodes)
            sp = split_of[nodes]
            correct += np.bincount(sp[(p == y) & (y >= 0)], minlength=4)
            total += np.bincount(sp[y >= 0], minlength=4)
    res: dict[str, Any] = {"predictions": "pred"}
    if has_labels:
        res["accuracy"] = {k: (float(correct[i] / total[i]) if total[i] else None)
                           for i, k in ((1, "train"), (2, "val"), (3, "test"))}
        res["test_accuracy"] = res["accuracy"]["test"]
    return res


# ----------------------------------------------------------------------------- atomic output
def not_replaceable(out: Path) -> str | None:
    """Why ``out`` is not an output of this module that ``overwrite`` may replace."""

    if out.is_symlink() or not out.is_dir():
        return "is not a folder"
    if read_progress(out) is None:
        return f"has no {PROGRESS_FILE} of ooc.infer (not an inference output)"
    if not made_by_ooc(out, "output"):
        return f"was not made by ooc (no {MARKER} marker; a {PROGRESS_FILE} alone does not say so)"
    return None


@contextlib.contextmanager
def locked_partial(work: Path):
    """Create ``work`` (when absent, with ooc's ownership marker) for a caller that holds
    the output's lock (:func:`~ooc.storage.locks.exclusive`); a ``work`` holding nothing
    but the marker is removed afterwards. A symlink there, or a folder of files without the
    marker, is refused."""

    try:
        if work.is_symlink():
            raise InvalidValue(f"{work}: is a symlink where ooc.infer keeps its partial output; "
                               f"remove it or choose another --out")
        work.mkdir(parents=True, exist_ok=True)
        if not made_by_ooc(work, "output"):
            if any(work.iterdir()):
                raise InvalidValue(f"{work}: holds files ooc.infer did not write (no ownership "
                                   f"marker); remove it or choose another --out")
            mark(work, "output", "inference")
    except OSError as e:
        raise IOFailure(f"{work}: cannot create the output folder ({e.strerror or e})") from None
    try:
        yield work
    finally:
        with contextlib.suppress(OSError):
            if [p.name for p in work.iterdir()] == [MARKER]:  # failed before writing anything
                (work / MARKER).unlink()
                work.rmdir()


def swap_in(work: Path, out: Path) -> None:
    """Rename the finished ``work`` folder to ``out`` (replacing an old ``out``, whose
    entries of the user's move into the new one first)."""

    fsync_path(work)
    if os.path.lexists(out):
        carry_user_files(out, work)
        if exchange(work, out):
            shutil.rmtree(work, ignore_errors=True)  # now the old output
        else:
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(work, out)
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(work, out)
    fsync_path(out.parent)
