"""mixup-labels-unmixed (GD260): the ``mixup_unmixed`` events of instrument/batchpairs.py for a
model given a mixup of a batch's rows whose loss gets only the batch's labels, and the rule."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "mixup-labels-unmixed"


def _events(loss_of, features: int = 6):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        x_all = torch.randn(64, features)
        y_all = (x_all[:, 0] > 0).long()
        loader = DataLoader(TensorDataset(x_all, y_all), batch_size=8, shuffle=True)
        model = torch.nn.Linear(features, 2)
        for x, y in itertools.islice(loader, 3):
            loss_of(model, x, y).backward()
    return [(e["fn"], e["field"], e["rows"], e["lam"]) for e in rec.trace.of_kind("mixup_unmixed")]


def _mix(x, lam=0.7):
    perm = torch.arange(len(x)).roll(1)
    return perm, lam * x + (1 - lam) * x[perm]


def test_inputs_mixed_with_the_labels_unmixed_are_recorded():
    def unmixed(model, x, y):
        _, inputs = _mix(x)
        return F.cross_entropy(model(inputs), y)

    assert _events(unmixed) == [("cross_entropy", "[1]", 8, 0.7)]


def test_the_partner_first_is_recorded_too():
    def partner_first(model, x, y):
        perm = torch.arange(len(x)).roll(3)
        return F.cross_entropy(model(0.35 * x[perm] + 0.65 * x), y)

    assert [e[3] for e in _events(partner_first)] == [0.65]


def test_mixed_labels_and_other_inputs_record_nothing():
    def two_terms(model, x, y):
        perm, inputs = _mix(x)
        out = model(inputs)
        return 0.7 * F.cross_entropy(out, y) + 0.3 * F.cross_entropy(out, y[perm])

    def soft(model, x, y):
        perm, inputs = _mix(x)
        target = 0.7 * F.one_hot(y, 2).float() + 0.3 * F.one_hot(y[perm], 2).float()
        return F.cross_entropy(model(inputs), target)

    def pairing(model, x, y):
        _, inputs = _mix(x, lam=0.5)
        return F.cross_entropy(model(inputs), y)

    def scaled(model, x, y):
        return F.cross_entropy(model(x * 0.5 + 1.0), y)

    for loss_of in (two_terms, soft, pairing, scaled):
        assert _events(loss_of) == [], loss_of.__name__


def test_the_rule_reports_at_the_model_call():
    t = builder()
    t.put(ev.mixup_unmixed(fn="cross_entropy", loader=0, batch=[0, 2], field="[1]", rows=32,
                           lam=0.63), 19)
    f = only(t, SLUG)
    assert f.location.line == 19 and "0.63" in f.message and "y[perm]" in f.fix
    assert findings(builder(), SLUG) == []
