"""frozen-bn-train-mode (GD301) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

import pytest

from graddoctor.analysis import Analysis
from graddoctor.rules.frozen_bn_train_mode import FrozenBnTrainMode
from mode_traces import bn, check, end, fwd, lines, mode_set, new, update


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


def test_frozen_bn_without_train_call_points_at_its_freeze():
    # `vgg.requires_grad_(False)` and nothing ever calls vgg.eval(): eval() belongs at the freeze
    t = new()
    freeze = t.event("freeze", 7, calls=4)
    bn(t, 0, name="vgg.bn0", frozen=True, owned=False, trainable=False, freeze=freeze.seq)
    for _ in range(2):
        fwd(t, [0], line=20, grad_modules=[])
        fwd(t, [0], line=22, grad=False)
        update(t, line=24)
    end(t)
    (finding,) = check(FrozenBnTrainMode, t)
    assert finding.location.line == 7
    assert [r.location.line for r in finding.related] == [7, 20]
    assert "this freezes a BatchNorm layer (vgg.bn0)" in finding.message
    assert "right after freezing" in finding.fix
