"""batchnorm-keras-arguments (GD307): the registration hook's norm_arguments events, and the
rule over hand-written traces."""

from __future__ import annotations

import pytest
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.registration import _keras_arguments
from rule_traces import builder, findings, only, plain_update

SLUG = "batchnorm-keras-arguments"


@pytest.mark.parametrize("norm, keras", [
    (nn.BatchNorm1d(4, 0.8), True),  # Keras' momentum as eps
    (nn.BatchNorm2d(4, momentum=0.99), True),
    (nn.BatchNorm2d(4, momentum=0.9), True),
    (nn.SyncBatchNorm(4, eps=0.5), True),
    (nn.BatchNorm2d(4), False),
    (nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), False),
    (nn.BatchNorm2d(4, momentum=None), False),
    (nn.BatchNorm2d(4, momentum=1.0), False),  # batch statistics on purpose
    (nn.BatchNorm2d(4, momentum=0.99, track_running_stats=False), False),
    (nn.BatchNorm2d(4, eps=0.05), False),
])
def test_keras_arguments(norm, keras):
    assert _keras_arguments(norm) is keras


def _recorded(build):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        build()
    return [e for e in rec.trace if e.kind == "norm_arguments"]


def test_the_registration_hook_records_keras_arguments_at_the_users_line():
    found = _recorded(lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, 0.8), nn.ReLU(),
                                            nn.BatchNorm1d(4), nn.BatchNorm1d(4, momentum=0.99)))
    assert [(e["cls"], e["eps"], e["momentum"]) for e in found] == [
        ("BatchNorm1d", 0.8, 0.1), ("BatchNorm1d", 1e-5, 0.99)]
    assert all(e.loc.path.endswith("test_rule_batchnorm_keras_arguments.py") for e in found)
    assert len(found[0]["params"]) == 2  # weight and bias, tracked


def test_norms_a_library_builds_are_not_recorded():
    assert _recorded(lambda: nn.TransformerEncoderLayer(8, 2)) == []


def _trace(eps=0.8, momentum=0.1, steps=True):
    t = builder()
    t.put(ev.norm_arguments(cls="BatchNorm2d", eps=eps, momentum=momentum, params=[0, 1]), 5)
    if steps:
        plain_update(t)
    return t


def test_eps_from_a_keras_momentum_is_a_warning_with_the_meant_momentum():
    f = only(_trace(), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 5
    assert "eps=0.8" in f.message and "momentum=0.2" in f.fix


def test_a_keras_momentum_says_how_pytorch_weighs_it():
    f = only(_trace(eps=1e-5, momentum=0.99), SLUG)
    assert "momentum=0.99" in f.message and "momentum=0.01" in f.fix


def test_silent_without_training():
    assert findings(_trace(steps=False), SLUG) == []
