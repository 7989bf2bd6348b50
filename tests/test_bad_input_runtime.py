"""Bad options and bad runtime states of ``ooc.train`` and ``ooc.infer``, table-driven.

Every case is a command line, the exit code it must give, the one line it
must print on stderr (a regex) and, for all of them, that nothing under the
test's folder changed (every file's bytes, every folder's entries) and no
output appeared. The cases run in a child process that calls the CLIs'
``main`` one after the other (one interpreter start instead of forty): a
case that dies of a signal kills the child and fails the test naming it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, community_graph, mount_small_tmpfs

from ooc.executor.training.checkpoint import save_checkpoint
from ooc.executor.training.models import build_model
from ooc.storage import open_dataset, write_dataset

#: (case id, cli, argv, expected exit code, regex of the one stderr line); ``{D}``
#: is the dataset, ``{NAN}`` a dataset whose features hold a NaN, ``{CK}`` a
#: checkpoint, ``{TRAINED}`` a checkpoint folder trained on ``{D}``, ``{OUT}`` a fresh
#: output path, ``{USER}`` a user's folder, ``{FILE}`` a user's file, ``{OTHER}`` a
#: finished inference output of another model.
TRAIN = "--data {D} --fanouts 3,3 --batch-size 20 --hidden 8 --epochs 1 --no-progress " \
        "--mode baseline"
CASES = [
    ("lr-inf", "train", TRAIN + " --lr inf", 2, r"--lr inf: must be a finite number > 0"),
    ("lr-nan", "train", TRAIN + " --lr nan", 2, r"--lr nan: must be a finite number > 0"),
    ("lr-zero", "train", TRAIN + " --lr 0", 2, r"--lr 0.0: must be"),
    ("weight-decay-neg", "train", TRAIN + " --weight-decay -1", 2, r"--weight-decay -1.0"),
    ("dropout-1", "train", TRAIN + " --dropout 1", 2, r"--dropout 1.0: must be .* < 1"),
    ("threads-0", "train", TRAIN + " --threads 0", 2, r"--threads 0: must be an integer in"),
    ("threads-neg", "train", TRAIN + " --threads=-1", 2, r"--threads -1: must be an integer"),
    ("queue-depth-huge", "train", TRAIN + " --queue-depth 100000", 2,
     r"--queue-depth 100000: must be an integer in \[1, 4096\]"),
    ("io-threads-0", "train", TRAIN + " --io-threads 0", 2, r"--io-threads 0"),
    ("seed-huge", "train", TRAIN + " --seed 99999999999999999999999", 2,
     r"--seed 99999999999999999999999: must be an integer in \[0, 9223372036854775807\]"),
    ("seed-neg", "train", TRAIN + " --seed=-1", 2, r"--seed -1: must be"),
    ("memory-budget-0", "train", TRAIN + " --memory-budget 0", 2,
     r"--memory-budget 0: must be at least 1 byte \(leave the setting out for no budget\)"),
    ("memory-budget-junk", "train", TRAIN + " --memory-budget lots", 2,
     r"--memory-budget 'lots': not a size"),
    ("runtime-budget-0", "train", TRAIN + " --runtime-disk-budget 0", 2,
     r"--runtime-disk-budget 0: must be at least 1"),
    ("compute-fraction-5", "train", TRAIN + " --workers 1 --compute-fraction 5", 2,
     r"--compute-fraction 5.0: must be a finite number > 0 and < 1"),
    ("compute-fraction-0", "train", TRAIN + " --workers 1 --compute-fraction 0", 2,
     r"--compute-fraction 0.0"),
    ("workers-0", "train", TRAIN + " --workers 0", 2, r"--workers 0: must be an integer"),
    ("partitions-0", "train", TRAIN + " --partitions 0", 2, r"--partitions 0"),
    ("sync-every-0", "train", TRAIN + " --workers 1 --sync-every 0", 2, r"--sync-every 0"),
    ("halo-hops-0", "train", TRAIN + " --workers 1 --halo-hops 0", 2, r"--halo-hops 0"),
    ("epochs-0", "train", TRAIN + " --epochs 0", 2, r"--epochs 0: must be"),
    ("hidden-huge", "train", TRAIN + " --hidden 100000000", 2, r"--hidden 100000000: must be"),
    ("batch-size-0", "train", TRAIN + " --batch-size 0", 2, r"--batch-size 0: must be"),
    ("checkpoint-every-0", "train", TRAIN + " --checkpoint-every 0", 2,
     r"--checkpoint-every 0"),
    ("superbatch-0", "train", TRAIN + " --superbatch-size 0", 2, r"--superbatch-size 0"),
    ("nan-loss", "train", TRAIN.replace("{D}", "{NAN}") + " --no-eval", 2,
     r"training loss is nan at epoch 1, batch 1 of \d+ "),
    ("resume-other-dataset", "train", "--data {NAN} --checkpoint-dir {TRAINED} --resume "
     "--no-progress", 2, r"epoch_0001.pt: checkpoint was trained on .*/d \(meta.json fingerprint"),
    ("resume-no-checkpoints", "train", "--data {D} --checkpoint-dir {USER} --resume", 2,
     r"thesis: cannot resume, the checkpoint folder has no epoch_\*.pt checkpoints"),
    ("infer-checkpoint-is-dataset", "infer", "--checkpoint {D}", 2,
     r"/d: cannot resume, the checkpoint folder has no epoch_\*.pt"),
    ("infer-out-unwritable", "infer", "--out /proc/ooc-test/emb.zarr", 2,
     r"ooc: /proc/ooc-test/.emb.zarr.ooc-lock: cannot create the lock of this inference output"),
    ("infer-block-rows-0", "infer", "--block-rows 0", 2, r"--block-rows 0: must be an integer"),
    ("infer-block-rows-neg", "infer", "--block-rows=-5", 2, r"--block-rows -5: must be"),
    ("infer-threads-0", "infer", "--threads 0", 2, r"--threads 0: must be an integer"),
    ("infer-threads-neg", "infer", "--threads=-1", 2, r"--threads -1: must be an integer"),
    ("infer-chunk-rows-0", "infer", "--chunk-rows 0", 2, r"--chunk-rows 0: must be"),
    ("infer-budget-0", "infer", "--memory-budget 0", 2, r"--memory-budget 0: must be"),
    ("infer-budget-1MiB", "infer", "--memory-budget 1MiB", 2,
     r"memory budget 1 MiB is too small"),
    ("infer-overwrite-user-folder", "infer", "--overwrite --out {USER}", 2,
     r"thesis: has no progress.json of ooc.infer .*--overwrite replaces only an ooc.infer output"),
    ("infer-overwrite-user-file", "infer", "--overwrite --out {FILE}", 2,
     r"notes.txt: is not a folder"),
    ("infer-overwrite-dataset", "infer", "--overwrite --out {D}", 2, r"has no progress.json"),
    ("infer-other-run", "infer", "--out {OTHER}", 2,
     r"other.zarr: already exists and is not a finished run of this model"),
    ("infer-no-dataset", "infer", "--data {OUT}", 2, r"ooc: .*out.zarr"),
]

RUNNER = r"""
import contextlib, io, json, sys, traceback
from ooc import infer, train
cases, results_path = json.load(open(sys.argv[1])), sys.argv[2]
results = {}
for case in cases:
    sys.__stderr__.write(f"case {case['id']}\n"); sys.__stderr__.flush()
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = (train if case["cli"] == "train" else infer).main(case["argv"])
        except SystemExit as e:
            rc = e.code
        except BaseException:
            rc, err = "exception", io.StringIO(traceback.format_exc())
    results[case["id"]] = {"rc": rc, "stderr": err.getvalue()}
    with open(results_path, "w") as f:
        json.dump(results, f)
"""


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: a file's sha256, a folder's sorted entries."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        snap[rel + "/"] = ",".join(sorted(dirnames + filenames))
        for f in filenames:
            p = Path(dirpath) / f
            snap[os.path.join(rel, f)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return snap


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The user's files: a dataset, a NaN copy, a checkpoint, a finished output of another
    model, a folder and a file of theirs; and the cases' results (one child process)."""
    from ooc.executor.inference.layerwise import layerwise_inference

    root = tmp_path_factory.mktemp("bad")
    user = root / "user"
    data = community_graph(user / "d", n=200)
    ds = open_dataset(data)
    nan = write_dataset(user / "nan", ds.indptr, np.asarray(ds.indices),
                        np.full((ds.num_nodes, ds.feature_dim), np.nan, np.float32), ds.labels,
                        ds.train_idx, ds.val_idx, ds.test_idx, num_classes=ds.num_classes,
                        allow_nonfinite=True)  # ingest's --allow-nonfinite
    del ds
    torch.manual_seed(0)
    model = build_model("sage", 8, 8, 3, num_layers=2)
    ck = save_checkpoint(user / "ck", 1, model)
    from ooc import train as train_cli

    assert train_cli.main(["--data", str(data), "--fanouts", "3,3", "--batch-size", "50",
                           "--hidden", "8", "--epochs", "1", "--mode", "baseline",
                           "--no-progress", "--no-eval", "--checkpoint-dir",
                           str(user / "trained")]) == 0
    other = build_model("sage", 8, 8, 3, num_layers=2)
    layerwise_inference(data, other, user / "other.zarr", memory_budget="4GiB")
    (user / "thesis").mkdir()
    (user / "thesis" / "thesis.tex").write_text("\\documentclass{article}\n")
    (user / "notes.txt").write_text("my notes\n")
    subst = {"{D}": str(data), "{NAN}": str(nan), "{CK}": str(ck), "{OUT}": str(root / "out.zarr"),
             "{USER}": str(user / "thesis"), "{FILE}": str(user / "notes.txt"),
             "{OTHER}": str(user / "other.zarr"), "{TRAINED}": str(user / "trained")}
    infer_base = "--data {D} --checkpoint {CK} --out {OUT} --memory-budget 4GiB --no-progress"
    cases = []
    for cid, cli, argv, _, _ in CASES:
        if cli == "infer":
            given = {a.split("=")[0] for a in argv.split() if a.startswith("--")}
            base = infer_base.split()
            keep = []
            for i in range(0, len(base) - 1, 2):
                if base[i] not in given:
                    keep += base[i:i + 2]
            argv = " ".join(keep + ["--no-progress"]) + " " + argv
        for k, v in subst.items():
            argv = argv.replace(k, v)
        cases.append({"id": cid, "cli": cli, "argv": argv.split()})
    (root / "cases.json").write_text(json.dumps(cases))
    (root / "runner.py").write_text(RUNNER)
    before = snapshot(user)
    p = subprocess.run([sys.executable, str(root / "runner.py"), str(root / "cases.json"),
                        str(root / "results.json")], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "OOC_CACHE": str(root / "cache")})
    results = json.loads((root / "results.json").read_text()) \
        if (root / "results.json").is_file() else {}
    return dict(root=root, user=user, before=before, after=snapshot(user), proc=p,
                results=results)


@pytest.mark.parametrize("cid,cli,argv,code,line", CASES, ids=[c[0] for c in CASES])
def test_case(world, cid, cli, argv, code, line):
    p = world["proc"]
    assert p.returncode == 0, (f"the runner died (exit {p.returncode}) after "
                               f"{p.stderr.strip().splitlines()[-1:]}: {p.stderr[-2000:]}")
    res = world["results"][cid]
    err = res["stderr"].strip()
    assert res["rc"] == code, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ooc: "), err
    assert re.search(line, lines[0]), lines[0]


def test_nothing_of_the_user_changed_and_no_output(world):
    assert world["proc"].returncode == 0, world["proc"].stderr[-2000:]
    assert world["after"] == world["before"]
    root = world["root"]
    assert not (root / "out.zarr").exists() and not (root / ".out.zarr.partial").exists()
    left = [p.name for p in world["user"].iterdir() if p.name.startswith(".")]
    assert left == []


@pytest.mark.parametrize("size,needle,extra", [
    # the disk the run needs (h1 beside h2: 3000 x (64 + 3) x 4 B = 785 KiB in whole
    # 256-row chunks and 4 KiB blocks with Zarr's metadata, and 8 B for each of the 22,010
    # edges, the buckets of a SAGE layer that streams) is refused before anything is written
    ("256k", r"needs 1004\.0 KiB of disk, 256\.0 KiB is free", []),
    # by blocks (no buckets): room for the layers' bytes but not for Zarr's whole chunks,
    # metadata and 4 KiB blocks (the disk filled while layer 2 was written when the plan
    # counted bytes alone): refused up front as well
    ("808k", r"needs 832\.0 KiB of disk, 808\.0 KiB is free", ["--aggregate", "blocks"])])
def test_infer_full_disk_is_one_line_and_leaves_nothing(tmp_path, size, needle, extra):
    """A small tmpfs as the output's disk: one line naming the problem, exit 2, no
    output and no partial folder left on it."""
    mnt = tmp_path / "small"
    why = mount_small_tmpfs(mnt, size)
    if why:
        pytest.skip(why)
    try:
        data = community_graph(tmp_path / "d", n=3000)
        torch.manual_seed(0)
        ck = save_checkpoint(tmp_path / "ck", 1, build_model("sage", 8, 64, 3, num_layers=2))
        p = subprocess.run([sys.executable, "-m", "ooc.infer", "--data", str(data),
                            "--checkpoint", str(ck), "--out", str(mnt / "emb.zarr"),
                            "--memory-budget", "4GiB", "--chunk-rows", "256", "--no-progress",
                            *extra],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1, p.stderr
        assert re.search(needle, err[0]), err[0]
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
