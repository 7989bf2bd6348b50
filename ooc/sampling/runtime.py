"""Runtime files: one superbatch of sampled batches and its changesets on disk.

A superbatch ``k`` lives in ``<runtime_dir>/sb_<k>/`` as a handful of flat raw
arrays plus offsets (Ginex writes 2×S tiny files; one pair of flat arrays per
superbatch is the same information with far fewer files):

| file | dtype, shape | content |
|---|---|---|
| ``node_ids.bin`` | int64 [T] | every batch's unique node ids, batch after batch |
| ``node_ptr.bin`` | int64 [S+1] | batch i's ids are ``node_ids[node_ptr[i]:node_ptr[i+1]]`` |
| ``edges.bin`` | int32 [2, M] | local edge_index of every batch (row 0 source) |
| ``edge_ptr.bin`` | int64 [S+1] | batch i's edges are columns ``edge_ptr[i]:edge_ptr[i+1]`` |
| ``nodes_per_hop.bin`` | int64 [S, L+1] | PyG ``num_sampled_nodes`` |
| ``edges_per_hop.bin`` | int64 [S, L] | PyG ``num_sampled_edges`` |
| ``cs_*.bin`` | int64 | changesets: init ids, in/out ids with offsets, in_positions |
| ``superbatch.json`` | | shapes and dtypes; written last (its presence marks the sample files complete) |
| ``changesets.json`` | | written after the cs files (marks the changesets complete) |

The inspector's own threads write them, so writing overlaps training; each file
goes to a temp name and is renamed. Plain writes: aiofiles from an event loop per
superbatch were slower on small superbatches and gained little on large ones
(``python -m bench runtime_writes``; ``docs/benchmarks.md``).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ooc.caches.changesets import FlatChangesets
from ooc.core.errors import InvalidValue, IOFailure, NotFound
from ooc.sampling.sampler import SampledBatch

SAMPLE_MARK = "superbatch.json"
CHANGESET_MARK = "changesets.json"


@dataclass
class SuperbatchSamples:
    """S sampled batches as flat arrays (see the module docstring for shapes)."""

    node_ids: np.ndarray
    node_ptr: np.ndarray
    edges: np.ndarray
    edge_ptr: np.ndarray
    nodes_per_hop: np.ndarray
    edges_per_hop: np.ndarray

    def __len__(self) -> int:
        return len(self.node_ptr) - 1

    @classmethod
    def from_batches(cls, batches: Sequence[SampledBatch], num_layers: int) -> "SuperbatchSamples":
        s = len(batches)
        node_ptr = np.zeros(s + 1, np.int64)
        edge_ptr = np.zeros(s + 1, np.int64)
        np.cumsum([len(b.node_ids) for b in batches], out=node_ptr[1:])
        np.cumsum([b.edge_index.shape[1] for b in batches], out=edge_ptr[1:])
        nph = np.zeros((s, num_layers + 1), np.int64)
        eph = np.zeros((s, num_layers), np.int64)
        for i, b in enumerate(batches):
            nph[i, : len(b.num_sampled_nodes)] = b.num_sampled_nodes
            eph[i, : len(b.num_sampled_edges)] = b.num_sampled_edges
        node_ids = (np.concatenate([b.node_ids for b in batches]).astype(np.int64, copy=False)
                    if s else np.zeros(0, np.int64))
        edges = (np.concatenate([b.edge_index for b in batches], axis=1).astype(np.int32)
                 if s else np.zeros((2, 0), np.int32))
        return cls(node_ids, node_ptr, edges, edge_ptr, nph, eph)

    def ids(self, i: int) -> np.ndarray:
        """Unique node ids of batch i, int64 [n_i] (seeds first)."""
        return self.node_ids[self.node_ptr[i]:self.node_ptr[i + 1]]

    def batch(self, i: int) -> SampledBatch:
        nph = self.nodes_per_hop[i]
        eph = self.edges_per_hop[i]
        return SampledBatch(
            node_ids=self.ids(i),
            num_seeds=int(nph[0]),
            edge_index=self.edges[:, self.edge_ptr[i]:self.edge_ptr[i + 1]].astype(np.int64),
            num_sampled_nodes=[int(v) for v in nph],
            num_sampled_edges=[int(v) for v in eph],
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {"node_ids": self.node_ids, "node_ptr": self.node_ptr, "edges": self.edges,
                "edge_ptr": self.edge_ptr, "nodes_per_hop": self.nodes_per_hop,
                "edges_per_hop": self.edges_per_hop}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())


# -- writing ---------------------------------------------------------------

def _write_one(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        # bytes as a flat uint8 view: a cast of an empty 2-D view (no edges) is refused
        f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    os.replace(tmp, path)


def write_arrays(folder: Path, arrays: dict[str, np.ndarray], mark: str) -> None:
    """Each array to ``folder/<name>.bin``, then ``mark`` (their dtypes and shapes) last."""
    try:
        for k, a in arrays.items():
            _write_one(folder / f"{k}.bin", a)
        spec = {k: {"dtype": a.dtype.name, "shape": list(a.shape)} for k, a in arrays.items()}
        tmp = folder / (mark + ".tmp")
        tmp.write_text(json.dumps(spec))
        os.replace(tmp, folder / mark)
    except OSError as e:
        raise IOFailure(f"{e.filename or folder}: {e.strerror or e} while writing runtime "
                        f"files") from None


def superbatch_dir(runtime_dir: str | os.PathLike, k: int) -> Path:
    """The folder of superbatch ``k``'s runtime files under ``runtime_dir``: ``sb_NNNNNN``."""
    return Path(runtime_dir) / f"sb_{k:06d}"


def write_samples(folder: Path, samples: SuperbatchSamples) -> int:
    """Write the sampled batches of one superbatch; returns bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    write_arrays(folder, samples.arrays(), SAMPLE_MARK)
    return samples.nbytes


def write_changesets(folder: Path, cs: FlatChangesets) -> int:
    """Write the changesets of one superbatch; returns bytes written."""
    write_arrays(folder, cs.arrays(), CHANGESET_MARK)
    return cs.nbytes


def _read_arrays(folder: Path, mark: str) -> dict[str, np.ndarray]:
    mp = folder / mark
    if not mp.is_file():
        raise NotFound(f"{mp}: missing (runtime files incomplete)")
    spec = json.loads(mp.read_text())
    out = {}
    for k, s in spec.items():
        p = folder / f"{k}.bin"
        a = np.fromfile(p, dtype=s["dtype"])
        n = int(np.prod(s["shape"])) if s["shape"] else 1
        if a.size != n:
            raise InvalidValue(f"{p}: truncated runtime file ({a.size} of {n} values)")
        out[k] = a.reshape(s["shape"])
    return out


def read_sample_ids(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(node_ids, node_ptr)`` of one superbatch's samples (its edges left on disk)."""
    mp = folder / SAMPLE_MARK
    if not mp.is_file():
        raise NotFound(f"{mp}: missing (runtime files incomplete)")
    spec = json.loads(mp.read_text())
    out = []
    for k in ("node_ids", "node_ptr"):
        p = folder / f"{k}.bin"
        a = np.fromfile(p, dtype=spec[k]["dtype"])
        if a.size != int(np.prod(spec[k]["shape"])):
            raise InvalidValue(f"{p}: truncated runtime file ({a.size} values)")
        out.append(a)
    return out[0], out[1]


def read_samples(folder: Path) -> SuperbatchSamples:
    """The sampled batches of one superbatch, as :func:`write_samples` wrote them."""
    return SuperbatchSamples(**_read_arrays(folder, SAMPLE_MARK))


def read_changesets(folder: Path) -> FlatChangesets:
    """The changesets of one superbatch, as :func:`write_changesets` wrote them."""
    a = _read_arrays(folder, CHANGESET_MARK)
    return FlatChangesets(**{k[3:]: v for k, v in a.items()})


def remove_superbatch(folder: Path) -> None:
    """Delete a superbatch's folder and its files (nothing when it is gone)."""
    shutil.rmtree(folder, ignore_errors=True)
