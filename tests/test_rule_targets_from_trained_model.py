"""targets-from-trained-model (GD184): hand-written ``model_copy`` events, each condition of
the rule taken away in turn."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "targets-from-trained-model"
FOLLOWS = [[2, 0.01, 1.0, False], [3, 0.01, 1.0, False], [4, 0.01, 1.0, False]]


def _trace(copy="q1_t", model="q1", equal=True, written=True, forwards=0, model_targets=5,
           at=("train.py", 21), follows=FOLLOWS, twin=False):
    t = TraceBuilder("train.py")
    t.optimizer(0, P, line=4)
    for _ in range(6):
        t.backward(fresh=P, line=30)
        t.step(line=30)
    for name in (copy, "q2_t") if twin else (copy,):
        t.put(ev.model_copy(copy=name, model=model, opt=0, params=4, equal=equal, forwards=forwards,
                            targets=forwards, written=written, written_step=2, measured=5, pulls=[],
                            follows=[list(r) for r in follows], model_targets=model_targets,
                            model_target_at=list(at) if at else None), 21)
    return t


def test_a_target_copy_kept_in_step_and_never_called_is_a_warning_where_the_model_makes_targets():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING
    assert (f.location.path, f.location.line) == ("train.py", 21)
    assert "q1_t" in f.message and "call q1_t here" in f.fix


def test_twin_copies_read_at_one_line_make_one_finding():
    assert len(findings(_trace(twin=True), SLUG)) == 1


def test_each_condition_is_needed():
    assert findings(_trace(forwards=2), SLUG) == []  # the copy is called
    assert findings(_trace(written=False), SLUG) == []  # never updated: copy-never-follows
    assert findings(_trace(equal=False), SLUG) == []  # not a copy of the model
    assert findings(_trace(model_targets=1), SLUG) == []
    assert findings(_trace(at=None), SLUG) == []
    assert findings(_trace(follows=FOLLOWS[:1]), SLUG) == []


def test_averages_kept_to_evaluate_and_unnamed_copies_stay_silent():
    for name in ("ema_model", "swa_model", "model_avg", "shadow", "ref_model", "frozen_copy", "net2"):
        assert findings(_trace(copy=name), SLUG) == [], name
    for name in ("target_net", "q_tgt", "actor_t", "key_encoder", "momentum_encoder", "teacher"):
        assert len(findings(_trace(copy=name), SLUG)) == 1, name
