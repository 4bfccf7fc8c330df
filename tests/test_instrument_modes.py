"""The mode watcher in-process: what it records, that it aggregates, and that it changes nothing."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder


def record(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        fn()
    return rec.trace


def of(trace, *kinds):
    return [e for e in trace if e.kind in kinds]


def line_of(marker: str) -> int:
    """The line of this file that contains ``marker`` (keeps the tests independent of edits)."""
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


def cnn(blocks=5):
    layers = [nn.Conv2d(3, 4, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Dropout(0.1), nn.Linear(4 * 4 * 4, 2))


def test_train_is_recorded_once_per_outermost_call():
    model = cnn()

    def script():
        model.train()  # mark: train
        model.eval()  # mark: eval

    sets = of(record(script), "train", "eval")
    assert [(e["mode"], e.loc.line) for e in sets] == [(True, line_of("mark: train")), (False, line_of("mark: eval"))]
    assert len(sets[0]["modules"]) == 6  # 5 BatchNorm + 1 dropout, the other layers are not listed
    assert sets[0]["leaf"] is False


def test_per_layer_eval_calls_merge_into_one_event():
    model = cnn()

    def script():
        model.train()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()  # mark: per-layer

    sets = of(record(script), "train", "eval")
    assert len(sets) == 2
    assert sets[1]["leaf"] is True and sets[1]["calls"] == 5 and len(sets[1]["modules"]) == 5
    assert sets[1].loc.line == line_of("mark: per-layer")


def test_a_train_override_names_the_callers_line():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def train(self, mode=True):
            super().train(mode)
            return self

    net = Net()

    def script():
        net.train()  # mark: override

    (event,) = of(record(script), "train", "eval")
    assert event.loc.line == line_of("mark: override")


def test_forwards_are_aggregated_per_call_site_and_mode():
    model = cnn(blocks=5)
    x = torch.randn(2, 3, 4, 4)

    def script():
        out = model(x)  # mark: train forward
        out.sum().backward()
        with torch.no_grad():
            for _ in range(3):
                model(x)  # mark: no-grad forward

    trace = record(script)
    forwards = of(trace, "mode_forward")
    assert [(e.loc.line, e["grad"], e["calls"], len(e["modules"])) for e in forwards] == [
        (line_of("mark: train forward"), True, 1, 6), (line_of("mark: no-grad forward"), False, 3, 6)]
    assert set(forwards[0]["grad_modules"]) == set(forwards[0]["modules"])
    assert forwards[1]["grad_modules"] == []
    modules = of(trace, "mode_module")
    # once per layer (the facts did not change), and the dropout layer's once more when its first
    # no-grad forward in train mode notes the model holding it (no optimizer trains it: a teacher?)
    assert len(modules) == 7
    assert [e["model"] for e in modules if e["layer"] == "dropout"] == [None, "model"]
    assert modules[0]["name"] == "model.1" and modules[-1]["name"] == "model.17"


def test_frozen_and_unowned_layers_and_the_freeze_line():
    model = cnn(blocks=1)
    x = torch.randn(2, 3, 4, 4)

    def script():
        model[:4].requires_grad_(False)  # mark: freeze
        torch.optim.SGD(model[4:].parameters(), lr=0.1)
        model(x)

    trace = record(script)
    (freeze,) = of(trace, "freeze")
    assert freeze.loc.line == line_of("mark: freeze") and freeze["calls"] == 6  # conv, BatchNorm, conv: 2 each
    bn = next(e for e in of(trace, "mode_module") if e["layer"] == "batchnorm")
    assert bn["frozen"] is True and bn["owned"] is False and bn["freeze"] == freeze.seq


def test_ema_update_marks_the_layer_updated():
    student = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    teacher = copy.deepcopy(student).requires_grad_(False)
    x = torch.randn(4, 3)

    def script():
        with torch.no_grad():
            teacher(x)
            for t, s in zip(teacher.parameters(), student.parameters()):
                t.mul_(0.9).add_(s, alpha=0.1)
            teacher(x)

    states = [e for e in of(record(script), "mode_module") if e["layer"] == "batchnorm"]
    assert [e["updated"] for e in states] == [False, True]


def test_momentum_encoder_data_swap_marks_the_layer_updated():
    query = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    key = copy.deepcopy(query)
    for p in key.parameters():
        p.requires_grad = False
    x = torch.randn(4, 3)

    def script():
        with torch.no_grad():
            key(x)
            for pk, pq in zip(key.parameters(), query.parameters()):
                pk.data = pk.data * 0.99 + pq.data * 0.01  # MoCo: no _version bump
            key(x)

    states = [e for e in of(record(script), "mode_module") if e["layer"] == "batchnorm"]
    assert [e["updated"] for e in states] == [False, True]


def test_recalibration_signals():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    loader = [torch.randn(4, 3) for _ in range(3)]

    def script():
        nn.BatchNorm1d(4)  # construction resets the statistics too: not a signal
        model[1].reset_running_stats()  # mark: reset
        torch.optim.swa_utils.update_bn(loader, model)  # mark: update_bn

    trace = record(script)
    (reset,) = of(trace, "bn_reset")
    assert reset.loc.line == line_of("mark: reset")
    (recal,) = of(trace, "update_bn")
    assert recal.loc.line == line_of("mark: update_bn")
    assert of(trace, "train", "eval") == []  # update_bn's own train() calls are not the user's
    (forward,) = of(trace, "mode_forward")
    assert forward["recalibrating"] is True and forward["calls"] == 3 and forward["grad"] is False


def test_checkpoint_recomputation_is_not_a_forward():
    from torch.utils.checkpoint import checkpoint

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    x = torch.randn(4, 3, requires_grad=True)

    def script():
        checkpoint(model, x, use_reentrant=False).sum().backward()

    forwards = of(record(script), "mode_forward")
    assert [e["calls"] for e in forwards] == [1]


def test_instrumentation_is_removed_and_changes_nothing():
    originals = (nn.Module.train, nn.modules.batchnorm._BatchNorm.forward, nn.Dropout.forward,
                 nn.modules.batchnorm._NormBase.reset_running_stats, torch.optim.swa_utils.update_bn)

    def run():
        torch.manual_seed(0)
        model = cnn(blocks=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 3, 4, 4), torch.randint(0, 2, (8,))
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            out = model(x)
        return [t.clone() for t in model.state_dict().values()] + [out]

    plain = run()
    box = {}
    record(lambda: box.setdefault("out", run()))
    assert all(torch.equal(a, b) for a, b in zip(plain, box["out"]))
    assert (nn.Module.train, nn.modules.batchnorm._BatchNorm.forward, nn.Dropout.forward,
            nn.modules.batchnorm._NormBase.reset_running_stats, torch.optim.swa_utils.update_bn) == originals
    assert "requires_grad_" not in torch.Tensor.__dict__


@pytest.mark.parametrize("cls", [nn.Dropout, nn.Dropout2d, nn.AlphaDropout, nn.SyncBatchNorm, nn.BatchNorm3d])
def test_every_layer_kind_is_seen(cls):
    layer = cls(0.5) if "Dropout" in cls.__name__ else cls(2)
    x = torch.randn(2, 2, 2, 2, 2) if cls is nn.BatchNorm3d else torch.randn(2, 2, 2, 2)

    def script():
        layer.eval()
        layer(x)

    (forward,) = of(record(script), "mode_forward")
    assert forward["training"] is False


def test_eval_on_a_frozen_part_is_marked_frozen():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.1), nn.Linear(3, 1))

    def script():
        model[:2].requires_grad_(False)
        model[:2].eval()
        model.eval()

    sets = of(record(script), "train", "eval")
    assert [e["frozen"] for e in sets] == [True, False]


def test_torch_compile_fullgraph_of_batchnorm_and_dropout_models_works_under_instrumentation():
    """Dynamo must inline the patched forwards although graddoctor's folder is on its skip list:
    otherwise fullgraph=True fails on any model with BatchNorm or dropout."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.BatchNorm1d(8), nn.Linear(8, 1)).eval()
    x = torch.randn(16, 4)
    expected = model(x)
    with Instrumentation(Recorder(step_budget=None)):
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        assert torch.equal(compiled(x), expected)
    torch._dynamo.reset()


def test_dynamos_function_map_built_inside_is_dropped_on_leaving():
    """Built while graddoctor's wrapper stands in for F.dropout (a checkpoint in a watched run
    loads Dynamo), the map names the wrapper: a later fullgraph compile outside graddoctor
    inlined the original F.dropout and failed."""
    from torch._dynamo import trace_rules

    original = nn.functional.dropout
    trace_rules.get_torch_obj_rule_map.cache_clear()
    with Instrumentation(Recorder(step_budget=None)):
        assert original not in trace_rules.get_torch_obj_rule_map()  # it names the wrapper
    assert original in trace_rules.get_torch_obj_rule_map()


def test_torch_jit_script_of_batchnorm_and_dropout_models_works_under_instrumentation():
    """The patched forwards once made torch.jit.script fail ("undefined value F"): it compiles
    the wrapped forward's source against the wrapper's globals."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.BatchNorm1d(8), nn.Linear(8, 1)).eval()
    x = torch.randn(16, 4)
    expected = model(x)
    with Instrumentation(Recorder(step_budget=None)):
        scripted = torch.jit.script(model)
        assert torch.equal(scripted(x), expected)


def test_torch_jit_script_of_a_function_calling_a_watched_builtin_works_under_instrumentation():
    """A wrapped builtin (``torch.where``) is a Python function JIT's table of builtins did not
    know: scripting code that calls it (``torch.distributed.optim`` scripts its functional
    optimizers at import, so ``import ignite`` did) tried to compile the wrapper from source and
    failed ("got builtin_function_or_method"). The wrapper is entered under the builtin's op for
    the check, and leaves the table when it ends."""
    from torch.jit import _builtins

    def positive_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x, torch.zeros_like(x)).sum()

    table = _builtins._get_builtin_table()
    with Instrumentation(Recorder(step_budget=None)):
        wrapper = torch.where
        assert getattr(wrapper, "__wrapped__", None) is not None  # watched during the check
        scripted = torch.jit.script(positive_sum)
        assert scripted(torch.tensor([-1.0, 2.0, 3.0])).item() == 5.0
    assert id(wrapper) not in table and table.get(id(torch.where)) == "aten::where"


# -- models run with dropout in train mode under no_grad: frozen teachers and EMA copies ---------
def distill(update=None, steps=6, wrap=False, optimizer=True):
    """A distillation loop under the instrumentation: a teacher with dropout in train mode makes
    the targets under no_grad, a student trains; ``update(teacher, student)`` runs after each
    step. Returns the dropout layers' mode_module events by name."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    student = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
    if update is not None and update.__name__.startswith("ema"):
        teacher = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    x = torch.randn(8, 6)

    class Holder(nn.Module):  # the teacher's no-grad pass inside the training forward
        def __init__(self):
            super().__init__()
            self.teacher, self.student = teacher, student

        def forward(self, x):
            with torch.no_grad():
                target = self.teacher(x)
            return nn.functional.mse_loss(self.student(x), target)

    holder = Holder()

    def script():
        opt = torch.optim.SGD(student.parameters(), lr=0.1) if optimizer else None  # watched
        for _ in range(steps):
            if wrap:
                loss = holder(x)
            else:
                with torch.no_grad():
                    target = teacher(x)
                loss = nn.functional.mse_loss(student(x), target)
            if opt is not None:
                opt.zero_grad()
            loss.backward()
            if opt is not None:
                opt.step()
            else:
                with torch.no_grad():
                    for p in student.parameters():
                        p -= 0.1 * p.grad
                        p.grad = None
            if update is not None:
                update(teacher, student)

    modules = of(record(script), "mode_module")
    return {name: [e for e in modules if e["name"] == name] for name in {e["name"] for e in modules}}


def facts(events):
    return [(e["model"], e["model_unchanged"], e["model_changed"]) for e in events]


def test_a_frozen_teacher_is_seen_unchanged_for_a_few_steps_then_no_longer_looked_at():
    from graddoctor.events import MODEL_STATIC_AFTER
    by_name = distill(steps=8)
    assert facts(by_name["teacher.2"]) == [("teacher", n, False) for n in range(MODEL_STATIC_AFTER + 1)]
    assert facts(by_name["student.2"]) == [(None, None, False)]  # it trains with grad: not looked at


def ema_in_place(teacher, student):
    with torch.no_grad():
        for t, s in zip(teacher.parameters(), student.parameters()):
            t.mul_(0.99).add_(s, alpha=0.01)


def ema_through_data(teacher, student):  # the Mean Teacher paper's code: no version moves
    for t, s in zip(teacher.parameters(), student.parameters()):
        t.data.mul_(0.99).add_(s.data, alpha=0.01)


def ema_data_swap(teacher, student):  # MoCo: new storage
    for t, s in zip(teacher.parameters(), student.parameters()):
        t.data = t.data * 0.99 + s.data * 0.01


@pytest.mark.parametrize("update", [ema_in_place, ema_through_data, ema_data_swap])
def test_an_ema_teacher_is_seen_changed(update):
    assert facts(distill(update)["teacher.2"]) == [("teacher", 0, False), ("teacher", 0, True)]


def test_without_an_optimizer_the_clock_is_the_backward_calls():
    assert facts(distill(optimizer=False)["teacher.2"])[-1] == ("teacher", 3, False)


def test_the_teacher_inside_a_module_holding_the_student_is_named_by_its_path():
    by_name = distill(wrap=True, steps=3)
    assert facts(by_name["holder.teacher.2"])[-1] == ("holder.teacher", 2, False)


def test_a_trained_model_run_under_no_grad_is_no_teacher():
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    x = torch.randn(4, 4)

    def script():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            with torch.no_grad():
                target = model(x)  # a pseudo-label by the model itself
            opt.zero_grad()
            nn.functional.mse_loss(model(x + 0.1), target).backward()
            opt.step()

    assert facts(of(record(script), "mode_module")) == [(None, None, False)]


def test_a_frozen_part_in_a_reentrant_checkpoint_is_no_teacher():
    # the checkpoint runs it under no_grad, and again with gradients in the backward
    from torch.utils.checkpoint import checkpoint

    frozen = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2)).requires_grad_(False)
    head = nn.Linear(4, 1)
    x = torch.randn(4, 4, requires_grad=True)

    def script():
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            head(checkpoint(frozen, x, use_reentrant=True)).sum().backward()
            opt.step()

    assert facts(of(record(script), "mode_module")) == [(None, None, False)]


class _FunctionalDropout(nn.Module):
    """Dropout written as a function of the module's mode (the PyTorch Geometric idiom)."""

    def __init__(self, p=0.5):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.p = p

    def forward(self, x):
        return F.dropout(self.lin(x), self.p, training=self.training)  # mark: functional


def test_a_module_running_dropout_with_its_mode_as_flag_is_a_dropout_layer_to_eval():
    model = _FunctionalDropout()
    x = torch.randn(3, 4)

    def script():
        model.train()
        model(x).sum().backward()  # train mode: the module becomes a holder, nothing recorded
        model.eval()
        model(x).sum().backward()  # eval mode under grad: recorded as a dropout layer's forward
        with torch.no_grad():
            model(x)  # validation: not recorded

    trace = record(script)
    sets = of(trace, "train", "eval")
    assert [e["mode"] for e in sets] == [True, False]
    assert sets[0]["modules"] == [], "the holder is not known before its first forward"
    (held,) = sets[1]["modules"]
    (forward,) = of(trace, "mode_forward")
    assert (forward["training"], forward["grad"], forward["modules"]) == (False, True, [held])
    (module,) = of(trace, "mode_module")
    assert (module["mid"], module["layer"], module["p"], module["cls"]) == (held, "functional_dropout", 0.5,
                                                                          "_FunctionalDropout")


def test_a_literal_false_flag_makes_no_holder():
    class Off(_FunctionalDropout):
        def forward(self, x):
            return F.dropout(self.lin(x), self.p, training=False)

    model = Off()

    def script():
        model.train()
        model(torch.randn(2, 4)).sum().backward()
        model.eval()
        model(torch.randn(2, 4)).sum().backward()

    trace = record(script)
    assert of(trace, "mode_forward") == [] and of(trace, "mode_module") == []
    assert all(e["modules"] == [] for e in of(trace, "train", "eval"))
