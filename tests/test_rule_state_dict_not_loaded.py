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


# -- a load every weight of which an initialiser overwrote before the first step ---------------

def _overwritten(t, params=(0, 1), line=4, at=((("train.py", 5, "<module>"),))):
    return t.put(ev.state_overwritten(cls="Sequential", params=list(params), weights=1,
                                      via=["torch.nn.init.xavier_uniform_"],
                                      at=[list(x) for x in at]), line)


def _steps(t, n=2):
    for _ in range(n):
        t.backward(fresh=[0, 1], line=8)
        t.step(0, line=9)


def test_an_overwritten_load_is_a_warning_at_the_load_naming_the_initialisation():
    t = builder("Adam")
    _overwritten(t)
    _steps(t)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert "xavier_uniform_" in f.message and "at line 5" in f.message
    assert "Adam trains the fresh initialisation" in f.message
    assert f.related[0].location.line == 5 and "below the re-initialisation at line 5" in f.fix


def test_an_overwritten_load_no_optimizer_steps_is_silent():
    t = builder("Adam")
    _overwritten(t, params=(5, 6))  # a model no optimizer owns (evaluated from scratch)
    _steps(t)
    assert findings(t, SLUG) == []


def _run(script):
    import torch

    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        script(torch)
    return [e for e in rec.trace if e.kind == "state_overwritten"]


def _train(torch, model, steps=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()


def test_the_watcher_sees_every_weight_overwritten_through_data_and_reset_parameters():
    def script(torch):
        model = _model()
        model.load_state_dict(_model().state_dict())  # mark: load
        torch.nn.init.normal_(model[0].weight.data)
        model[2].reset_parameters()  # mark: reset
        _train(torch, model)

    made = _run(script)
    assert len(made) == 1 and made[0]["weights"] == 2 and len(made[0]["params"]) == 3
    assert made[0]["via"][0] == "torch.nn.init.normal_"
    assert made[0].loc.line == _line("# mark: load")
    assert [x[1] for x in made[0]["at"]][-1] == _line("# mark: reset")


def test_the_watcher_is_silent_when_a_weight_survives_a_later_load_replaces_or_nothing_trains():
    def head_only(torch):
        model = _model()
        model.load_state_dict(_model().state_dict())
        model[2].reset_parameters()
        _train(torch, model)

    def loaded_again(torch):
        model, state = _model(), _model().state_dict()
        model.load_state_dict(state)
        for m in (model[0], model[2]):
            m.reset_parameters()
        model.load_state_dict(state)
        _train(torch, model)

    def never_trained(torch):
        model = _model()
        model.load_state_dict(_model().state_dict())
        model[0].reset_parameters()
        model[2].reset_parameters()

    assert _run(head_only) == [] and _run(loaded_again) == [] and _run(never_trained) == []


def _line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "_line(" not in text:
                return number
    raise AssertionError(marker)
