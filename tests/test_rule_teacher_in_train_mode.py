"""teacher-in-train-mode (GD306) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on; then in-process, the mode watcher and the rule together on a
distillation loop and a Mean Teacher."""

from __future__ import annotations

import pytest

from graddoctor.events import MODEL_STATIC_AFTER
from graddoctor.findings import Role, Severity
from graddoctor.rules.teacher_in_train_mode import TeacherInTrainMode
from mode_traces import bn, check, drop, end, fwd, mode_set, new, update

TEACHER, STUDENT = 1, 0  # the mids of the teacher's and the student's dropout layers


def distillation(t, teacher_fwd=None, steps=3, **teacher_facts):
    """A distillation loop: the teacher's no-grad forward (line 3), the student's training
    forward (line 4), backward and step (5, 6), ``steps`` times."""
    drop(t, STUDENT, name="student.2")
    drop(t, TEACHER, name="teacher.2", **{"model": "teacher", **teacher_facts})
    for _ in range(steps):
        if teacher_fwd is None:
            fwd(t, [TEACHER], line=3, grad=False)
        else:
            teacher_fwd(t)
        fwd(t, [STUDENT], line=4)
        update(t, line=5)


def test_a_static_teacher_in_train_mode_is_reported_at_its_forward():
    t = new()
    distillation(t, unchanged=MODEL_STATIC_AFTER)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert finding.location.line == 3 and finding.severity is Severity.WARNING
    assert "teacher.2" in finding.message and "fresh random dropout mask" in finding.message
    assert f"unchanged over {MODEL_STATIC_AFTER} optimizer steps" in finding.message
    assert finding.fix.startswith("call teacher.eval()")
    assert finding.evidence["model"] == "teacher" and finding.step == 1
    assert [r.location.line for r in finding.related if Role.STEP in r.roles] == [6]


@pytest.mark.parametrize("unchanged, says", [
    (1, "only 1 step before the run ended"),
    (MODEL_STATIC_AFTER - 1, f"only {MODEL_STATIC_AFTER - 1} steps"),
    (0, "the run ended before a later step could tell"),
])
def test_a_teacher_watched_over_too_few_steps_is_info_saying_why(unchanged, says):
    t = new()
    distillation(t, unchanged=unchanged)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert finding.severity is Severity.INFO and says in finding.message


def test_the_latest_facts_of_the_model_count():
    # seen unchanged once, then again later: the final facts say static
    t = new()
    distillation(t, unchanged=1)
    drop(t, TEACHER, name="teacher.2", model="teacher", unchanged=MODEL_STATIC_AFTER)
    fwd(t, [TEACHER], line=3, grad=False)
    fwd(t, [STUDENT], line=4)
    update(t, line=5)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert finding.severity is Severity.WARNING


def test_the_teacher_pass_inside_the_training_forward_and_the_train_call_that_undoes_its_eval():
    # Distiller.forward: the teacher under no_grad, then the student; distiller.train() every
    # epoch covers the teacher's dropout and the student's
    t = new()
    drop(t, STUDENT, name="distiller.student.2")
    drop(t, TEACHER, name="distiller.teacher.2", model="distiller.teacher", unchanged=MODEL_STATIC_AFTER)
    mode_set(t, True, [STUDENT, TEACHER], line=2)
    for _ in range(3):
        fwd(t, [TEACHER], line=7, grad=False, nested=True)
        fwd(t, [STUDENT], line=7)
        update(t, line=8)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert finding.location.line == 7 and finding.message.startswith("inside this forward, distiller.teacher")
    assert "distiller.teacher.eval() right after the train() at line 2" in finding.fix
    assert [r.location.line for r in finding.related if Role.TRAIN_CALL in r.roles] == [2]


def test_its_batchnorm_layers_are_named_too():
    t = new()
    bn(t, 5, name="teacher.1", owned=False, frozen=True, trainable=False)

    def both(t):
        fwd(t, [5, TEACHER], line=3, grad=False)

    distillation(t, both, unchanged=MODEL_STATIC_AFTER)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert "running statistics" in finding.message and "teacher.1" in finding.message


def test_inference_mode_is_named():
    t = new()
    distillation(t, lambda t: fwd(t, [TEACHER], line=3, grad=False, inference=True), unchanged=3)
    end(t)
    (finding,) = check(TeacherInTrainMode, t)
    assert "torch.inference_mode()" in finding.message


@pytest.mark.parametrize("case", [
    # an EMA / momentum teacher: its parameters changed between two of its forwards
    lambda t: (distillation(t, changed=True), end(t)),
    # in eval mode
    lambda t: (distillation(t, lambda t: fwd(t, [TEACHER], line=3, training=False, grad=False),
                            unchanged=3), end(t)),
    # no untrained model holds the layer (the student's, run under no_grad for pseudo-labels)
    lambda t: (distillation(t, model=None), end(t)),
    # dropout with p=0
    lambda t: (distillation(t, p=0.0, unchanged=3), end(t)),
    # a gradient flows through the layer in another forward: a model that trains (R-Drop, UDA)
    lambda t: (distillation(t, lambda t: (fwd(t, [TEACHER], line=3, grad=False),
                                          fwd(t, [TEACHER], line=8)), unchanged=3), end(t)),
    # its BatchNorm layers' weights are updated by hand: an EMA copy
    lambda t: (bn(t, 5, owned=False, updated=True),
               distillation(t, lambda t: fwd(t, [5, TEACHER], line=3, grad=False), unchanged=3), end(t)),
])
def test_silent_on(case):
    t = new()
    case(t)
    assert check(TeacherInTrainMode, t) == []


@pytest.mark.parametrize("calls", [1, 10])
def test_monte_carlo_dropout_outside_the_update_is_silent(calls):
    # an untrained-looking model (no optimizer owns what graddoctor saw) sampled in train mode
    # under no_grad between epochs and after training: no backward follows
    t = new()
    drop(t, TEACHER, name="model.2", model="model", unchanged=MODEL_STATIC_AFTER)
    for epoch in range(2):
        fwd(t, [STUDENT], line=4)
        update(t, line=5)
        fwd(t, [TEACHER], line=9, grad=False, calls=calls)
        t.event("epoch_start", 3, loader=0, epoch=epoch + 1, real_len=3, replay_len=3)
    fwd(t, [TEACHER], line=12, grad=False, calls=calls)
    end(t)
    assert check(TeacherInTrainMode, t) == []


# -- in-process: the watcher's facts and the rule ------------------------------------------------
def run_rule(script):
    from graddoctor.analysis import Analysis
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        script()
    return list(TeacherInTrainMode().check(Analysis(rec.trace)))


def loop(ema: bool):
    import copy

    import torch
    from torch import nn
    import torch.nn.functional as F

    def script():
        torch.manual_seed(0)
        student = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
        teacher = copy.deepcopy(student) if ema else nn.Sequential(
            nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
        teacher.requires_grad_(False)
        optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
        x = torch.randn(16, 6)
        for _ in range(5):
            with torch.no_grad():
                soft = F.softmax(teacher(x), dim=1)
            loss = F.kl_div(F.log_softmax(student(x), dim=1), soft, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if ema:  # the Mean Teacher paper's update, through .data
                for t, s in zip(teacher.parameters(), student.parameters()):
                    t.data.mul_(0.9).add_(s.data, alpha=0.1)

    return script


def test_in_process_a_frozen_teacher_is_reported_and_a_mean_teacher_is_not():
    (finding,) = run_rule(loop(ema=False))
    assert finding.severity is Severity.WARNING and finding.evidence["model"] == "teacher"
    assert finding.evidence["unchanged_steps"] == MODEL_STATIC_AFTER
    assert run_rule(loop(ema=True)) == []
