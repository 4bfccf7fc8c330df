"""train-in-eval-mode (GD302) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

import pytest

from graddoctor.analysis import Analysis
from graddoctor.rules.train_in_eval_mode import TrainInEvalMode
from graddoctor.trace import Trace
from mode_traces import bn, check, end, fwd, mode_set, new, update


def dropout(t, mid, p=0.5, model=None):
    return t.trace.add("mode_module", None, mid=mid, name=f"model.drop{mid}", cls="Dropout",
                       layer="dropout", has_params=False, frozen=None, owned=None, trainable=None,
                       updated=False, track_running_stats=None, momentum=None, p=p, freeze=None,
                       **({"model": model} if model is not None else {}))


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


def test_dropout_of_a_model_no_optimizer_trains_is_silent():
    """A steering vector or soft prompt optimised through a frozen model kept in eval mode: the
    instrumentation names the model holding the dropout layer, whose parameters no optimizer
    trains, and the gradient that flows through it trains something else."""
    t = new()
    validation_then_training(t, model="lm")
    assert check(TrainInEvalMode, t) == []


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


def test_rules_work_on_a_trace_read_back_from_json():
    t = new()
    validation_then_training(t)
    trace = Trace.loads(t.trace.dumps())
    assert [f.location.line for f in TrainInEvalMode().check(Analysis(trace))] == [7]


def test_eval_on_a_trained_part_gives_both_readings():
    t = new()
    mode_set(t, True, [0, 1], line=2)
    bn(t, 0)  # the backbone's layer: owned by the optimizer, trainable
    bn(t, 1, name="model.head.bn")
    mode_set(t, False, [0], line=3)  # model.backbone.eval(), no freeze
    for _ in range(2):
        fwd(t, [0], line=4, training=False)
        fwd(t, [1], line=4)
        update(t, line=5)
    end(t)
    (finding,) = check(TrainInEvalMode, t)
    assert finding.location.line == 3 and finding.evidence["reading"] == "freeze-or-train"
    assert "does not freeze" in finding.message and "optimizer still steps" in finding.message
    assert "requires_grad_(False)" in finding.fix and "remove this eval()" in finding.fix
    t = new()  # the whole model left in eval: the plain message and fix
    validation_then_training(t)
    (finding,) = check(TrainInEvalMode, t)
    assert "reading" not in finding.evidence and finding.fix == TrainInEvalMode.fix


def test_eval_on_a_named_part_says_it_freezes_nothing_even_when_the_rest_has_no_batchnorm(tmp_path):
    # model.backbone.eval() to freeze the backbone; the head has no BatchNorm or dropout, so the
    # layers the forward runs are all under the eval(): the receiver's name says it is a part
    from graddoctor.trace import TraceBuilder
    path = tmp_path / "train.py"
    path.write_text("model.train()\nmodel.backbone.eval()\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, [0])
    mode_set(t, True, [0], line=1)
    bn(t, 0)
    mode_set(t, False, [0], line=2)
    for _ in range(2):
        fwd(t, [0], line=4, training=False)
        update(t, line=5)
    end(t)
    (finding,) = check(TrainInEvalMode, t)
    assert finding.location.line == 2 and "does not freeze model.backbone" in finding.message
    assert finding.fix.startswith("to freeze it: model.backbone.requires_grad_(False)")
    path.write_text("model.train()\nmodel.eval()\n")  # the whole model: the plain message
    (finding,) = check(TrainInEvalMode, t)
    assert "reading" not in finding.evidence


def test_a_frozen_eval_whose_batchnorm_was_unfrozen_and_is_stepped_is_reported():
    """model.requires_grad_(False); model.eval(); head.requires_grad_(True): the eval() found
    everything frozen, but the BatchNorm trains at the forward (requires grad, owned)."""
    t = new()
    validation_then_training(t, frozen=True, layer="batchnorm")
    (finding,) = check(TrainInEvalMode, t)
    assert finding.location.line == 7 and finding.evidence["reading"] == "unfrozen"
    assert "unfrozen afterwards" in finding.message and ".train()" in finding.fix


@pytest.mark.parametrize("state", [dict(trainable=False),  # still frozen
                                   dict(owned=False)])  # requires grad, but no optimizer steps it
def test_a_frozen_eval_stays_silent_while_its_batchnorm_does_not_train(state):
    t = new()
    validation_then_training(t, frozen=True, layer="batchnorm", **state)
    assert check(TrainInEvalMode, t) == []


def _eval_forward_then_train(rerun: bool):
    """eval() (line 3), a grad-enabled forward (4), train() (5), optionally the same layers run
    again in training mode (6), then the backward and step (7, 8)."""
    t = new()
    dropout(t, 0)
    for _ in range(2):
        mode_set(t, False, [0], line=3)
        fwd(t, [0], line=4, training=False)
        mode_set(t, True, [0], line=5)
        if rerun:
            fwd(t, [0], line=6)
        update(t, line=7)
    end(t, "step-limit")
    return check(TrainInEvalMode, t)


def test_an_eval_undone_after_the_training_forward_is_reported_without_an_edit():
    (finding,) = _eval_forward_then_train(rerun=False)
    assert finding.location.line == 3 and "undone only after the training forward" in finding.message
    assert finding.evidence["reading"] == "undone-late" and "before the training forward" in finding.fix


def test_a_pass_in_eval_mode_followed_by_a_training_forward_is_left_alone():
    assert _eval_forward_then_train(rerun=True) == []  # an attack's input gradient, then training
