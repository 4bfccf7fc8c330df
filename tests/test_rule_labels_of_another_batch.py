"""labels-of-another-batch (GD250): the ``batch_pairing`` events of instrument/batchpairs.py for
a target from another batch than the model's inputs, and the rule's finding."""

from __future__ import annotations

import inspect
import itertools

import torch

from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
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


def _module_pairing(loop, rows: int = 64, batch_size: int = 8) -> list:
    """The ``batch_pairing`` events of ``loop(loader, model)`` over float (B, 1) regression
    targets, as ``(problem, input_batch, target_batch, model_line set, loc line)``."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        features = torch.randn(rows, 3)
        targets = features[:, :1] * 2 + 0.1 * torch.randn(rows, 1)
        loader = DataLoader(TensorDataset(features, targets), batch_size=batch_size, shuffle=True)
        loop(loader, torch.nn.Linear(3, 1))
    return [(e["problem"], e["input_batch"], e["target_batch"], "model_line" in e.data, e.loc.line)
            for e in rec.trace.of_kind("batch_pairing")]


def test_a_loss_module_given_a_kept_batchs_targets_is_the_line_reported():
    criterion = torch.nn.MSELoss()
    lines = {}

    def stale(loader, model):
        _, y0 = next(iter(loader))
        for x, y in itertools.islice(loader, 3):
            preds = model(x)
            loss = criterion(preds, y0); lines["loss"] = inspect.currentframe().f_lineno
            loss.backward()

    events = _module_pairing(stale)
    assert [e[:4] for e in events] == [("other-batch", [1, 0], [0, 0], True)]
    assert events[0][4] == lines["loss"]


def test_a_loss_module_is_no_model_its_own_batchs_targets_stay_silent():
    criterion = torch.nn.SmoothL1Loss()

    def own(loader, model):
        for x, y in itertools.islice(loader, 3):
            criterion(model(x), y).backward()

    def reconstruct(loader, model):  # the batch's inputs as the target: made from the batch
        decoder = torch.nn.Linear(1, 3)
        for x, _ in itertools.islice(loader, 3):
            criterion(decoder(model(x)), x).backward()

    for loop in (own, reconstruct):
        assert _module_pairing(loop) == [], loop.__name__


def test_the_message_names_the_models_line_when_it_points_at_the_loss():
    t = builder()
    t.put(ev.batch_pairing(problem="other-batch", fn="mse_loss", loader=0, input_batch=[1, 2],
                           target_loader=0, target_batch=[0, 0], field="[1]", rows=32,
                           model_line=16), 17)
    f = only(t, SLUG)
    assert f.location.line == 17 and "the model (line 16)" in f.message
