"""optimizer-attribute-hyperparameter (GD113): on hand-written traces (no torch), and the
optimizer watcher's ``__setattr__`` in-process: what it records, what it leaves alone, that the
attribute is set exactly as without graddoctor, and that the patch goes on exit."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, fold_hard, only

SLUG = "optimizer-attribute-hyperparameter"


def attr(t, line=5, name="lr", key="lr", value=1e-3, kept=(0.1,), opt=0):
    return t.put(ev.optimizer_attr(opt=opt, cls="AdamW", name=name, key=key, value=value,
                                   kept=list(kept)), line)


def updates(t, n, opt=0):
    for _ in range(n):
        t.clear([0, 1], opt=opt, line=8)
        t.backward(fresh=[0, 1], line=9)
        t.step(opt, line=10)


def test_an_attribute_set_before_steps_is_a_warning_naming_the_value_kept():
    t = builder("AdamW")
    updates(t, 2)
    attr(t)
    updates(t, 3)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 5
    assert "AdamW keeps stepping with param_groups lr 0.1" in f.message
    assert "3 updates after it" in f.message
    assert 'group["lr"] = 0.001' in f.fix
    assert f.evidence["steps_after"] == 3 and f.related[0].location.line == 10


def test_the_alias_names_the_attribute_used_and_the_key_it_stands_for():
    t = builder("AdamW")
    attr(t, name="learning_rate", key="lr", value=None, kept=(0.1, 0.01))
    updates(t, 1)
    f = only(t, SLUG)
    assert "`.learning_rate`" in f.message and "lr 0.1 / 0.01" in f.message
    assert 'group["lr"] = ...' in f.fix and "1 update after it" in f.message


def test_a_group_value_on_a_device_is_not_read():
    t = builder("AdamW")
    attr(t, kept=(None,))
    updates(t, 1)
    assert "the lr in its param_groups" in only(t, SLUG).message


def test_silent_without_a_later_step_of_that_optimizer():
    t = builder("AdamW")
    updates(t, 2)
    attr(t)  # after the last step
    t.optimizer(1, [2], line=2, cls="SGD")
    updates(t, 2, opt=1)  # another optimizer steps
    assert findings(t, SLUG) == []


def test_skipped_steps_do_not_count():
    t = builder("AdamW")
    attr(t)
    t.backward(fresh=[0, 1], line=9)
    t.step(0, line=10, skipped=True)
    assert findings(t, SLUG) == []


def test_folded_updates_count_their_copies():
    t = builder("AdamW")
    attr(t)
    updates(t, 12)
    assert only(fold_hard(t.trace), SLUG).evidence["steps_after"] == 12


# -- the watcher, in-process -----------------------------------------------------------------

def record(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        fn()
    return [e for e in rec.trace if e.kind == "optimizer_attr"]


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


def test_the_watcher_records_the_users_assignment_once_per_line_and_sets_it():
    model = nn.Linear(3, 1)
    seen = {}

    def script():
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for i in range(3):
            opt.lr = 0.01 * (i + 1)  # mark: lr
        opt.learning_rate = 0.5  # mark: alias
        opt.momentum = 0.9  # what the groups hold already
        opt.name, opt.my_counter = "main", 1
        seen.update(lr=opt.lr, alias=opt.learning_rate, name=opt.name)

    made = record(script)
    assert seen == {"lr": 0.03, "alias": 0.5, "name": "main"}
    assert [(e["name"], e["key"], e["value"], e["kept"], e.loc.line) for e in made] == [
        ("lr", "lr", 0.01, [0.1], line_of("# mark: lr")),
        ("learning_rate", "lr", 0.5, [0.1], line_of("# mark: alias"))]
    assert made[0]["cls"] == "SGD"


class ReadsItsAttribute(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.lr = lr

    def step(self, closure=None):
        return None


class LrProperty(torch.optim.SGD):
    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        for group in self.param_groups:
            group["lr"] = value


def test_the_watcher_leaves_classes_that_give_the_attribute_a_meaning_alone():
    model = nn.Linear(3, 1)
    made = record(lambda: (setattr(ReadsItsAttribute(model.parameters(), 0.1), "lr", 0.5),
                           setattr(LrProperty(model.parameters(), lr=0.1), "lr", 0.5)))
    assert made == []


def test_the_watcher_leaves_an_assignment_made_by_library_code_alone():
    model = nn.Linear(3, 1)
    library_code = compile("opt.lr = 0.5", torch.__file__, "exec")  # a frame inside torch

    def script():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        exec(library_code, {"opt": opt})
        assert opt.lr == 0.5

    assert record(script) == []


def test_the_patch_is_gone_after_the_run():
    record(lambda: None)
    assert "__setattr__" not in torch.optim.Optimizer.__dict__


def test_the_fix_names_the_scripts_own_optimizer_variable(tmp_path):
    from graddoctor.analysis.source import assigned_object

    script = tmp_path / "train.py"
    script.write_text("opt = make()\nfor i in range(3):\n    opt.lr = 1e-3\n    state.opt.momentum = 0\n")
    assert assigned_object(str(script), 3, "lr") == "opt"
    assert assigned_object(str(script), 4, "momentum") == "state.opt"
    assert assigned_object(str(script), 1, "lr") is None  # no such assignment on that line


# -- the learning rate set as a scheduler's attribute ------------------------------------------

def scheduler_attr(t, scheduler="StepLR", line=5, value=1e-3, kept=(0.05,)):
    return t.put(ev.optimizer_attr(opt=0, cls="SGD", name="lr", key="lr", value=value,
                                   kept=list(kept), scheduler=scheduler), line)


def test_a_schedulers_lr_attribute_is_a_warning_with_a_fix_on_its_optimizers_groups():
    t = builder("SGD")
    scheduler_attr(t)
    updates(t, 2)
    f = only(t, SLUG)
    assert f.location.line == 5 and "on the StepLR scheduler" in f.message
    assert "SGD keeps stepping with the lr StepLR gives its param groups" in f.message
    assert "scheduler.optimizer.param_groups" in f.fix and f.evidence["scheduler"] == "StepLR"


def test_a_closed_form_scheduler_is_told_to_set_its_base_lrs():
    t = builder("SGD")
    scheduler_attr(t, scheduler="LambdaLR")
    updates(t, 1)
    assert "base_lrs = [0.001]" in only(t, SLUG).fix
    t = builder("SGD")
    scheduler_attr(t, scheduler="OneCycleLR")
    updates(t, 1)
    assert "build a new OneCycleLR" in only(t, SLUG).fix


class OwnScheduler(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, lr):
        self.lr = lr
        super().__init__(optimizer)

    def get_lr(self):
        return [self.lr for _ in self.optimizer.param_groups]


def test_the_scheduler_watcher_records_the_users_lr_attribute_and_leaves_its_own_classes_alone():
    model = nn.Linear(3, 1)
    seen = {}

    def script():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        sched.lr = 0.05  # mark: scheduler lr
        sched.learning_rate = 0.1  # what the groups hold already
        sched.note = "x"
        own = OwnScheduler(torch.optim.SGD(model.parameters(), lr=0.1), lr=0.2)
        own.lr = 0.3
        other = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        seen.update(lr=sched.lr, own=own.lr, missing=hasattr(other, "lr"))

    made = record(script)
    assert seen == {"lr": 0.05, "own": 0.3, "missing": False}
    assert [(e["scheduler"], e["cls"], e["value"], e["kept"], e.loc.line) for e in made] == [
        ("StepLR", "SGD", 0.05, [0.1], line_of("# mark: scheduler lr"))]


def test_the_scheduler_descriptors_are_gone_after_the_run():
    record(lambda: None)
    assert "lr" not in torch.optim.lr_scheduler.LRScheduler.__dict__
    assert "learning_rate" not in torch.optim.lr_scheduler.LRScheduler.__dict__


# -- writes into the optimizer's defaults ----------------------------------------------------

def test_a_write_into_defaults_is_a_warning_unless_a_group_is_added_after_it():
    t = builder("AdamW")
    updates(t, 2)
    attr(t, name='defaults["lr"]')
    updates(t, 3)
    f = only(t, SLUG)
    assert f.location.line == 5 and f.evidence["defaults"] is True
    assert "writes the AdamW optimizer's defaults" in f.message

    t = builder("AdamW")
    updates(t, 2)
    attr(t, name='defaults["lr"]')
    t.optimizer(0, [2], line=6)  # add_param_group: the new group takes the defaults' lr
    updates(t, 3)
    assert findings(t, SLUG) == []


def test_the_watcher_records_defaults_writes_and_keeps_the_attribute_check():
    import copy
    import pickle

    model = nn.Linear(3, 1)
    kept = {}

    def script():
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.defaults["lr"] = 0.01  # mark: defaults
        opt.defaults.update(momentum=0.5)  # mark: update
        opt.defaults["momentum"] = 0.5  # another line writing it: told there too
        opt.defaults["lr"] = 0.1  # what the groups hold: not told
        opt.lr = 0.02  # mark: attribute
        kept.update(copied=type(copy.deepcopy(opt.defaults)), shallow=type(copy.copy(opt.defaults)),
                    pickled=type(pickle.loads(pickle.dumps(opt.defaults))), opt=opt)

    made = record(script)
    assert [(e["name"], e["value"], e.loc.line) for e in made] == [
        ('defaults["lr"]', 0.01, line_of("# mark: defaults")),
        ('defaults["momentum"]', 0.5, line_of("# mark: update")),
        ('defaults["momentum"]', 0.5, line_of("another line writing it")),
        ("lr", 0.02, line_of("# mark: attribute"))]  # still seen with the defaults watched
    assert kept["copied"] is dict and kept["shallow"] is dict and kept["pickled"] is dict
    assert type(kept["opt"].defaults) is dict  # put back when the instrumentation is removed
    assert kept["opt"].defaults["lr"] == 0.1
