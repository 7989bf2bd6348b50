"""The training settings of a command line, resolved and checked: what ``ooc.train`` runs
with and what ``ooc.size`` profiles (one resolution for both).

``given`` is argparse's namespace as a dict (only the options the user gave, argparse's
``argument_default=SUPPRESS``); :func:`resolve` fills in the declared defaults
(:mod:`ooc.executor.settings`), :func:`check_options` checks every setting and makes the
``TrainConfig``, :func:`mode_options` the loader stack's ``ModeOptions``.
"""
from __future__ import annotations

from typing import Any

from ooc.core.errors import InvalidValue
from ooc.core.sizes import check_range
from ooc.executor.loader.stack import ModeOptions
from ooc.executor.settings import MODE, RUN, TRAIN, parse_fanouts
from ooc.executor.training.config import TrainConfig

#: Option defaults, keyed as the parsed command line and a checkpoint's ``args``: the
#: declared settings (:mod:`ooc.executor.settings`) plus ``data`` and ``layers``
#: (derived from ``fanouts`` when None).
DEFAULTS: dict[str, Any] = {"data": None, "layers": None,
                            **{st.dest: st.cli_default() for st in TRAIN + MODE + RUN}}
#: The most layers ``--layers`` takes (each layer multiplies a batch's sampled nodes).
MAX_LAYERS = 64
#: Settings that must not change when resuming (they define the model or the math).
FIXED_ON_RESUME = ("model", "task", "decoder", "fanouts", "hidden", "heads", "dropout",
                   "seed", "batch_size", "lr", "weight_decay")


#: Defaults of a ``--task`` where they differ from the settings' own: link prediction
#: encodes with GCN, the graph autoencoder's encoder (on Cora's 5%/10% split its test AUC
#: is 0.92-0.94 with the other defaults, GraphSAGE's 0.88-0.90).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {"link": {"model": "gcn"}}


def resolve(given: dict[str, Any], saved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Explicit options > the checkpoint's settings (``saved``, on resume) > the task's
    defaults (:data:`TASK_DEFAULTS`) > defaults."""
    s = dict(DEFAULTS)
    s.update(TASK_DEFAULTS.get(given.get("task") or (saved or {}).get("task") or "", {}))
    if saved:
        s.update({k: v for k, v in saved.items() if k in DEFAULTS})
        for k in FIXED_ON_RESUME:
            if k in given and str(given[k]) != str(saved.get(k)):
                raise InvalidValue(f"--resume: --{k.replace('_', '-')} {given[k]} differs from the "
                                   f"checkpoint's {saved.get(k)} (resuming needs the same settings)")
    s.update({k: v for k, v in given.items() if k in DEFAULTS})
    check_range("--layers", s.get("layers"), 1, MAX_LAYERS, integer=True)
    if "fanouts" not in given and "layers" in given and not saved:
        s["fanouts"] = ",".join(["10"] * int(given["layers"]))
    fanouts = parse_fanouts(s["fanouts"])
    if s.get("layers") is not None and int(s["layers"]) != len(fanouts):
        raise InvalidValue(f"--layers {s['layers']} does not match --fanouts {s['fanouts']} "
                           f"({len(fanouts)} layers)")
    s["fanouts"] = ",".join(str(v) for v in fanouts)
    s["layers"] = len(fanouts)
    return s


def check_options(s: dict[str, Any], progress: bool):
    """Check every setting of :func:`resolve`'s ``s``; returns the run's ``TrainConfig``.

    Runs before the dataset is opened or created, so bad input touches no file.
    """
    for st in RUN + MODE:
        st.check(st.from_cli(s.get(st.dest)))

    config = TrainConfig(progress=progress,
                         **{st.name: st.from_cli(s[st.dest]) for st in TRAIN})
    config.validate()
    if s["no_eval"]:
        config.eval_every = 10**9
        config.eval_final = False
    return config


def mode_options(s: dict[str, Any]):
    """The loader stack's options (``ModeOptions``) from :func:`resolve`'s ``s``."""

    return ModeOptions(**{st.name: st.from_cli(s[st.dest]) for st in MODE})
