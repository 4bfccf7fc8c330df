"""inputs-permuted-without-labels (GD251): the ``batch_pairing`` events of
instrument/batchpairs.py for a model given a batch's rows in another order than its target's,
and the rule's finding."""

from __future__ import annotations

import itertools

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from batchpair_runs import ce, pairing
from rule_traces import builder, findings, only

SLUG = "inputs-permuted-without-labels"


def test_the_event_is_a_warning_at_the_model_call():
    t = builder()
    t.put(ev.batch_pairing(problem="permuted", fn="cross_entropy", loader=0, input_batch=[0, 3],
                           target_loader=0, target_batch=[0, 3], field="[1]", rows=16), 9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert f.evidence == {"loss": "cross_entropy", "batch": [0, 0, 3], "target_field": "[1]", "rows": 16}
    other = builder()
    other.put(ev.batch_pairing(problem="other-batch", fn="cross_entropy", loader=0, input_batch=[0, 3],
                               target_loader=0, target_batch=[0, 1], field="[1]", rows=16), 9)
    assert findings(other, SLUG) == [] and findings(builder(), SLUG) == []


def test_inputs_permuted_labels_in_the_loader_order():
    def loop(loader, model):
        for x, y in itertools.islice(loader, 3):
            ce(model, x[torch.randperm(len(x))], y)

    assert pairing(loop, shuffle=False) == [("permuted", [0, 0], [0, 0], "[1]")]


def test_silent_on_permutations_that_keep_the_pairs():
    def both(loader, model):
        for x, y in itertools.islice(loader, 3):
            perm = torch.randperm(len(x))
            ce(model, x[perm], y[perm])

    def mixup(loader, model):
        for x, y in itertools.islice(loader, 3):
            perm = torch.randperm(len(x))
            out = model(0.7 * x + 0.3 * x[perm])
            (torch.nn.functional.cross_entropy(out, y) + torch.nn.functional.cross_entropy(out, y[perm])).backward()

    def put_back(loader, model):
        for x, y in itertools.islice(loader, 3):
            order = x[:, 1].argsort()
            out = model(x[order])[order.argsort()]
            torch.nn.functional.cross_entropy(out, y).backward()

    def part(loader, model):  # half the batch: the order says nothing
        for x, y in itertools.islice(loader, 3):
            ce(model, x[torch.randperm(len(x))][:4], y[:4])

    for loop in (both, mixup, put_back, part):
        assert pairing(loop) == [], loop.__name__
