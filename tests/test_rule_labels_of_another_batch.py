"""labels-of-another-batch (GD250): the ``batch_pairing`` events of instrument/batchpairs.py for
a target from another batch than the model's inputs, and the rule's finding."""

from __future__ import annotations

import itertools

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from batchpair_runs import ce, pairing
from rule_traces import builder, findings, only

SLUG = "labels-of-another-batch"


def _event(problem="other-batch", target_loader=0):
    return ev.batch_pairing(problem=problem, fn="cross_entropy", loader=0, input_batch=[1, 2],
                            target_loader=target_loader, target_batch=[0, 0], field="[1]", rows=32)


def test_the_event_is_a_warning_at_the_model_call():
    t = builder()
    t.put(_event(), 17)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 17
    assert f.evidence["inputs_batch"] == [0, 1, 2] and f.evidence["target_batch"] == [0, 0, 0]
    assert "batch 0 of epoch 0" in f.message
    other = builder()
    other.put(_event(target_loader=1), 17)
    assert "another DataLoader" in only(other, SLUG).message
    permuted = builder()
    permuted.put(_event(problem="permuted"), 17)
    assert findings(permuted, SLUG) == [] and findings(builder(), SLUG) == []


def test_the_first_batch_labels_kept_from_before_the_loop():
    def loop(loader, model):
        _, y0 = next(iter(loader))
        for x, _ in itertools.islice(loader, 3):
            ce(model, x, y0)

    assert pairing(loop) == [("other-batch", [1, 0], [0, 0], "[1]")]


def test_labels_read_one_turn_late_cast_and_reshaped():
    def loop(loader, model):
        late = None
        for x, y in itertools.islice(loader, 3):
            late = y if late is None else late
            torch.nn.functional.mse_loss(model(x)[:, 0], late.float().view(-1)).backward()
            late = y

    assert pairing(loop) == [("other-batch", [0, 1], [0, 0], "[1]")]


def test_silent_on_pairs_of_one_batch():
    def this_batch(loader, model):
        for x, y in itertools.islice(loader, 3):
            ce(model, x, y)

    def prefetched(loader, model):
        it = iter(loader)
        ahead = next(it)
        for _ in range(3):
            (x, y), ahead = ahead, next(it)
            ce(model, x, y)

    def one_batch(loader, model):
        x, y = next(iter(loader))
        for _ in range(3):
            ce(model, x, y)

    def uniform(loader, model):
        real = torch.ones(8, dtype=torch.long)
        for x, _ in itertools.islice(loader, 3):
            ce(model, x, real)

    def transformed(loader, model):  # inputs that are no batch rows: nothing is judged
        _, y0 = next(iter(loader))
        for x, _ in itertools.islice(loader, 3):
            ce(model, (x - x.mean()) / x.std(), y0)

    for loop in (this_batch, prefetched, one_batch, uniform, transformed):
        assert pairing(loop) == [], loop.__name__


def test_the_window_closes_after_the_first_backwards():
    def late(loader, model):
        _, y0 = next(iter(loader))
        for i, (x, y) in enumerate(itertools.islice(loader, 12)):
            ce(model, x, y if i < 10 else y0)

    assert pairing(late, rows=128) == []
