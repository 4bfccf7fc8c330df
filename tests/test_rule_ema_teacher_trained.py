"""ema-teacher-trained (GD111): the rule on hand-written traces, and the instrumentation's
``step_begin.edited_params`` signal (parameters changed in place between two steps) on real
optimizers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules.ema_teacher_trained import EmaTeacherTrained
from graddoctor.trace import TraceBuilder

STUDENT, TEACHER = [0, 1, 2, 3], [4, 5, 6, 7]
SHAPES = [[8, 4], [8], [2, 8], [2]] * 2


def findings(t: TraceBuilder):
    return list(EmaTeacherTrained().check(Analysis(t.trace)))


def build(params=STUDENT + TEACHER, shapes=SHAPES):
    t = TraceBuilder()
    for pid, shape in zip(params, shapes):
        t.param(pid, f"{'student' if pid in STUDENT else 'teacher'}.p{pid}", shape=shape)
    t.optimizer(0, list(params), line=5, cls="AdamW")
    return t


def update(t, edited=(), params=STUDENT + TEACHER, opt=0, without=(), closure=False):
    """zero_grad (20), backward (21), step_begin + step (22)."""
    t.clear(params, opt=opt, line=20)
    t.backward(fresh=[p for p in params if p not in without], line=21)
    t.put(ev.step_begin(opt=opt, norm_pids=None, norms=None, closure=closure,
                        edited_params=list(edited)), 22)
    return t.step(opt, line=22, without_grad=list(without), closure=closure)


def test_a_teacher_stepped_and_overwritten_is_reported_at_the_optimizer():
    t = build()
    for edited in ((), TEACHER, TEACHER, TEACHER):
        update(t, edited)
    (f,) = findings(t)
    assert (f.location.line, f.severity, f.step) == (5, Severity.WARNING, 1)
    assert [r.location.line for r in f.related] == [22]
    assert "teacher.p4" in f.message and "no longer an average" in f.message
    assert f.evidence["edited"] == 4 and f.evidence["student_params"] == 4


def test_one_edit_is_not_enough():
    t = build()
    for edited in ((), TEACHER, (), TEACHER):  # never two updates in a row (a resume, Lookahead k=2)
        update(t, edited)
    assert findings(t) == []


def test_a_single_edited_param_is_a_projection():
    t = build()
    for edited in ((), [5], [5], [5]):
        update(t, edited)
    assert findings(t) == []


def test_edited_params_without_a_twin_are_clipping():
    # a WGAN critic clipped in place: its optimizer holds nothing else, so no untouched copy
    t = build(params=TEACHER, shapes=SHAPES[4:])
    for edited in ((), TEACHER, TEACHER, TEACHER):
        update(t, edited, params=TEACHER)
    assert findings(t) == []


def test_the_twin_is_a_multiset():
    # two edited [8] biases need two untouched [8] params, not one
    shapes = [[8, 4], [8], [3, 3], [2], [8, 4], [8], [8], [2]]
    t = build(shapes=shapes)
    for edited in ((), TEACHER, TEACHER):
        update(t, edited)
    assert findings(t) == []


def test_every_param_edited_is_lookahead():
    t = build()
    for edited in ((), STUDENT + TEACHER, STUDENT + TEACHER):
        update(t, edited)
    assert findings(t) == []


def test_closure_steps_and_old_traces_are_ignored():
    t = build()
    for _ in range(3):
        update(t, TEACHER, closure=True)
    assert findings(t) == []
    t = build()
    t.optimizer(0, STUDENT + TEACHER, line=5)
    for _ in range(3):
        t.put(("step_begin", {"opt": 0, "closure": False, "norm_pids": None, "norms": None,
                              "nonfinite": [], "frozen": []}), 22)  # written before edited_params
        t.step(0, line=22)
    assert findings(t) == []


def test_the_related_step_is_the_first_that_gives_the_teacher_a_gradient():
    t = build()
    update(t, (), without=TEACHER)
    for _ in range(3):
        update(t, TEACHER)
    (f,) = findings(t)
    assert f.step == 2


# -- the signal -----------------------------------------------------------------------------
def _loop(teacher_no_grad: bool, teacher_in_optimizer: bool, steps: int = 3, via_data=False):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        student = nn.Linear(4, 2)
        teacher = copy.deepcopy(student)
        params = [*student.parameters(), *teacher.parameters()] if teacher_in_optimizer \
            else list(student.parameters())
        opt = torch.optim.AdamW(params, lr=0.1)
        x = torch.randn(6, 4)
        for _ in range(steps):
            if teacher_no_grad:
                with torch.no_grad():
                    target = teacher(x)
            else:
                target = teacher(x)
            loss = (student(x) - target).pow(2).mean() + student(x).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for t, s in zip(teacher.parameters(), student.parameters()):
                    if via_data:
                        t.data.mul_(0.9).add_(s.data, alpha=0.1)
                    else:
                        t.mul_(0.9).add_(s, alpha=0.1)
    names = {e["pid"]: e["name"] for e in rec.trace.events if e.kind == "param"}
    begins = [e for e in rec.trace.events if e.kind == "step_begin"]
    return [[names[p] for p in b["edited_params"]] for b in begins], rec


def test_the_signal_sees_the_ema_of_a_teacher_in_the_optimizer():
    edited, rec = _loop(teacher_no_grad=False, teacher_in_optimizer=True)
    assert edited[0] == []  # nothing before the first step
    assert len(edited[1]) == 2 and len(edited[2]) == 2 and edited[1] == edited[2]
    assert list(EmaTeacherTrained().check(Analysis(rec.trace)))  # the student is its twin


def test_a_teacher_without_grads_is_not_checked():
    edited, rec = _loop(teacher_no_grad=True, teacher_in_optimizer=True)
    assert edited == [[], [], []]
    assert list(EmaTeacherTrained().check(Analysis(rec.trace))) == []


@pytest.mark.parametrize("via_data", [False, True])
def test_a_teacher_outside_the_optimizer_is_not_seen(via_data):
    edited, _ = _loop(teacher_no_grad=False, teacher_in_optimizer=False, via_data=via_data)
    assert edited == [[], [], []]


def test_the_optimizers_own_update_is_not_an_edit():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        for opt in (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                    torch.optim.Adam(model.parameters(), lr=0.1, foreach=False)):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(5, 3)).pow(2).mean().backward()
                opt.step()
    assert all(e["edited_params"] == [] for e in rec.trace.events if e.kind == "step_begin")
