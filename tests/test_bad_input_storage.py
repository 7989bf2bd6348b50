"""Bad input to the storage side (issue 17), table-driven, each case in its own process.

Every case is a corrupt file or argument given to the real command-line
entry point (``ooc.prepare`` / ``ooc.train`` / ``ooc.partition`` ``main``) in a child process: a
runner imports ooc once and forks one child per case, so a case that dies of
a signal is a failed case, not a crashed test run (and 40 cases do not pay 40
interpreter starts). Two cases also run as plain ``python -m`` commands.

Each case states the exit code, the one line the command must print last on
stderr (``ooc: <regex>``), and that nothing of the user's changed: every file
present before is byte-identical afterwards, and failed ``prepare`` runs add
nothing (no output, no temp folder).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from conftest import assert_one_line_error, community_graph

from ooc.storage import open_dataset
from ooc.storage.dataset import block_crc32s, meta_checksum, sampled_sha256, scan_index_range, sha256_file

REPO = Path(__file__).resolve().parents[1]
N = 300  # nodes of the base dataset

RUNNER = r"""
import json, os, signal, sys, time
cases = json.load(sys.stdin)
import ooc.partition.__main__, ooc.prepare, ooc.train
import ooc.executor.loader.stack, ooc.executor.training.trainer  # noqa
import ooc.sampling.sampler, ooc.storage.ingest  # noqa
mains = {"ooc.prepare": ooc.prepare.main, "ooc.train": ooc.train.main,
         "ooc.partition": ooc.partition.__main__.main}
results = {}
for c in cases:
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.dup2(os.open(c["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
            os.dup2(os.open(c["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
            os.environ.update(c["env"])
            rc = mains[c["module"]](c["argv"])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc or 0)
    t0 = time.time()
    deadline = t0 + 120
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.01)
    results[c["id"]] = {
        "rc": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "timeout": status is None, "seconds": round(time.time() - t0, 2)}
print(json.dumps(results))
"""


# -- building the inputs ------------------------------------------------------

def _edit_meta(ds: Path, **changes) -> None:
    mp = ds / "meta.json"
    meta = json.loads(mp.read_text())
    for k, v in changes.items():
        if v is _DELETE:
            meta.pop(k, None)
        else:
            meta[k] = v
    mp.write_text(json.dumps(meta))


_DELETE = object()


def _refresh_checksums(ds: Path, blocks: bool = True) -> None:
    """Record the current bytes of every file, as if the corruption had happened
    in pages the sampled checksum does not cover (and, without ``blocks``, keep the block
    checksums of the bytes as they were)."""
    mp = ds / "meta.json"
    meta = json.loads(mp.read_text())
    for name, entry in meta["files"].items():
        p = ds / name
        entry["bytes"] = p.stat().st_size
        if "sha256" in entry:
            entry["sha256"] = sha256_file(p)
        if "sampled_sha256" in entry:
            entry["sampled_sha256"] = sampled_sha256(p, entry["bytes"])
        if "block_crc32" in entry and blocks:
            entry["block_crc32"] = (scan_index_range(p, np.dtype(meta["index_dtype"]),
                                                     meta["num_edges"])[2]
                                    if name == "indices.bin" else block_crc32s(p, entry["bytes"]))
    meta["checksum"] = meta_checksum(meta)
    mp.write_text(json.dumps(meta))


def _poke_indices(ds: Path, where: dict[int, int] | None = None, every: int = 0,
                  value: int = 0) -> None:
    mm = np.memmap(ds / "indices.bin", dtype=np.int32, mode="r+")
    e = json.loads((ds / "meta.json").read_text())["num_edges"]
    if every:
        mm[:e:every] = value
    for pos, v in (where or {}).items():
        mm[pos] = v
    mm.flush()
    del mm


def _save_split(ds: Path, name: str, ids) -> None:
    np.save(ds / name, np.asarray(ids, dtype=np.int64))
    _refresh_checksums(ds)


def _bad_position(ds: Path, err: str) -> None:
    """The position the message names really holds an id out of range."""
    m = re.search(r"node id (-?\d+) at position (\d+)", err)
    assert m, err
    value, pos = int(m.group(1)), int(m.group(2))
    ids = np.fromfile(ds / "indices.bin", dtype=np.int32)
    assert ids[pos] == value and not 0 <= value < N


class Unavailable(Exception):
    """A case's setup cannot be made on this machine (the case is skipped, saying why)."""


CLEANUP: list[Callable[[], None]] = []


def _tiny_fs(d: Path) -> None:
    """Mount a 256 KiB tmpfs at ``d/mnt`` and fill it (root only)."""
    mnt = d / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        raise Unavailable(f"cannot mount a small tmpfs to fill (needs root): {r.stderr.strip()}")
    CLEANUP.append(lambda: subprocess.run(["umount", str(mnt)], check=False))
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * 4096) == 4096:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_report_full(d: Path, err: str) -> None:
    assert sorted(p.name for p in (d / "mnt").iterdir()) == ["filler"]
    open_dataset(d / "g", verify=True)


def _immutable(d: Path) -> None:
    """Make the dataset folder read-only even for root (chattr +i)."""
    r = subprocess.run(["chattr", "+i", str(_ds(d))], capture_output=True, text=True)
    if r.returncode:
        raise Unavailable(f"cannot make a folder immutable here (chattr +i): {r.stderr.strip()}")
    CLEANUP.append(lambda: subprocess.run(["chattr", "-i", str(_ds(d))], check=False))


def _check_user_cache(d: Path, err: str) -> None:
    saved = list((d / "user" / "neighbor_cache").glob("*/*/meta.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["budget_bytes"] == 64 << 10


# -- the table ----------------------------------------------------------------

@dataclass
class Case:
    id: str
    module: str
    argv: list[str]                       # "{d}" is the case folder
    setup: Callable[[Path], None]
    line: str = ""                        # regex of the last stderr line after "ooc: "
    rc: int = 2
    adds_files: bool = False              # a successful run may add files
    replaces: tuple[str, ...] = ()        # files under these may change (the replaced output)
    check: Callable[[Path, str], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


def _ds(d: Path) -> Path:
    return d / "ds"


def _copy_base(d: Path) -> None:
    shutil.copytree(BASE, _ds(d))


def _then(*fns):
    def run(d):
        for fn in fns:
            fn(d)
    return run


def _text(name: str, body: str):
    return lambda d: (d / name).write_text(body)


def _npy(name: str, arr):
    return lambda d: np.save(d / name, arr)


def _edges_npy(d: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(d / "e.npy", rng.integers(0, 50, (2, 400)))


def _features(values, dtype=np.float32):
    def make(d):
        x = np.random.default_rng(1).standard_normal((50, 4)).astype(dtype)
        for (r, c), v in values.items():
            x[r, c] = v
        np.save(d / "x.npy", x)
    return make


TRAIN = ["--data", "{d}/ds", "--mode", "baseline", "--epochs", "1", "--no-progress",
         "--runtime-dir", "{d}/rt", "--no-eval"]


def _train(mode="baseline"):
    return [a if a != "baseline" else mode for a in TRAIN]


def _meta_case(id_, line, **changes) -> Case:
    return Case(id_, "ooc.train", TRAIN, _then(_copy_base, lambda d: _edit_meta(_ds(d), **changes)),
                "{d}/ds/meta.json: " + line)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _stale_temps(d: Path) -> None:
    from ooc.storage.ownership import mark

    dead = d / f".out.tmp-{_dead_pid()}-abc"
    dead.mkdir()
    mark(dead, "output")                           # what a killed ooc run leaves
    (dead / "features.bin").write_bytes(b"\0" * 4096)
    (d / f".out.tmp-{_dead_pid()}-mine").mkdir()   # a user's folder of that name: kept
    (d / f".out.tmp-{os.getpid()}-live").mkdir()   # a run still alive (this test)


def _check_stale(d: Path, err: str) -> None:
    left = sorted(p.name for p in d.iterdir() if p.name.startswith(".out"))
    mine = [n for n in left if n.endswith("-mine")]
    assert len(mine) == 1 and set(left) == {mine[0], f".out.tmp-{os.getpid()}-live"}, left
    open_dataset(d / "out")
    shutil.rmtree(d / f".out.tmp-{os.getpid()}-live")
    shutil.rmtree(d / mine[0])


def _check_replaced(d: Path, err: str) -> None:
    assert sorted(p.name for p in d.iterdir()) == ["ds", "e.npy"]
    ds = open_dataset(d / "ds")
    assert ds.num_nodes == 50 and ds.meta["source"]["kind"] == "edgelist"


def _check_nonfinite_kept(d: Path, err: str) -> None:
    ds = open_dataset(d / "out")
    assert ds.meta["nonfinite_features"] == 2
    assert np.isnan(ds.features.read(np.array([5]))[0, 1])


CASES = [
    # --- ingest: node counts bounded before allocating -----------------------------
    Case("huge-id", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/out", "--no-progress"],
         _text("e.txt", "0 1\n1 3000000000\n"),
         r"{d}/e.txt: edge 1: node id 3000000000 would make 3000000001 nodes, more than \d+ "
         r"\(the limit from the input's size and the available memory\); pass --num-nodes"),
    Case("huge-num-nodes", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/out",
                                           "--num-nodes", str(10**15), "--no-progress"],
         _text("e.txt", "0 1\n"),
         rf"--num-nodes {10**15}: {10**15} nodes need about [\d.]+ GiB of memory to ingest"),
    Case("huge-nodes-synthetic", "ooc.prepare", ["synthetic", "--nodes", str(10**15), "--out",
                                                 "{d}/out", "--no-progress"], lambda d: None,
         rf"--nodes {10**15}: {10**15} nodes need about"),
    # --- ingest: empty graphs ---------------------------------------------------------
    Case("empty-file", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/out"],
         _text("e.txt", ""), r"{d}/e.txt: the graph has no edges"),
    Case("only-comments", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/out"],
         _text("e.txt", "# nodes 5\n% nothing\n\n"), r"{d}/e.txt: the graph has no edges"),
    # --- --overwrite replaces only an ooc dataset ---------------------------------------
    Case("out-is-input", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/e.txt",
                                         "--overwrite"],
         _text("e.txt", "0 1\n1 2\n"), r"{d}/e.txt: exists and is not an ooc dataset folder"),
    Case("out-is-user-folder", "ooc.prepare", ["edgelist", "{d}/e.txt", "--out", "{d}/thesis",
                                               "--overwrite"],
         _then(_text("e.txt", "0 1\n1 2\n"), lambda d: (d / "thesis").mkdir(),
               _text("thesis/thesis.tex", "\\section{Intro}\n")),
         r"{d}/thesis: exists and is not an ooc dataset folder"),
    Case("out-holds-input", "ooc.prepare", ["edgelist", "{d}/ds/e.txt", "--out", "{d}/ds",
                                            "--overwrite"],
         _then(_copy_base, _text("ds/e.txt", "0 1\n1 2\n")),
         r"{d}/ds: holds or lies inside the input {d}/ds/e.txt; --overwrite would delete it"),
    Case("overwrite-dataset", "ooc.prepare", ["edgelist", "{d}/e.npy", "--out", "{d}/ds",
                                              "--overwrite", "--no-progress"],
         _then(_copy_base, _edges_npy), rc=0, adds_files=True, replaces=("ds/",),
         check=_check_replaced),
    Case("stale-temp-of-dead-pid", "ooc.prepare", ["edgelist", "{d}/e.npy", "--out", "{d}/out",
                                                   "--no-progress"],
         _then(_edges_npy, _stale_temps), rc=0, adds_files=True, replaces=(".out.tmp-",),
         check=_check_stale),
    # --- features, labels, splits ---------------------------------------------------------
    Case("nan-features", "ooc.prepare", ["edgelist", "{d}/e.npy", "--features", "{d}/x.npy",
                                         "--out", "{d}/out", "--no-progress"],
         _then(_edges_npy, _features({(5, 1): np.nan, (7, 0): np.inf})),
         r"{d}/x.npy: 2 feature values are NaN or infinite as float32 \(first at node 5\); "
         r"pass --allow-nonfinite"),
    Case("float16-overflow", "ooc.prepare", ["edgelist", "{d}/e.npy", "--features", "{d}/x.npy",
                                             "--dtype", "float16", "--out", "{d}/out"],
         _then(_edges_npy, _features({(9, 2): 1e6})),
         r"{d}/x.npy: 1 feature values are NaN or infinite as float16 \(first at node 9\)"),
    Case("nan-features-allowed", "ooc.prepare", ["edgelist", "{d}/e.npy", "--features",
                                                 "{d}/x.npy", "--out", "{d}/out",
                                                 "--allow-nonfinite", "--no-progress"],
         _then(_edges_npy, _features({(5, 1): np.nan, (7, 0): -np.inf})), rc=0, adds_files=True,
         check=_check_nonfinite_kept),
    Case("overlapping-splits", "ooc.prepare", ["edgelist", "{d}/e.npy", "--train-idx", "{d}/tr.npy",
                                               "--val-idx", "{d}/va.npy", "--out", "{d}/out"],
         _then(_edges_npy, _npy("tr.npy", np.array([0, 1, 2])), _npy("va.npy", np.array([3, 2]))),
         r"{d}/va.npy: and {d}/tr.npy both list node 2 \(each node may be in at most one split"),
    Case("duplicate-split-id", "ooc.prepare", ["edgelist", "{d}/e.npy", "--test-idx", "{d}/te.npy",
                                               "--out", "{d}/out"],
         _then(_edges_npy, _npy("te.npy", np.array([4, 1, 4]))), r"{d}/te.npy: lists node 4 twice"),
    Case("label-1e9", "ooc.prepare", ["edgelist", "{d}/e.npy", "--labels", "{d}/y.npy",
                                      "--out", "{d}/out"],
         _then(_edges_npy, _npy("y.npy", np.r_[np.zeros(49, np.int64), 10**9])),
         r"{d}/y.npy: node 49: label 1000000000 is not a class id in \[0, 1048576\) nor -1 "
         r"\(unlabeled\)"),
    Case("label-uint64-max", "ooc.prepare", ["edgelist", "{d}/e.npy", "--labels", "{d}/y.npy",
                                             "--out", "{d}/out"],
         _then(_edges_npy, _npy("y.npy", np.r_[np.zeros(7, np.uint64), np.uint64(2**64 - 1),
                                                np.zeros(42, np.uint64)])),
         r"{d}/y.npy: node 7: label 18446744073709551615 is not a class id"),
    Case("label-below-minus-one", "ooc.prepare", ["edgelist", "{d}/e.npy", "--labels",
                                                  "{d}/y.npy", "--out", "{d}/out"],
         _then(_edges_npy, _npy("y.npy", np.r_[np.zeros(3, np.int8), -2, np.zeros(46, np.int8)])),
         r"{d}/y.npy: node 3: label -2 is not a class id"),
    Case("label-inf", "ooc.prepare", ["edgelist", "{d}/e.npy", "--labels", "{d}/y.npy",
                                      "--out", "{d}/out"],
         _then(_edges_npy, _npy("y.npy", np.r_[np.zeros(5), np.nan, np.inf, np.zeros(43)])),
         r"{d}/y.npy: node 6: label inf is not a class id"),
    Case("label-text", "ooc.prepare", ["edgelist", "{d}/e.npy", "--labels", "{d}/y.npy",
                                       "--out", "{d}/out"],
         _then(_edges_npy, _npy("y.npy", np.array(["a"] * 50))),
         r"{d}/y.npy: labels have dtype <U1; expected integers \(-1: unlabeled\)"),
    # --- prepare options --------------------------------------------------------------------
    Case("avg-degree-nan", "ooc.prepare", ["synthetic", "--avg-degree", "nan", "--out", "{d}/out"],
         lambda d: None, r"--avg-degree must be a finite number, got nan"),
    Case("noise-negative", "ooc.prepare", ["synthetic", "--noise", "-1", "--out", "{d}/out"],
         lambda d: None, r"--noise must be >= 0, got -1.0"),
    Case("seed-huge", "ooc.prepare", ["synthetic", "--seed", "99999999999999999999999",
                                      "--out", "{d}/out"], lambda d: None,
         r"--seed must be in \[0, 2\*\*63\), got 99999999999999999999999"),
    Case("buffer-zero", "ooc.prepare", ["synthetic", "--buffer", "0", "--out", "{d}/out"],
         lambda d: None, r"--buffer must be at least 1MiB, got 0 bytes"),
    Case("report-on-full-disk", "ooc.prepare", ["synthetic", "--nodes", "200", "--avg-degree", "4",
                                                "--feature-dim", "4", "--out", "{d}/g", "--report",
                                                "{d}/mnt/r.json", "--no-progress"],
         _tiny_fs, r"{d}/mnt/r.json: cannot write the report \(disk full\); the dataset {d}/g "
                   r"was written and is complete", adds_files=True, check=_check_report_full),
    Case("read-only-dataset", "ooc.train", _train("ooc") + ["--neighbor-cache-size", "64KiB"],
         _then(_copy_base, _immutable), rc=0, adds_files=True, check=_check_user_cache,
         env={"OOC_CACHE": "{d}/user"}),
    Case("read-only-dataset-no-runtime-dir", "ooc.train",
         ["--data", "{d}/ds", "--epochs", "1", "--no-progress", "--no-eval"],
         _then(_copy_base, _immutable),
         r"{d}/ds/runtime: cannot create the runtime folder \(.+\); give --runtime-dir a "
         r"folder on a writable disk", env={"OOC_CACHE": "{d}/user"},
         adds_files=True),  # the neighbour cache, saved in the user cache first
    Case("buffer-larger-than-memory", "ooc.prepare", ["synthetic", "--buffer", "1000TiB", "--out",
                                                      "{d}/out"], lambda d: None,
         r"--buffer \d+ bytes is more than the \d+ bytes of memory available now"),
    Case("report-folder-missing", "ooc.prepare", ["synthetic", "--nodes", "100", "--out", "{d}/out",
                                                  "--report", "{d}/nope/r.json"],
         lambda d: None, r"{d}/nope: --report's folder does not exist"),
    # --- ids in indices.bin never reach a kernel unchecked -----------------------------------
    Case("indices-int-max-every-7th", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _poke_indices(_ds(d), every=7, value=2**31 - 1)),
         r"{d}/ds/indices.bin: checksum of sampled pages does not match meta.json"),
    Case("indices-int-max-unsampled", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _poke_indices(_ds(d), every=7, value=2**31 - 1),
               lambda d: _refresh_checksums(_ds(d))),
         r"{d}/ds/indices.bin: node id 2147483647 at position \d+ is out of range \[0, 300\)",
         check=lambda d, err: _bad_position(_ds(d), err)),
    Case("indices-two-bad-ids", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _poke_indices(_ds(d), {40: 999999, 900: -3}),
               lambda d: _refresh_checksums(_ds(d))),
         r"{d}/ds/indices.bin: node id (999999|-3) at position (40|900) is out of range",
         check=lambda d, err: _bad_position(_ds(d), err)),
    Case("indices-bad-static", "ooc.train", _train("static"),
         _then(_copy_base, lambda d: _poke_indices(_ds(d), every=7, value=2**31 - 1),
               lambda d: _refresh_checksums(_ds(d))),
         r"{d}/ds/indices.bin: node id 2147483647 at position \d+ is out of range",
         check=lambda d, err: _bad_position(_ds(d), err)),
    Case("indices-bad-ooc", "ooc.train", _train("ooc"),
         _then(_copy_base, lambda d: _poke_indices(_ds(d), {11: -3}),
               lambda d: _refresh_checksums(_ds(d))),
         r"{d}/ds/indices.bin: node id -3 at position 11 is out of range"),
    Case("indices-bad-partition", "ooc.partition", ["--data", "{d}/ds", "--parts", "2", "--out",
                                                    "{d}/parts"],
         _then(_copy_base, lambda d: _poke_indices(_ds(d), {77: 2**31 - 1}),
               lambda d: _refresh_checksums(_ds(d))),
         r"{d}/ds/indices.bin: node id 2147483647 at position 77 is out of range"),
    Case("indices-in-range-edit-partition", "ooc.partition",
         ["--data", "{d}/ds", "--parts", "2", "--out", "{d}/parts"],
         _then(_copy_base, lambda d: _poke_indices(_ds(d), {77: 3, 78: 3}),
               lambda d: _refresh_checksums(_ds(d), blocks=False)),
         r"{d}/ds/indices.bin: ids 0..\d+ \(bytes from 0\) do not match their checksum in "
         r"meta.json \(corrupted file\)"),
    Case("meta-without-checksum", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _edit_meta(_ds(d), checksum=_DELETE)),
         r"{d}/ds/meta.json: has no 'checksum' field \(written by hand or by an older ooc, or "
         r"edited\); write the dataset again with ooc.prepare"),
    Case("indices-bad-legacy-meta", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _poke_indices(_ds(d), {5: -3}), lambda d: _refresh_checksums(_ds(d)),
               lambda d: _edit_meta(_ds(d), index_range=_DELETE)),
         r"{d}/ds/indices.bin: node id -3 at position 5 is out of range"),
    Case("index-range-in-meta", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _edit_meta(_ds(d), index_range=[0, 5000])),
         r"{d}/ds/meta.json: index_range \[0, 5000\] of indices.bin is not within \[0, 300\)"),
    # --- meta.json field by field ----------------------------------------------------------
    _meta_case("feature-dim-0", r"field 'feature_dim' must be in \[1, 16777216\], got 0", feature_dim=0),
    _meta_case("index-dtype-banana", r"unsupported index_dtype 'banana'", index_dtype="banana"),
    _meta_case("num-nodes-abc", r"field 'num_nodes' must be an integer, got 'abc'", num_nodes="abc"),
    _meta_case("num-nodes-fraction", r"field 'num_nodes' must be an integer, got 2708.5",
               num_nodes=2708.5),
    # an edited num_nodes names meta.json against indptr.npy, not the intact indptr.npy
    _meta_case("num-nodes-edited-down", r"num_nodes 299 does not match indptr.npy \(301 entries: "
               r"300 nodes\); meta.json was changed after the dataset was written", num_nodes=299),
    _meta_case("num-nodes-edited-up", r"num_nodes 301 does not match indptr.npy \(301 entries: "
               r"300 nodes\)", num_nodes=301),
    _meta_case("num-nodes-negative", r"field 'num_nodes' must be in \[0, \d+\], got -5", num_nodes=-5),
    _meta_case("num-classes-1e9-float", r"field 'num_classes' must be an integer, got 1000000000.0",
               num_classes=1e9),
    _meta_case("num-classes-1e9", r"field 'num_classes' must be in \[0, 1048576\], got 1000000000",
               num_classes=10**9),
    _meta_case("num-edges-bool", r"field 'num_edges' must be an integer, got True", num_edges=True),
    _meta_case("files-not-object", r"field 'files' must be an object", files=[1, 2]),
    Case("file-entry-without-bytes", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _edit_meta(_ds(d), files={
             **json.loads((_ds(d) / "meta.json").read_text())["files"], "labels.npy": {}})),
         r"{d}/ds/meta.json: entry of labels.npy has no 'bytes'"),
    Case("features-truncated", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: os.truncate(_ds(d) / "features.bin", 4096)),
         r"{d}/ds/features.bin: truncated: 4096 bytes, meta.json says \d+"),
    Case("split-overlap", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _save_split(
             _ds(d), "val_idx.npy",
             np.r_[np.load(_ds(d) / "val_idx.npy"), np.load(_ds(d) / "train_idx.npy")[0]])),
         r"{d}/ds/val_idx.npy: node \d+ is listed also in train_idx.npy"),
    Case("split-duplicate", "ooc.train", TRAIN,
         _then(_copy_base, lambda d: _save_split(
             _ds(d), "train_idx.npy", np.repeat(np.load(_ds(d) / "train_idx.npy"), 2))),
         r"{d}/ds/train_idx.npy: node \d+ is listed twice"),
]

BASE: Path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every case once (one runner process, one forked child per case)."""
    global BASE
    root = tmp_path_factory.mktemp("bad")
    BASE = community_graph(root / "base", n=N)
    specs, folders, skipped = [], {}, {}
    try:
        for c in CASES:
            d = root / c.id
            d.mkdir()
            folders[c.id] = d
            try:
                c.setup(d)
            except Unavailable as e:
                skipped[c.id] = str(e)
                continue
            fmt = lambda s, d=d: s.replace("{d}", str(d))  # noqa: E731
            env = {"OOC_CACHE": str(root / "user-cache")}
            env.update({k: fmt(v) for k, v in c.env.items()})
            specs.append({"id": c.id, "module": c.module, "argv": [fmt(a) for a in c.argv],
                          "out": str(root / f"{c.id}.out"), "err": str(root / f"{c.id}.err"),
                          "env": env})
        before = {c.id: _snapshot(folders[c.id]) for c in CASES}
        r = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(specs), cwd=REPO,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        status = json.loads(r.stdout.strip().splitlines()[-1])
        out = {}
        for c in CASES:
            if c.id in skipped:
                out[c.id] = skipped[c.id]
                continue
            d = folders[c.id]
            err = (root / f"{c.id}.err").read_text()
            after = _snapshot(d)
            out[c.id] = (status[c.id], err, d, before[c.id], after)
            if c.check is not None and status[c.id]["rc"] == c.rc:
                try:
                    c.check(d, err)
                except AssertionError as e:
                    out[c.id] = (*out[c.id][:-1], after, f"check failed: {e}")
        yield out
    finally:
        while CLEANUP:
            CLEANUP.pop()()


def _snapshot(d: Path) -> dict[str, str]:
    """sha256 of every file under ``d`` by relative path, and "DIR" for every folder."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
            else "DIR" for p in sorted(d.rglob("*"))}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(results, case):
    res = results[case.id]
    if isinstance(res, str):
        pytest.skip(res)
    status, err, d, before, after, *check_error = res
    assert status["signal"] is None, f"died of signal {status['signal']}: {err[-2000:]}"
    assert not status["timeout"], err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert status["rc"] == case.rc, err[-2000:]
    changed = [k for k, h in before.items()
               if after.get(k) != h and not k.startswith(case.replaces)]
    assert not changed, f"user files changed or removed: {changed}"
    if case.rc:
        last = err.strip().splitlines()[-1]
        assert re.fullmatch("ooc: " + case.line.replace("{d}", str(d)) + ".*", last), last
    if not case.adds_files:
        top = {Path(k).parts[0] for k in before}
        added = sorted({Path(k).parts[0] for k in after} - top - {"rt"})  # rt: the trainer's runtime
        assert not added, f"left behind: {added}"
    assert not check_error, check_error[0]


def _python_m(*args, env=None):
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_python_m_train_on_corrupted_indices(tmp_path):
    """The issue's SIGSEGV, through the plain command: a one-line error naming
    indices.bin and a position that really holds a bad id."""
    ds = community_graph(tmp_path / "ds", n=N)
    _poke_indices(ds, every=7, value=2**31 - 1)
    _refresh_checksums(ds)
    r = _python_m("ooc.train", "--data", ds, "--mode", "baseline", "--epochs", "1", "--no-progress",
                  "--runtime-dir", tmp_path / "rt", "--no-eval")
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"ooc: {ds}/indices.bin: node id 2147483647 at position \d+ .*", last), last
    _bad_position(ds, last)


def test_node_limit_follows_the_memory_cgroup(tmp_path):
    """In a memory cgroup of 256 MiB, a node count whose ingest needs more is
    refused before anything is allocated, with the cgroup's room as the bound."""
    root = Path("/sys/fs/cgroup/memory")
    cg = root / f"ooc-test-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(256 << 20))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup (v1, needs root): {e}")
    try:
        (tmp_path / "e.txt").write_text("0 1\n")
        r = subprocess.run(
            [sys.executable, "-m", "ooc.prepare", "edgelist", str(tmp_path / "e.txt"),
             "--num-nodes", "20000000", "--buffer", "16MiB", "--out", str(tmp_path / "out")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        cg.rmdir()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    from ooc.storage.ingest.limits import BYTES_PER_NODE

    need = f"{20_000_000 * BYTES_PER_NODE / (1 << 30):.1f}"
    m = re.fullmatch(rf"ooc: --num-nodes 20000000: 20000000 nodes need about {need} GiB of memory "
                     r"to ingest, more than the ([\d.]+) GiB available \(three quarters of free "
                     r"memory\)", r.stderr.strip().splitlines()[-1])
    assert m and float(m.group(1)) <= round(0.75 * 256 / 1024, 1), r.stderr  # printed to 0.1 GiB
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.txt"]


def _ingest_in_flight(tmp_path: Path) -> tuple[list[str], subprocess.Popen, list[Path]]:
    """``ooc.prepare synthetic`` to ``tmp_path / "g"`` (stderr piped), once its temp folder
    exists: ``(argv, process, temp folders)``; skips if the ingest finished first."""
    import time

    args = [sys.executable, "-m", "ooc.prepare", "synthetic", "--nodes", "300000", "--avg-degree",
            "8", "--feature-dim", "16", "--out", str(tmp_path / "g"), "--no-progress"]
    p = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 120
    temps: list[Path] = []
    while time.time() < deadline and not temps and p.poll() is None:
        temps = list(tmp_path.glob(f".g.tmp-{p.pid}-*"))
        time.sleep(0.05)
    if not temps:
        p.kill()
        p.communicate()
        pytest.skip("the ingest finished before its temp folder could be seen")
    return args, p, temps


def test_kill_9_during_ingest_then_rerun(tmp_path):
    """A real kill -9 mid-ingest leaves only its hidden temp folder; the next run
    on the same output removes it and writes the dataset."""
    import signal

    args, p, temps = _ingest_in_flight(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    assert not (tmp_path / "g").exists() and temps[0].exists()
    r = subprocess.run(args[:4] + ["--nodes", "500", "--avg-degree", "4", "--feature-dim", "4",
                                   "--out", str(tmp_path / "g"), "--no-progress"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(q.name for q in tmp_path.iterdir()) == ["g"]
    assert open_dataset(tmp_path / "g").num_nodes == 500


def test_sigterm_during_ingest_removes_its_temp_folder(tmp_path):
    """SIGTERM (``timeout``, a scheduler's stop) mid-ingest: the command ends with exit 143
    and one line, and its temp folder is gone with it (a SIGKILL leaves it for the next
    run to remove, above)."""
    import signal

    _, p, _ = _ingest_in_flight(tmp_path)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err[-2000:]
    assert_one_line_error(err, "terminated (SIGTERM)")
    assert list(tmp_path.iterdir()) == []
