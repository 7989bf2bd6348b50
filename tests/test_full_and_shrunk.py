"""A full disk under a mapped write and a mapped input that shrinks under a reader: one
line naming the file and exit code 2, not SIGBUS; nothing half-written left (issue 57).

The full disks are small tmpfs mounts (root only, skipped elsewhere); the shrinking files
are truncated by the command itself at a chosen step (a patched method), so the moment is
deterministic.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, assert_one_line_error, community_graph, mount_small_tmpfs

from ooc.core.errors import IOFailure
from ooc.executor.inference.layerwise import layerwise_inference
from ooc.executor.inference.store import disk_bytes
from ooc.executor.training.checkpoint import save_checkpoint
from ooc.executor.training.models import build_model
from ooc.storage import open_dataset
from ooc.storage import reserve as reserve_mod
from ooc.storage.reserve import map_for_writing, npy_for_writing, reserve

GUARD_S = 300
#: ``python SCRIPT which K target size argv...``: runs ``ooc.train`` (``which`` train) or
#: ``ooc.infer`` (infer) and truncates ``target`` to ``size`` bytes when the K-th training
#: step starts or the K-th output chunk is written; ``race`` truncates ``target`` inside
#: the baseline's feature read, after its size check (the race the SIGBUS guard covers).
SHRINKER = r"""
import os, sys
which, K, target, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
count = [0]
def hit():
    count[0] += 1
    if count[0] == K:
        os.truncate(target, size)
if which in ("train", "race"):
    import ooc.executor.training.trainer as T
    orig = T.Trainer._step
    def patched(self, *args):
        hit()
        return orig(self, *args)
    T.Trainer._step = patched
    if which == "race":
        import ooc.storage.mmap_features as M
        check = M.check_size
        def late(arr, path, need):
            if count[0] < K:
                check(arr, path, need)
            else:  # from step K on, every read finds the file shrunk after its check
                os.truncate(target, size)
        M.check_size = late
    from ooc.train import main
else:
    import ooc.executor.inference.store as I
    orig = I.fsync_path
    def patched(path):
        orig(path)
        if "/c/" in str(path):
            hit()
    I.fsync_path = patched
    from ooc.infer import main
sys.exit(main(sys.argv[5:]))
"""


@pytest.fixture
def small_disk(tmp_path):
    """A mounted tmpfs factory: ``small_disk(size)`` -> its folder; unmounted after."""
    mounts = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"disk{len(mounts)}"
        why = mount_small_tmpfs(mnt, size)
        if why:
            pytest.skip(why)
        mounts.append(mnt)
        return mnt

    yield mount
    for mnt in mounts:
        subprocess.run(["umount", str(mnt)], check=False)


def _fill(folder: Path, leave: int) -> None:
    """Fill the disk of ``folder`` until ``leave`` bytes (whole pages) are free."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if free > leave:
        reserve(folder / "filler", free - leave)


def test_reserve_on_a_full_disk_names_the_file_and_the_room(small_disk):
    """No room: an IOFailure (an OSError with errno ENOSPC) naming the file, what it needs
    and what is free; the file is gone. Where fallocate is refused (EOPNOTSUPP) the zeros
    written instead fail the same way; with room they give the file its blocks."""
    disk = small_disk("256k")
    _fill(disk, 64 << 10)
    with pytest.raises(IOFailure) as e:
        map_for_writing(disk / "x.bin", np.int64, (20000,))
    assert e.value.errno == errno.ENOSPC
    assert str(e.value) == (f"{disk / 'x.bin'}: disk full: the file needs 156.2 KiB, "
                            "64.0 KiB is free on its disk")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    real = os.posix_fallocate

    def unsupported(fd, off, n):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    reserve_mod.os.posix_fallocate = unsupported
    try:
        with pytest.raises(IOFailure, match=r"y\.npy: disk full: the file needs 156\.4 KiB"):
            npy_for_writing(disk / "y.npy", np.int64, (20000,))
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
        arr = npy_for_writing(disk / "z.npy", np.int64, (5000,))
    finally:
        reserve_mod.os.posix_fallocate = real
    assert os.stat(disk / "z.npy").st_blocks * 512 >= 5000 * 8  # written, not sparse
    arr[:] = np.arange(5000)
    arr.flush()
    del arr
    assert np.array_equal(np.load(disk / "z.npy"), np.arange(5000))


def test_npy_for_writing_is_a_valid_npy(tmp_path):
    arr = npy_for_writing(tmp_path / "a.npy", np.int32, (7,))
    arr[:] = np.arange(7) * 3
    arr.flush()
    del arr
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.arange(7, dtype=np.int32) * 3)
    assert npy_for_writing(tmp_path / "e.npy", np.int64, (0,)).shape == (0,)
    assert np.load(tmp_path / "e.npy").shape == (0,)


def _partition(data: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ooc.partition", "--data", str(data),
                           "--parts", "2", "--algo", "hash", "--out", str(out), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=GUARD_S)


def _blocks(paths) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in paths)


def test_partition_on_a_disk_that_fills_at_the_labels_is_one_line(tmp_path, small_disk):
    """The disk fills as the second partition's labels are written (they were a sparse
    file map: SIGBUS, the temp folder and its lock left): one line naming labels.npy,
    exit 2, and nothing left on the disk."""
    data = community_graph(tmp_path / "g", n=3000, dim=64)
    disk = small_disk("8m")
    ref = _partition(data, disk / "ref")
    assert ref.returncode == 0, ref.stderr
    part1 = disk / "ref" / "part_001"
    # what is on the disk when part_001's labels are reserved: owner.npy, all of part_000,
    # and part_001's adjacency and features (its other files come after the labels)
    before = [disk / "ref" / "owner.npy", *(disk / "ref" / "part_000").iterdir(),
              *(part1 / n for n in ("indptr.npy", "indices.bin", "features.bin", ".ooc-made"))]
    need = _blocks(before)
    labels = _blocks([part1 / "labels.npy"])
    assert labels > 12 << 10
    subprocess.run(["rm", "-rf", str(disk / "ref")], check=True)
    _fill(disk, need + 16384)  # room up to the labels (and a little), not for them
    p = _partition(data, disk / "p")
    assert p.returncode == 2, p.stderr[-2000:]
    line = assert_one_line_error(p.stderr, "labels.npy: disk full: the file needs 22.8 KiB")
    assert "part_001" in line
    assert sorted(q.name for q in disk.iterdir()) == ["filler"]  # no temp folder, no lock


def _shrink(tmp_path: Path, which: str, k: int, target: Path, size: int,
            argv: list) -> subprocess.CompletedProcess:
    script = tmp_path / "shrinker.py"
    script.write_text(SHRINKER)
    return subprocess.run([sys.executable, str(script), which, str(k), str(target), str(size),
                           *map(str, argv)], cwd=REPO, capture_output=True, text=True,
                          timeout=GUARD_S)


def _train_args(data: Path, tmp_path: Path) -> list:
    return ["--data", data, "--fanouts", "4,4", "--batch-size", "100", "--hidden", "16",
            "--epochs", "2", "--mode", "baseline", "--no-progress", "--no-eval",
            "--checkpoint-dir", tmp_path / "ck"]


def test_features_shrunk_under_baseline_training_is_one_line(tmp_path):
    """features.bin truncated between batches of a baseline-preset training (memmap
    reads): one line naming it, exit 2 (was SIGBUS)."""
    data = community_graph(tmp_path / "g", n=1000, dim=64)
    p = _shrink(tmp_path, "train", 3, data / "features.bin", 4096, _train_args(data, tmp_path))
    assert p.returncode == 2, p.stderr[-2000:]
    line = assert_one_line_error(p.stderr, str(data / "features.bin"))
    # the size check before a read says so; a read already under way when the file
    # shrank (the loader reads the next batches while one trains) meets the guard
    assert ("features.bin: the file shrank to 4,096 bytes while it was being read" in line
            or "bus error reading a file mapped into memory" in line), line


def test_features_shrunk_inside_a_read_is_one_line_from_the_guard(tmp_path):
    """The file shrinks after the size check, while the rows are copied out of the map:
    the SIGBUS handler writes one line naming the mapped inputs and exits 2."""
    data = community_graph(tmp_path / "g", n=1000, dim=64)
    p = _shrink(tmp_path, "race", 3, data / "features.bin", 0, _train_args(data, tmp_path))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = assert_one_line_error(p.stderr, "bus error reading a file mapped into memory",
                                 str(data / "features.bin"))
    assert "a file shrank while the run read it" in line


def test_indices_shrunk_under_infer_is_one_line(tmp_path):
    """indices.bin truncated once infer wrote its first output chunk: one line naming
    it, exit 2 (was SIGBUS); no finished output."""
    data = community_graph(tmp_path / "g", n=3000, dim=16)
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 16, 16, 3, num_layers=2))
    out = tmp_path / "emb.zarr"
    p = _shrink(tmp_path, "infer", 1, data / "indices.bin", 4096,
                ["--data", data, "--checkpoint", ck, "--out", out, "--chunk-rows", "256",
                 "--no-progress"])
    assert p.returncode == 2, p.stderr[-2000:]
    assert_one_line_error(p.stderr, f"{data / 'indices.bin'}: the file shrank to 4,096 bytes")
    assert not out.exists()


@pytest.mark.parametrize("keep", [True, False])
def test_the_disk_plan_counts_whole_zarr_chunks(tmp_path, keep):
    """The disk inference plans is at least what it writes, and within a few blocks of it
    when every layer is kept (Zarr writes the last chunk whole; ``row_of_node`` was
    chunked at 2^20 rows whatever N: 8 MiB written for 3,000 nodes against 0.3 MiB
    planned)."""
    ds = open_dataset(community_graph(tmp_path / "g", n=3000, dim=64))
    torch.manual_seed(0)
    model = build_model("sage", 64, 16, 3, num_layers=2)
    out = tmp_path / "o.zarr"
    rows = 256
    layerwise_inference(ds, model, out, chunk_rows=rows, progress=False, keep_layers=keep,
                        aggregate="blocks", order="degree")
    assert (out / "row_of_node").is_dir()
    written = _blocks(f for f in out.rglob("*") if f.is_file())
    plan = disk_bytes(ds.num_nodes, [64, 16, 3], [4, 4], keep, True, rows,
                      os.statvfs(out).f_frsize)
    assert written <= plan
    if keep:
        assert plan - written <= 4 * 4096


def _prepare_fails(capsys, argv: list) -> str:
    from ooc.prepare import main

    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    assert e.value.code == 2
    return assert_one_line_error(capsys.readouterr().err)


def test_synthetic_sizes_are_refused_before_the_first_pass(tmp_path, capsys, small_disk):
    """No pass over the edges for a graph that cannot be (it ran for minutes): a mean
    degree of N or more, an output disk too small for even the nodes' files."""
    out = tmp_path / "s"
    line = _prepare_fails(capsys, ["synthetic", "--nodes", "1000000", "--avg-degree", "1000000",
                                   "--out", out, "--no-progress"])
    assert "--avg-degree must be in (0, nodes - 1] (a simple graph of 1,000,000 nodes has " \
           "at most 999,999 in-neighbours a node), got 1e+06" in line
    disk = small_disk("1m")
    line = _prepare_fails(capsys, ["synthetic", "--nodes", "100000", "--avg-degree", "10",
                                   "--out", disk / "s", "--no-progress"])
    assert line == (f"ooc: {disk}: a synthetic dataset of 100,000 nodes and --feature-dim 64 "
                    "needs at least 27.1 MiB of disk, 1.0 MiB is free")
    assert list(disk.iterdir()) == [] and not out.exists()
