"""A checkpoint whose entries were edited into the wrong kind or range is refused with one
line naming the file and the entry, by the library and by both CLIs (no traceback, no
allocation of an absurd model)."""
import copy
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_one_line_error, community_graph

from ooc.executor.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ooc.executor.training.models import build_model

CASES = {
    "epoch_str": ("epoch", "x", "'epoch' must be an integer >= 0, got 'x'"),
    "epoch_negative": ("epoch", -5, "'epoch' must be an integer >= 0, got -5"),
    "epoch_not_the_name": ("epoch", 7, "'epoch' is 7, but the file name says 1"),
    "config_none": ("model_config", None, "'model_config' must be a dict"),
    "out_dim_huge": ("model_config.out_dim", 10**12, "'out_dim' must be an integer in"),
    "layers_huge": ("model_config.num_layers", 10**9, "'num_layers' must be an integer in"),
    "hidden_str": ("model_config.hidden", "a", "'hidden' must be an integer in"),
    "kind_unknown": ("model_config.kind", "banana", "model_config does not describe a model"),
    "state_none": ("model_state", None, "'model_state' must map parameter names to tensors"),
    "weight_shape": ("model_state.<first>", torch.zeros(3), "model_state does not fit model_config"),
    "optimizer_str": ("optimizer_state", "x", "'optimizer_state' must be a dict, got str"),
    "rng_list": ("rng", [1], "'rng' must be a dict, got list"),
    "history_str": ("history", "x", "'history' must be a list, got str"),
    "fingerprint_int": ("dataset_fingerprint", 5, "'dataset_fingerprint' must be a str"),
}


def _edit(state: dict, where: str, value) -> dict:
    state = copy.deepcopy(state)
    *keys, last = where.split(".")
    d = state
    for k in keys:
        d = d[k]
    d[next(iter(d)) if last == "<first>" else last] = value
    return state


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckf")
    data = community_graph(root / "g", n=200)
    torch.manual_seed(0)
    path = save_checkpoint(root / "ck", 1, build_model("sage", 8, 16, 3, 2),
                           torch.optim.Adam(build_model("sage", 8, 16, 3, 2).parameters()))
    return data, torch.load(path, weights_only=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_edited_field_is_one_error(saved, tmp_path, case):
    _, state = saved
    where, value, needle = CASES[case]
    path = tmp_path / "epoch_0001.pt"
    torch.save(_edit(state, where, value), path)
    with pytest.raises(CheckpointError, match="edited or corrupted checkpoint") as e:
        load_checkpoint(path)
    assert needle in str(e.value) and str(path) in str(e.value)


def test_every_builtin_model_passes_the_check(tmp_path):
    for kind in ("sage", "gcn", "gat"):
        path = save_checkpoint(tmp_path / kind, 3, build_model(kind, 8, 16, 3, 2))
        assert load_checkpoint(path)["epoch"] == 3


@pytest.mark.parametrize("module,case", [("ooc.train", "epoch_str"), ("ooc.train", "rng_bad"),
                                         ("ooc.infer", "layers_huge")])
def test_clis_end_with_one_line(saved, tmp_path, module, case):
    data, state = saved
    ck = tmp_path / "ck"
    ck.mkdir()
    if case == "rng_bad":
        edited, needle = _edit(state, "rng", {"torch": "x"}), "random generator state does not load"
    else:
        edited, needle = _edit(state, *CASES[case][:2]), CASES[case][2]
    torch.save(edited, ck / "epoch_0001.pt")
    args = (["--data", str(data), "--checkpoint-dir", str(ck), "--resume", "--epochs", "2",
             "--fanouts", "3,3", "--hidden", "16", "--no-progress"] if module == "ooc.train" else
            ["--data", str(data), "--checkpoint", str(ck), "--out", str(tmp_path / "e.zarr"),
             "--no-progress"])
    p = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    assert_one_line_error(p.stderr, str(ck / "epoch_0001.pt"), needle)
