"""module-requires-grad-attribute (GD114): on hand-written traces (no torch), and the
``nn.Module.__setattr__`` watcher in-process: what it records, what it leaves alone, that the
attribute is set exactly as without graddoctor, and that the patch goes on exit."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, fold_hard, only

SLUG = "module-requires-grad-attribute"


def flag(t, value=False, params=(0, 1), line=4):
    return t.put(ev.module_attr(mid=0, cls="Sequential", name="requires_grad", value=value,
                                params=list(params)), line)


def updates(t, n, params=(0, 1, 2)):
    for _ in range(n):
        t.clear(list(params), line=8)
        t.backward(fresh=list(params), line=9)
        t.step(0, line=10)


def test_false_on_a_module_whose_parameters_keep_training_is_a_warning_at_the_assignment():
    t = TraceBuilder()
    t.param(0, "backbone.0.weight")
    t.param(1, "backbone.0.bias")
    flag(t)
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 3)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert "freezes none of its parameters" in f.message and "backbone.0.weight" in f.message
    assert "requires_grad_(False)" in f.fix


def test_false_on_a_module_that_gets_no_gradient_is_silent():
    # the module's own switch (it skips its computation), or frozen by requires_grad_ as well
    t = TraceBuilder()
    flag(t)
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 3, params=(2,))
    assert findings(t, SLUG) == []


def test_false_on_parameters_no_optimizer_owns_is_silent():
    t = TraceBuilder()
    flag(t, params=(3, 4))
    t.optimizer(0, [0, 1, 2], line=5)
    for _ in range(3):
        t.backward(fresh=[0, 1, 2, 3, 4], line=9)
        t.step(0, line=10)
    assert findings(t, SLUG) == []


def test_true_on_a_module_whose_parameters_stay_frozen_is_a_warning():
    t = TraceBuilder()
    t.param(0, "encoder.weight", requires_grad=False)
    t.param(1, "encoder.bias", requires_grad=False)
    t.optimizer(0, [0, 1, 2], line=5)
    flag(t, value=True, line=6)
    updates(t, 2, params=(2,))
    f = only(t, SLUG)
    assert f.location.line == 6 and "unfreezes none" in f.message


def test_true_on_a_module_whose_parameters_train_is_silent():
    t = TraceBuilder()
    flag(t, value=True)  # a module's own option, set in its __init__
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 2)
    assert findings(t, SLUG) == []


def test_the_finding_survives_folding():
    t = TraceBuilder()
    flag(t)
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 12)
    assert only(fold_hard(t.trace), SLUG).location.line == 4


# -- the watcher, in-process -----------------------------------------------------------------

def record(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        fn()
    return [e for e in rec.trace if e.kind == "module_attr"]


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


class OwnSwitch(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.requires_grad = True  # mark: own switch


class PropertyFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)

    @property
    def requires_grad(self):
        return all(p.requires_grad for p in self.parameters())

    @requires_grad.setter
    def requires_grad(self, value):
        self.requires_grad_(value)


def test_the_watcher_records_the_users_assignment_once_per_line_and_module_and_sets_it():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    seen = {}

    def script():
        for _ in range(3):
            model[0].requires_grad = False  # mark: attribute
        own = OwnSwitch()
        prop = PropertyFlag()
        prop.requires_grad = False  # a property: really freezes
        model.other = 5
        seen.update(flag=model[0].requires_grad, own=own.requires_grad,
                    frozen=[p.requires_grad for p in prop.parameters()],
                    trains=[p.requires_grad for p in model.parameters()])

    made = record(script)
    assert seen == {"flag": False, "own": True, "frozen": [False, False], "trains": [True] * 4}
    assert [(e["cls"], e["value"], len(e["params"]), e.loc.line) for e in made] == [
        ("Linear", False, 2, line_of("# mark: attribute")),
        ("OwnSwitch", True, 2, line_of("# mark: own switch"))]


def test_the_patch_is_removed_on_exit():
    before = nn.Module.__setattr__
    record(lambda: None)
    assert nn.Module.__setattr__ is before
    module = nn.Linear(2, 2)
    module.requires_grad = False
    assert module.weight.requires_grad and module.__dict__["requires_grad"] is False


def test_a_loop_over_children_is_one_finding_at_its_line():
    t = TraceBuilder()
    for mid, params in enumerate(([0, 1], [2, 3])):
        t.put(ev.module_attr(mid=mid, cls="Linear", name="requires_grad", value=False,
                             params=params), 4)
    t.optimizer(0, [0, 1, 2, 3], line=5)
    updates(t, 2, params=(0, 1, 2, 3))
    f = only(t, SLUG)
    assert "Linear objects (2 modules)" in f.message and f.evidence["params"] == ["p0", "p1", "p2", "p3"]


# -- the other names of a freeze, on tensors ---------------------------------------------------

def tensor_flag(t, pid, value=False, name="requires_grad_", requires_grad=True, line=4):
    return t.put(ev.param_attr(pid=pid, cls="Parameter", name=name, value=value,
                               requires_grad=requires_grad), line)


def test_a_tensor_flag_set_false_on_parameters_that_keep_training_is_one_warning_per_line():
    t = TraceBuilder()
    t.param(0, "encoder.weight")
    t.param(1, "encoder.bias")
    tensor_flag(t, 0)
    tensor_flag(t, 1)
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 3)
    f = only(t, SLUG)
    assert f.location.line == 4 and f.severity == Severity.WARNING
    assert "requires_grad_ = False" in f.message and "2 Parameters" in f.message
    assert "hides the requires_grad_() method" in f.message and "encoder.weight" in f.message
    assert f.evidence["attribute"] == "requires_grad_" and "requires_grad_(False)" in f.fix


def test_a_misspelt_or_keras_name_says_what_torch_reads():
    t = TraceBuilder()
    tensor_flag(t, 0, name="require_grad", line=3)
    tensor_flag(t, 1, name="trainable", line=4)
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 2)
    got = {f.location.line: f.message for f in findings(t, SLUG)}
    assert "`require_grad` is no name torch knows" in got[3]
    assert "Keras' name" in got[4]


def test_a_tensor_flag_on_parameters_that_get_no_gradient_is_silent():
    # a marker the script reads to freeze them for real, or to leave them out of the optimizer
    t = TraceBuilder()
    tensor_flag(t, 0, name="trainable")
    t.optimizer(0, [0, 1, 2], line=5)
    updates(t, 3, params=(1, 2))
    assert findings(t, SLUG) == []


def test_a_tensor_flag_set_true_on_frozen_parameters_that_stay_frozen_is_a_warning():
    t = TraceBuilder()
    t.param(0, "encoder.weight", requires_grad=False)
    t.optimizer(0, [0, 1, 2], line=5)
    tensor_flag(t, 0, value=True, requires_grad=False, line=6)
    updates(t, 2, params=(1, 2))
    f = only(t, SLUG)
    assert f.location.line == 6 and "unfreezes none of them" in f.message


def test_a_tensor_flag_set_true_on_parameters_that_then_train_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1, 2], line=5)
    tensor_flag(t, 0, value=True, requires_grad=False, line=6)
    updates(t, 2)  # something else unfroze it: it gets gradients
    assert findings(t, SLUG) == []


def test_a_value_that_is_no_flag_is_silent():
    t = TraceBuilder()
    tensor_flag(t, 0, value="frozen")
    tensor_flag(t, 1, value=0.5, line=5)
    t.optimizer(0, [0, 1, 2], line=6)
    updates(t, 2)
    assert findings(t, SLUG) == []


def record_tensor_flags(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        fn()
    return [e for e in rec.trace if e.kind == "param_attr"]


def test_the_tensor_watcher_records_freeze_names_and_stores_the_value_as_python_would():
    layer = nn.Linear(3, 2)
    seen = {}

    def script():
        for p in layer.parameters():
            p.requires_grad_ = False  # mark: shadowed method
        layer.weight.tensor_model_parallel = True  # a framework's marker: not a freeze name
        layer.weight.trainable = 0  # mark: keras
        seen.update(shadowed=layer.bias.requires_grad_, keras=layer.weight.trainable,
                    marker=layer.weight.tensor_model_parallel,
                    flags=[p.requires_grad for p in layer.parameters()],
                    method=callable(torch.Tensor.requires_grad_),
                    missing=hasattr(torch.ones(1), "trainable"))

    made = record_tensor_flags(script)
    assert seen == {"shadowed": False, "keras": 0, "marker": True, "flags": [True, True],
                    "method": True, "missing": False}
    assert [(e["name"], e["value"], e["cls"], e.loc.line) for e in made] == [
        ("requires_grad_", False, "Parameter", line_of("# mark: shadowed method")),
        ("requires_grad_", False, "Parameter", line_of("# mark: shadowed method")),
        ("trainable", 0, "Parameter", line_of("# mark: keras"))]


def test_the_tensor_watcher_leaves_library_code_and_non_leaf_tensors_alone():
    library_code = compile("p.trainable = False", torch.__file__, "exec")  # a frame inside torch

    def script():
        p = nn.Parameter(torch.ones(2))
        exec(library_code, {"p": p})
        (p * 2).trainable = False  # not a leaf: nothing to freeze

    assert record_tensor_flags(script) == []


def test_the_tensor_descriptors_are_removed_on_exit_and_requires_grad_still_works_inside():
    before = torch.Tensor.__dict__.get("requires_grad_")
    p = nn.Parameter(torch.ones(2))

    def script():
        p.requires_grad_(False)  # the method, through the descriptor, to the mode watcher's wrapper

    record_tensor_flags(script)
    assert p.requires_grad is False
    assert torch.Tensor.__dict__.get("requires_grad_") is before
    assert "trainable" not in torch.Tensor.__dict__ and "require_grad" not in torch.Tensor.__dict__
