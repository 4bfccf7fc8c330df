"""state-dict-not-loaded (GD130): what the load_state_dict wrapper reads of a strict=False load
(instrument/stateload.py), and the rule over hand-written traces."""

from __future__ import annotations

from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.stateload import nothing_loaded
from rule_traces import builder, findings, only

SLUG = "state-dict-not-loaded"


def _model():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _load(model, state):
    return nothing_loaded(model, state, model.load_state_dict(state, strict=False))


def test_a_wrapped_models_checkpoint_places_nothing_and_its_prefix_is_named():
    state = {f"module.{k}": v for k, v in _model().state_dict().items()}
    facts = _load(_model(), state)
    assert facts["params"] == 6 and facts["keys"] == len(state)
    assert facts["prefix"] == ["strip", "module."] and facts["unexpected"][0] == "module.0.weight"


def test_a_model_wrapped_on_load_gets_the_prefix_to_add():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = _model()

    assert _load(Wrapper(), _model().state_dict())["prefix"] == ["add", "model."]


def test_partial_loads_and_full_loads_are_not_reported():
    partial = {k: v for k, v in _model().state_dict().items() if not k.startswith("2.")}
    partial["old_head.weight"] = partial["0.weight"]
    assert _load(_model(), partial) is None  # a new head: the rest was placed
    assert _load(_model(), _model().state_dict()) is None
    assert _load(_model(), {}) is None  # nothing offered: nothing unexpected either


def _trace(prefix=("strip", "module.")):
    t = builder()
    t.put(ev.state_not_loaded(cls="Net", keys=4, params=4, unexpected=["module.fc.weight"],
                              missing=["fc.weight"], prefix=list(prefix) if prefix else None), 3)
    t.backward(fresh=[0, 1], line=11)
    t.step(line=12)
    return t


def test_the_rule_reports_the_load_with_a_fix_for_its_prefix():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "placed none of the 4 parameters of Net" in f.message
    assert "removeprefix('module.')" in f.fix
    assert "print both lists" in only(_trace(prefix=None), SLUG).fix
    assert findings(builder(), SLUG) == []
