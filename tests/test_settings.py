"""The settings model: one declaration gives TrainConfig, ModeOptions, the CLI and the
loader's defaults, and an error names the setting as its caller wrote it."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from ooc.core.errors import InvalidValue, cli_names
from ooc.executor.loader.node_loader import NodeLoader
from ooc.executor.loader.stack import ModeOptions
from ooc.executor.settings import BY_NAME, MODE, RUN, TRAIN
from ooc.executor.training.config import TrainConfig
from ooc.train import DEFAULTS, _check_options, _mode_options, build_parser


def test_every_declared_setting_is_a_field_with_its_default():
    for cls, settings in ((TrainConfig, TRAIN), (ModeOptions, MODE)):
        fields = {f.name for f in dataclasses.fields(cls)}
        obj = cls()
        for s in settings:
            assert s.name in fields, (cls.__name__, s.name)
            want = list(s.default) if isinstance(s.default, tuple) else s.default
            assert getattr(obj, s.name) == want, s.name
        assert fields - {s.name for s in settings} <= {"progress", "eval_final"}


def test_the_loader_and_the_cli_default_to_the_declarations():
    sig = inspect.signature(NodeLoader.__init__).parameters
    assert list(sig["num_neighbors"].default) == list(BY_NAME["fanouts"].default)
    for kw, name in (("batch_size", "batch_size"), ("seed", "seed"), ("preset", "mode"),
                     ("io_backend", "io_backend")):
        assert sig[kw].default == BY_NAME[name].default, kw
    config = _check_options(dict(DEFAULTS), progress=False)
    assert config == TrainConfig(progress=False)
    assert _mode_options(dict(DEFAULTS)) == ModeOptions()
    options = {a.dest for a in build_parser()._actions}
    for s in TRAIN + MODE + RUN:
        assert s.dest in options and s.dest in DEFAULTS, s.name


def _out_of_range(s):
    if s.kind in ("int", "float") and s.lo is not None:
        return s.lo if s.lo_open else s.lo - 1
    return {"size": "lots", "choice": "nope"}.get(s.kind)


@pytest.mark.parametrize("s", [s for s in TRAIN + MODE if _out_of_range(s) is not None],
                         ids=lambda s: s.name)
def test_a_refused_value_names_the_keyword_or_the_flag(s):
    cls = TrainConfig if s in TRAIN else ModeOptions
    bad = _out_of_range(s)
    with pytest.raises(InvalidValue, match=rf"^{s.name} "):
        cls(**{s.name: bad}).validate()
    with cli_names(), pytest.raises(InvalidValue, match=rf"^{s.option} "):
        cls(**{s.name: bad}).validate()


def test_sizes_are_read_from_text():
    opts = ModeOptions(feature_cache_size="512MiB", memory_budget="2GB")
    opts.validate()
    assert opts.feature_cache_size == 512 << 20 and opts.memory_budget == 2 * 10**9
    s = dict(DEFAULTS, runtime_disk_budget="3GiB", neighbor_cache_size="0")
    assert _mode_options(s).runtime_disk_budget == 3 << 30
    assert _mode_options(s).neighbor_cache_size == 0


def test_fanouts_in_every_form():
    config = TrainConfig(fanouts=(15, 10, 5))
    config.validate()
    assert config.fanouts == [15, 10, 5]
    config = _check_options(dict(DEFAULTS, fanouts="15,10,-1"), progress=False)
    assert config.fanouts == [15, 10, -1]
    with cli_names(), pytest.raises(InvalidValue, match=r"^--fanouts '10,x': expected comma"):
        _check_options(dict(DEFAULTS, fanouts="10,x"), progress=False)
    with pytest.raises(InvalidValue, match=r"^num_neighbors \[10, 0\]: one value per layer"):
        NodeLoader(None, [10, 0])


@pytest.mark.parametrize("text,field", [("10,,10", "field 2 of 3"), ("10,10,", "field 3 of 3"),
                                        (",10", "field 1 of 2"), ("", "no value")])
def test_an_empty_fanout_field_is_refused_not_dropped(text, field):
    """``--fanouts 10,,10`` once trained a 2-layer model: the empty field was skipped."""
    from ooc.train import _settings

    with cli_names(), pytest.raises(InvalidValue, match=rf"^--fanouts '{text}': {field}"):
        _settings({"fanouts": text}, None)
    with pytest.raises(InvalidValue, match=r"^fanouts "):
        TrainConfig(fanouts=[10, None, 10]).validate()
    with pytest.raises(InvalidValue, match=r"^num_neighbors "):
        NodeLoader(None, [10, None, 10])


@pytest.mark.parametrize("layers", [0, -1, 65])
def test_layers_out_of_range_names_layers(layers):
    """``--layers 0`` once talked of ``--fanouts ''``, an option the user did not write."""
    from ooc.train import _settings

    with cli_names(), pytest.raises(InvalidValue, match=rf"^--layers {layers}: must be an "
                                                        r"integer in \[1, 64\]"):
        _settings({"layers": layers}, None)
