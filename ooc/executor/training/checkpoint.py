"""Training checkpoints: one file per saved epoch, written atomically.

A checkpoint ``DIR/epoch_0003.pt`` is a ``torch.save`` of a plain dict (loads
with ``weights_only=True``)::

    format: "ooc-checkpoint", version: 1,
    epoch: 3,                       # the last completed epoch (1-based)
    model_config: {kind, in_dim, hidden, out_dim, num_layers, dropout, heads},
    model_state, optimizer_state,
    rng: {torch, cuda, numpy, python},
    args: {...},                    # the run's settings (JSON-friendly values)
    history: [...],                 # per-epoch metrics so far (for the report)
    dataset_fingerprint: "9f2c...", # sha256 of the training dataset's meta.json (see below)
    extra: {...}

Resuming checks that the checkpoint belongs to the dataset at hand
(:func:`check_dataset`): :func:`dataset_fingerprint` hashes the dataset's
``meta.json`` without the fields that name it rather than describe it
(``name``, ``source``), so a renamed or moved copy of a dataset resumes and a
different graph with the same dimensions does not.

It is written to a temp file beside the target, fsynced and renamed, so a
crash never leaves a half-written ``epoch_*.pt``.

A checkpoint folder holds one run: its checkpoints record the run (dataset fingerprint,
model, settings), and a new run into a folder holding checkpoints is refused unless it
resumes them (checked against the dataset and the settings) or replaces them
(:func:`check_checkpoint_dir`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooc.core.errors import InvalidValue, IOFailure, OocError, OutputExists
from ooc.executor.training.models import GNN, build_model
from ooc.storage.atomic import atomic_file

CHECKPOINT_FORMAT = "ooc-checkpoint"
CHECKPOINT_VERSION = 1
_NAME = re.compile(r"^epoch_(\d+)\.pt$")


class CheckpointError(OocError, ValueError):
    """A checkpoint file or folder is missing, foreign or unusable."""


def checkpoint_path(directory: str | os.PathLike, epoch: int) -> Path:
    """The checkpoint file of epoch ``epoch`` in ``directory``: ``epoch_NNNN.pt``."""
    return Path(directory) / f"epoch_{int(epoch):04d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every ``epoch_*.pt`` in ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """The newest checkpoint in ``directory``; :class:`CheckpointError` if none."""
    found = list_checkpoints(directory)
    if not found:
        d = Path(directory)
        why = "does not exist" if not d.exists() else "has no epoch_*.pt checkpoints"
        raise CheckpointError(f"{d}: cannot resume, the checkpoint folder {why}")
    return found[-1][1]


def check_checkpoint_dir(directory: str | os.PathLike | None, resume: bool,
                         overwrite: bool) -> list[Path]:
    """Whether a run may write its checkpoints into ``directory`` (None: no folder); returns
    the checkpoints a run with ``overwrite`` replaces (to remove with
    :func:`remove_checkpoints` before its first save), else ``[]``.

    A folder without ``epoch_*.pt`` takes any run; one with them takes the run that
    resumes them (``resume``: the resume path checks the dataset and the settings), or
    with ``overwrite`` a new run, when every one of them is an ooc checkpoint.

    Raises:
        OutputExists: the folder holds checkpoints, and neither ``resume`` nor ``overwrite``.
        InvalidValue: both ``resume`` and ``overwrite``.
        CheckpointError: with ``overwrite``, an ``epoch_*.pt`` that is not an ooc checkpoint.
    """
    if directory is None:
        return []
    if resume and overwrite:
        raise InvalidValue(f"{directory}: --resume continues the run there and --overwrite "
                           f"replaces it; give one of them")
    found = [p for _, p in list_checkpoints(directory)]
    if resume or not found:
        return []
    if not overwrite:
        raise OutputExists(f"{directory}: holds the checkpoints of another run "
                           f"({_describe_run(found)}); pass --resume to continue it, "
                           f"--overwrite to replace them, or another --checkpoint-dir")
    for p in found:
        try:
            load_checkpoint(p)
        except CheckpointError as e:
            raise CheckpointError(f"{e}; --overwrite replaces only ooc's checkpoints (move it "
                                  f"out of {directory} or pick another --checkpoint-dir)") \
                from None
    return found


def _describe_run(found: list[Path]) -> str:
    """``epoch_0001.pt .. epoch_0003.pt, sage on /data/g``: the checkpoints ``found``
    (oldest first) and the run the newest records, as far as it loads."""
    span = found[0].name if len(found) == 1 else f"{found[0].name} .. {found[-1].name}"
    try:
        state = load_checkpoint(found[-1])
    except CheckpointError:
        return span
    model = (state.get("model_config") or {}).get("kind")
    data = (state.get("extra") or {}).get("dataset")
    return span + (f", {model}" if model else "") + (f" on {data}" if data else "")


def _check_same_run(path: Path, state: dict[str, Any]) -> None:
    """Refuse to replace ``path`` with the checkpoint ``state`` unless ``path`` is an ooc
    checkpoint of the same run: the same model and dataset fingerprint.

    Raises:
        OutputExists: naming what differs.
    """
    try:
        old = load_checkpoint(path)
    except CheckpointError as e:
        raise OutputExists(f"{e}; ooc replaces only its own checkpoints (use another "
                           f"checkpoint folder)") from None
    for key, what in (("model_config", "model"), ("dataset_fingerprint", "dataset")):
        if old.get(key) != state.get(key):
            raise OutputExists(f"{path}: is a checkpoint of another run (another {what}); "
                               f"ooc does not replace it (use another checkpoint folder, or "
                               f"--overwrite from ooc.train)")


def remove_checkpoints(paths: list[Path]) -> None:
    """Remove the checkpoints :func:`check_checkpoint_dir` returned (a new run replaces
    them: none is left for a later ``--resume`` to take for the new run's)."""
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise IOFailure(f"{p}: cannot remove the checkpoint --overwrite replaces "
                            f"({e.strerror or e})") from None


#: meta.json fields left out of :func:`dataset_fingerprint` (where the data came from, and
#: the checksum over all fields, which covers those).
_UNHASHED_META = ("name", "source", "checksum")


def dataset_fingerprint(dataset: Any) -> str:
    """sha256 (hex) of a dataset's ``meta.json`` contents minus ``name``/``source``.

    ``dataset``: an opened :class:`ooc.storage.Dataset` (its ``meta`` dict).
    meta.json records the sizes and the sha256 of the small files (indptr,
    labels, splits), so two graphs with the same dimensions differ here.
    """
    meta = {k: v for k, v in dict(dataset.meta).items() if k not in _UNHASHED_META}
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def check_dataset(state: dict[str, Any], dataset: Any, path: str | os.PathLike) -> None:
    """Refuse to resume checkpoint ``state`` (from ``path``) on another dataset.

    Raises:
        CheckpointError: the checkpoint records a fingerprint and it is not
            the one of ``dataset``. A checkpoint without one is accepted.
    """
    theirs = state.get("dataset_fingerprint")
    if theirs is None:
        return
    mine = dataset_fingerprint(dataset)
    if theirs != mine:
        where = (state.get("extra") or {}).get("dataset") or "another dataset"
        raise CheckpointError(f"{path}: checkpoint was trained on {where} (meta.json fingerprint "
                              f"{theirs[:12]}), not on {dataset.path} ({mine[:12]}); resume on "
                              f"the same dataset or start a new --checkpoint-dir")


def _to_py(value: Any) -> Any:
    """JSON-like plain values (for ``weights_only`` loading)."""
    if isinstance(value, dict):
        return {str(k): _to_py(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_py(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def rng_state() -> dict[str, Any]:
    """The global RNG states (torch, CUDA, numpy, python) as loadable values."""
    np_state = np.random.get_state()
    if not isinstance(np_state, tuple):  # a dict: np.random.set_bit_generator replaced MT19937
        raise CheckpointError(f"numpy's global random generator is "
                              f"{np_state.get('bit_generator')}, not MT19937: its state cannot "
                              f"be checkpointed")
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], path: str | os.PathLike = "checkpoint") -> None:
    """Restore what :func:`rng_state` returned.

    Raises:
        CheckpointError: an entry is not a state of its generator.
    """
    try:
        _set_rng_state(state)
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path}: the random generator state does not load "
                              f"({str(e).splitlines()[0][:200]}; edited or corrupted "
                              f"checkpoint)") from None


def _set_rng_state(state: dict[str, Any]) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        s = state["numpy"]
        np.random.set_state((s[0], s[1].numpy().astype(np.uint32), s[2], s[3], s[4]))
    if "python" in state:
        s = state["python"]
        random.setstate((s[0], tuple(s[1]), s[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: str | os.PathLike, epoch: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | dict[str, Any] | None = None,
                    args: dict[str, Any] | None = None,
                    history: list[dict[str, Any]] | None = None,
                    extra: dict[str, Any] | None = None, dataset: Any = None) -> Path:
    """Write ``directory/epoch_{epoch:04d}.pt`` atomically and return its path.

    ``optimizer``: the optimizer, or its ``state_dict()`` (model averaging
    saves the averaged state of the local optimizers). ``dataset``: the
    training dataset, whose :func:`dataset_fingerprint` is stored (None: no
    fingerprint, e.g. a model saved for inference only).
    """
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "epoch": int(epoch),
        "model_config": describe_model(model),
        "model_state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer_state": (optimizer.state_dict() if isinstance(optimizer, torch.optim.Optimizer)
                            else optimizer),
        "rng": rng_state(),
        "args": _to_py(args or {}),
        "history": _to_py(history or []),
        "extra": _to_py(extra or {}),
    }
    if dataset is not None:
        state["dataset_fingerprint"] = dataset_fingerprint(dataset)
    path = checkpoint_path(directory, epoch)
    if os.path.lexists(path):
        _check_same_run(path, state)
    buf = io.BytesIO()
    torch.save(state, buf)
    try:
        with atomic_file(path, "wb") as f:
            f.write(buf.getbuffer())
    except OSError as e:
        raise IOFailure(f"{path}: cannot write checkpoint ({e.strerror or e})") from None
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Load and validate a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError: missing file, not a torch file, or not an ooc checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means "not ours"
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: not an ooc checkpoint ({msg[:200]})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an ooc checkpoint (no 'format': "
                              f"{CHECKPOINT_FORMAT!r} entry)")
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint version {state.get('version')!r} "
                              f"(this ooc reads version {CHECKPOINT_VERSION})")
    for key in ("epoch", "model_config", "model_state"):
        if key not in state:
            raise CheckpointError(f"{path}: checkpoint lacks {key!r}")
    check_fields(state, path)
    return state


#: Kinds of the optional entries of a checkpoint (None is accepted for each).
_OPTIONAL = {"optimizer_state": dict, "rng": dict, "args": dict, "history": list, "extra": dict,
             "dataset_fingerprint": str}
#: Ranges of a built-in model's sizes in ``model_config``.
_CONFIG_RANGES = {"in_dim": (1, 1 << 24), "hidden": (1, 1 << 20), "out_dim": (1, 1 << 24),
                  "num_layers": (1, 256), "heads": (1, 1024)}


def check_fields(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose entries were edited into the wrong kind or range: ``epoch``
    an integer >= 0 (and the one of an ``epoch_NNNN.pt`` file name), ``model_config`` a
    dict of sizes in range whose built model has exactly the parameter shapes of
    ``model_state`` (a dict of tensors; checked on the meta device, so an absurd size never
    allocates), and each optional entry of its kind or None.

    Raises:
        CheckpointError: naming the file and the entry.
    """
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what} (edited or corrupted checkpoint)")

    epoch = state["epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise bad(f"'epoch' must be an integer >= 0, got {epoch!r}")
    m = _NAME.match(Path(path).name)
    if m and int(m.group(1)) != epoch:
        raise bad(f"'epoch' is {epoch}, but the file name says {int(m.group(1))}")
    for key, kind in _OPTIONAL.items():
        if state.get(key) is not None and not isinstance(state[key], kind):
            raise bad(f"{key!r} must be a {kind.__name__}, got {type(state[key]).__name__}")
    weights = state["model_state"]
    if not (isinstance(weights, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in weights.items())):
        raise bad("'model_state' must map parameter names to tensors")
    config = state["model_config"]
    if not isinstance(config, dict):
        raise bad(f"'model_config' must be a dict, got {type(config).__name__}")
    if USER_MODEL in config:
        return
    for key, (lo, hi) in _CONFIG_RANGES.items():
        v = config.get(key)
        if key in config and not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
            raise bad(f"model_config {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    try:
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in build_model(**config).state_dict().items()}
    except (TypeError, ValueError, OocError) as e:
        raise bad(f"model_config does not describe a model ({str(e).splitlines()[0][:200]})") \
            from None
    theirs = {k: tuple(v.shape) for k, v in weights.items()}
    if shapes != theirs:
        diff = next((k for k in sorted(set(shapes) | set(theirs)) if shapes.get(k) != theirs.get(k)))
        raise bad(f"model_state does not fit model_config: {diff} is {theirs.get(diff)}, the "
                  f"model has {shapes.get(diff)}")


#: Key of :func:`describe_model` for a model that is not one of ooc's built-in GNNs.
USER_MODEL = "user_model"


def describe_model(model: torch.nn.Module) -> dict[str, Any]:
    """What a checkpoint records of its model: a built-in :class:`GNN`'s build arguments, or
    for any other module its class and the shape of every parameter and buffer (enough to
    refuse resuming into another model; the module itself is the user's to rebuild)."""
    config = getattr(model, "config", None)
    if isinstance(model, GNN) and isinstance(config, dict):
        return dict(config)
    cls = type(model)
    return {USER_MODEL: f"{cls.__module__}.{cls.__qualname__}",
            "shapes": {k: list(v.shape) for k, v in model.state_dict().items()}}


def model_from_checkpoint(state: dict[str, Any], path: str | os.PathLike = "checkpoint") -> GNN:
    """Rebuild the model a loaded checkpoint describes and load its weights."""
    if USER_MODEL in state["model_config"]:
        raise CheckpointError(
            f"{path}: the checkpoint holds a user model ({state['model_config'][USER_MODEL]}); "
            f"build it and load torch.load(path)['model_state'] into it, or resume with "
            f"Trainer(dataset, model=...).resume(path)")
    try:
        model = build_model(**state["model_config"])
        model.load_state_dict(state["model_state"])
    except (TypeError, RuntimeError, KeyError) as e:
        msg = str(e).splitlines()[0]
        raise CheckpointError(f"{path}: model in checkpoint does not load ({msg[:200]})") from None
    return model


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> GNN:
    """The trained model stored in a checkpoint file (or the latest in a folder), in eval mode."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    state = load_checkpoint(path, map_location=map_location)
    model = model_from_checkpoint(state, path)
    model.eval()
    return model
