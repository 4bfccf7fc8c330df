"""The train/eval-mode rules on hand-written traces (no torch)."""

from __future__ import annotations

import pytest

from graddoctor.analysis import Analysis
from graddoctor.rules.eval_in_train_mode import EvalInTrainMode
from graddoctor.rules.frozen_bn_train_mode import FrozenBnTrainMode
from graddoctor.rules.train_in_eval_mode import TrainInEvalMode
from graddoctor.trace import Trace, TraceBuilder

RULES = (FrozenBnTrainMode, TrainInEvalMode, EvalInTrainMode)


# -- trace helpers ----------------------------------------------------------------------
def bn(t, mid, name=None, **kw):
    data = dict(mid=mid, name=name or f"model.bn{mid}", cls="BatchNorm2d", layer="batchnorm",
                has_params=True, frozen=False, owned=True, trainable=True, updated=False,
                track_running_stats=True, momentum=0.1, p=None, freeze=None)
    data.update(kw)
    return t.trace.add("mode_module", None, **data)


def dropout(t, mid, p=0.5):
    return t.trace.add("mode_module", None, mid=mid, name=f"model.drop{mid}", cls="Dropout",
                       layer="dropout", has_params=False, frozen=None, owned=None, trainable=None,
                       updated=False, track_running_stats=None, momentum=None, p=p, freeze=None)


def mode_set(t, mode, modules, line, leaf=False, frozen=False):
    return t.event("train" if mode else "eval", line, mode=mode, leaf=leaf, root="Sequential", frozen=frozen,
                   modules=list(modules), calls=1)


def fwd(t, modules, line, training=True, grad=True, inference=False, grad_modules=None, calls=1,
        recalibrating=False):
    if grad_modules is None:
        grad_modules = modules if grad and not inference else []
    return t.event("mode_forward", line, training=training, grad=grad, inference=inference,
                   modules=list(modules), grad_modules=list(grad_modules), calls=calls,
                   recalibrating=recalibrating)


def update(t, pids=(0,), line=None):
    t.backward(fresh=list(pids), line=line)
    t.step(0, line=None if line is None else line + 1)


def end(t, status="completed"):
    t.trace.add("run_end", None, status=status, steps=0)


def check(rule, t):
    return list(rule().check(Analysis(t.trace)))


def lines(findings):
    return sorted(f.location.line for f in findings)


def new():
    t = TraceBuilder()
    t.optimizer(0, [0])
    return t


# -- frozen-bn-train-mode ---------------------------------------------------------------
def test_frozen_bn_points_at_train_call_with_freeze_related():
    t = new()
    freeze = t.event("freeze", 5, calls=4)
    for epoch in range(2):
        mode_set(t, True, [0, 1], line=10)
        bn(t, 0, frozen=True, owned=False, trainable=False, freeze=freeze.seq)
        bn(t, 1)  # a trained BatchNorm: fine
        fwd(t, [0, 1], line=12)
        update(t, line=13)
    end(t)
    (finding,) = check(FrozenBnTrainMode, t)
    assert finding.location.line == 10
    assert finding.rule == "frozen-bn-train-mode" and finding.severity.value == "warning"
    assert [r.location.line for r in finding.related] == [5, 12]
    assert finding.evidence["layers"] == ["model.bn0"]
    assert finding.step == 1
    assert "frozen" in finding.message


def test_frozen_bn_without_train_call_points_at_forward():
    t = new()
    bn(t, 0, frozen=True, owned=False, trainable=False)
    fwd(t, [0], line=20, grad_modules=[])
    update(t, line=21)
    end(t)
    assert lines(check(FrozenBnTrainMode, t)) == [20]


def test_bn_owned_by_no_optimizer_is_reported():
    t = new()
    mode_set(t, True, [0], line=3)
    bn(t, 0, owned=False)  # trainable, but no optimizer steps it
    fwd(t, [0], line=4)
    update(t, line=5)
    end(t)
    (finding,) = check(FrozenBnTrainMode, t)
    assert finding.location.line == 3 and "no optimizer" in finding.message


@pytest.mark.parametrize("state", [
    dict(frozen=True, owned=False, trainable=False, track_running_stats=False),  # nothing drifts
    dict(frozen=True, owned=False, trainable=False, momentum=None),  # cumulative average on purpose
    dict(frozen=True, owned=False, trainable=False, updated=True),  # EMA / momentum encoder
    dict(frozen=False, owned=True),  # trained normally
    dict(has_params=False, frozen=None, owned=None, trainable=None),  # affine=False: cannot tell
])
def test_frozen_bn_silent_on(state):
    t = new()
    mode_set(t, True, [0], line=3)
    bn(t, 0, **state)
    fwd(t, [0], line=4)
    update(t, line=5)
    end(t)
    assert check(FrozenBnTrainMode, t) == []


def test_frozen_bn_silent_in_eval_mode_and_outside_training():
    t = new()
    mode_set(t, True, [0], line=3)
    mode_set(t, False, [0], line=4, leaf=True)  # the frozen-BN idiom
    bn(t, 0, frozen=True, owned=False, trainable=False)
    fwd(t, [0], line=5, training=False, grad_modules=[])
    update(t, line=6)
    mode_set(t, True, [0], line=8)
    fwd(t, [0], line=9, grad=False, calls=3)  # a validation loop: eval-in-train-mode's business
    t.event("epoch_start", 10, loader=0, epoch=1, real_len=4, replay_len=4)
    end(t)
    assert check(FrozenBnTrainMode, t) == []


def test_ema_flag_seen_later_still_silences_earlier_forwards():
    t = new()
    bn(t, 0, frozen=True, owned=False, trainable=False)
    fwd(t, [0], line=4, grad=False)  # teacher targets inside the update
    fwd(t, [1], line=5)
    update(t, line=6)
    bn(t, 0, frozen=True, owned=False, trainable=False, updated=True)
    fwd(t, [0], line=4, grad=False)
    update(t, line=6)
    end(t)
    assert check(FrozenBnTrainMode, t) == []


def test_layer_frozen_only_for_the_other_models_step_is_silent():
    """pix2pix: set_requires_grad(netD, False) while G steps; D trains in between."""
    t = new()
    for _ in range(2):
        bn(t, 0, frozen=False, trainable=True)
        fwd(t, [0], line=4)
        update(t, line=5)
        bn(t, 0, frozen=True, trainable=False)
        fwd(t, [0], line=8, grad_modules=[0])
        update(t, line=9)
    end(t)
    assert check(FrozenBnTrainMode, t) == []


def test_frozen_bn_silent_when_no_step_follows():
    t = new()
    bn(t, 0, frozen=True, owned=False, trainable=False)
    fwd(t, [0], line=4)
    t.backward(fresh=[0], line=5)
    end(t)
    assert check(FrozenBnTrainMode, t) == []


# -- train-in-eval-mode -----------------------------------------------------------------
def validation_then_training(t, leaf=False, frozen=False, retrain=False, grad_modules=None, layer="dropout",
                             **state):
    mode_set(t, True, [0], line=2)
    (dropout(t, 0, **state) if layer == "dropout" else bn(t, 0, **state))
    fwd(t, [0], line=4)
    update(t, line=5)
    mode_set(t, False, [0], line=7, leaf=leaf, frozen=frozen)
    fwd(t, [0], line=9, training=False, grad=False, calls=2)
    if retrain:
        mode_set(t, True, [0], line=10)
    fwd(t, [0], line=4, training=retrain, grad_modules=grad_modules)
    update(t, line=5)
    end(t, "step-limit")


def test_train_in_eval_points_at_eval_call():
    t = new()
    validation_then_training(t)
    (finding,) = check(TrainInEvalMode, t)
    assert finding.location.line == 7
    assert finding.step == 2
    assert [r.location.line for r in finding.related] == [4, 6]
    assert "dropout is off" in finding.message


@pytest.mark.parametrize("kw", [
    dict(retrain=True),  # model.train() after validation
    dict(leaf=True),  # one layer set to eval on purpose
    dict(frozen=True),  # eval() on a frozen part that gradients pass through (adapters, prompts)
    dict(grad_modules=[]),  # no gradient flows through it (frozen part)
    dict(p=0.0),  # dropout that drops nothing
    dict(layer="batchnorm", track_running_stats=False),  # eval == train for it
])
def test_train_in_eval_silent_on(kw):
    t = new()
    validation_then_training(t, **kw)
    assert check(TrainInEvalMode, t) == []


def test_teacher_in_eval_under_no_grad_is_silent():
    t = new()
    mode_set(t, False, [0], line=3)  # teacher.eval()
    bn(t, 0, frozen=False, owned=False)
    bn(t, 1)
    mode_set(t, True, [1], line=4)  # student.train()
    fwd(t, [0], line=6, training=False, grad=False)
    fwd(t, [1], line=7)
    update(t, line=8)
    end(t)
    assert check(TrainInEvalMode, t) == []
    assert check(EvalInTrainMode, t) == []
    assert check(FrozenBnTrainMode, t) == []


def test_train_in_eval_one_finding_per_eval_call():
    t = new()
    mode_set(t, False, [0, 1], line=3)
    bn(t, 0)
    dropout(t, 1)
    for _ in range(3):
        fwd(t, [0, 1], line=6, training=False)
        update(t, line=7)
    end(t)
    (finding,) = check(TrainInEvalMode, t)
    assert finding.evidence["kinds"] == ["batchnorm", "dropout"]
    assert finding.step == 1


# -- eval-in-train-mode -----------------------------------------------------------------
def test_validation_loop_without_eval_is_reported():
    t = new()
    mode_set(t, True, [0], line=2)
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    t.event("epoch_start", 6, loader=1, epoch=0, real_len=3, replay_len=3)
    fwd(t, [0], line=8, grad=False, calls=3)
    t.event("epoch_start", 3, loader=0, epoch=1, real_len=4, replay_len=4)
    fwd(t, [0], line=4)
    end(t, "step-limit")
    (finding,) = check(EvalInTrainMode, t)
    assert finding.location.line == 8
    assert [r.location.line for r in finding.related] == [2]
    assert "torch.no_grad()" in finding.message and finding.step == 1


def test_single_inference_mode_forward_before_next_epoch_is_reported():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=8, grad=False, inference=True)
    t.event("epoch_start", 3, loader=0, epoch=1, real_len=4, replay_len=4)
    end(t)
    (finding,) = check(EvalInTrainMode, t)
    assert finding.location.line == 8 and "inference_mode" in finding.message


def test_validation_loop_inside_batch_loop_is_reported_even_with_backward_after():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=9, grad=False, calls=2)
    t.clear([0], line=3)
    fwd(t, [0], line=4)
    update(t, line=5)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [9]


def test_forward_at_the_end_of_a_completed_run_is_reported():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=20, grad=False)
    end(t, "completed")
    assert lines(check(EvalInTrainMode, t)) == [20]


def no_grad_forward_then(t, tail):
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    tail(t)


@pytest.mark.parametrize("tail", [
    # GAN discriminator step: fakes drawn under no_grad, then D's forward, backward, step
    lambda t: (fwd(t, [0], line=8, grad=False), fwd(t, [1], line=9), update(t, line=10), end(t)),
    # no-grad forward between backward and step (metrics on the batch)
    lambda t: (t.backward(fresh=[0], line=7), fwd(t, [0], line=8, grad=False), t.step(0, line=9), end(t)),
    # the replay was cut before anything told what the forward was for
    lambda t: (fwd(t, [0], line=8, grad=False), end(t, "step-limit")),
    # swa_utils.update_bn
    lambda t: (t.event("update_bn", 8), fwd(t, [0], line=8, grad=False, calls=4, recalibrating=True),
               end(t)),
    # recalibration by hand after reset_running_stats()
    lambda t: (t.event("bn_reset", 8, modules=[0], calls=1), fwd(t, [0], line=10, grad=False, calls=4),
               end(t)),
    # momentum=None: a cumulative average on purpose
    lambda t: (bn(t, 0, momentum=None), fwd(t, [0], line=10, grad=False, calls=4), end(t)),
    # track_running_stats=False
    lambda t: (bn(t, 0, track_running_stats=False), fwd(t, [0], line=10, grad=False, calls=4), end(t)),
    # validation in eval mode
    lambda t: (mode_set(t, False, [0], line=7), fwd(t, [0], line=8, training=False, grad=False, calls=3),
               end(t)),
    # a grad-enabled forward outside the update is not a no-grad pass
    lambda t: (fwd(t, [0], line=8, calls=3), end(t)),
])
def test_eval_in_train_silent_on(tail):
    t = new()
    no_grad_forward_then(t, tail)
    assert check(EvalInTrainMode, t) == []


def test_reset_before_an_earlier_step_does_not_silence_later_validation():
    t = new()
    bn(t, 0)
    t.event("bn_reset", 2, modules=[0], calls=1)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=8, grad=False, calls=2)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [8]


# -- shared ------------------------------------------------------------------------------
def test_no_mode_events_no_findings():
    t = new()
    mode_set(t, False, [], line=3)  # a model without BatchNorm or dropout
    update(t, line=4)
    end(t)
    for rule in RULES:
        assert check(rule, t) == []


def test_module_facts_later_in_the_same_window_are_used():
    """The watcher emits ``mode_module`` for a layer first seen in the middle of a forward after
    the aggregated ``mode_forward`` event: the timeline must still resolve it."""
    t = new()
    bn(t, 0)
    fwd(t, [0, 1], line=4)
    bn(t, 1, frozen=True, owned=False, trainable=False)
    update(t, line=5)
    end(t)
    (forward,) = Analysis(t.trace).modes.forwards
    assert forward.states[1]["frozen"] is True
    assert lines(check(FrozenBnTrainMode, t)) == [4]


def test_rules_work_on_a_trace_read_back_from_json():
    t = new()
    validation_then_training(t)
    trace = Trace.loads(t.trace.dumps())
    assert [f.location.line for f in TrainInEvalMode().check(Analysis(trace))] == [7]


@pytest.mark.parametrize("rule", RULES)
def test_rule_docs_have_the_four_sections(rule):
    for title in ("What it does", "Why is this bad?", "Example", "Use instead"):
        assert rule.doc_section(title), f"{rule.slug}: missing '{title}'"
    assert rule.code.startswith("GD3") and rule.fix and rule.summary
