"""batchnorm-batch-of-one (GD162): the ``bn_batch`` events the mode watcher (instrument/modes.py)
makes for training BatchNorm inputs in the first turns, the source helper that finds a
``DataLoader(batch_size=1)``, and the rule's verdict over them."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.source import loader_batch_of_one_lines
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.modes import BATCH_TURNS
from rule_traces import builder, findings, only

SLUG = "batchnorm-batch-of-one"


def _turns(t, sizes, line=12):
    """One training turn per size: a BatchNorm input of that batch, a backward, a step."""
    for turn, size in enumerate(sizes):
        t.put(ev.bn_batch(batch=size, shape=[size, 8, 4, 4], layer="net.1", cls="BatchNorm2d",
                          turn=turn), line)
        t.backward(fresh=[0, 1], line=13)
        t.step(0, line=14)
    return t


def test_three_training_forwards_of_one_sample_are_a_warning_at_the_model_call():
    f = only(_turns(builder(), [1, 1, 1]), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert f.evidence["forwards"] == 3 and f.evidence["layer"] == "net.1"
    assert "one sample at a time" in f.message and "GroupNorm" in f.fix


def test_fewer_forwards_a_larger_batch_or_a_forward_no_backward_followed_are_silent():
    assert findings(_turns(builder(), [1, 1]), SLUG) == []
    assert findings(_turns(builder(), [8, 8, 1, 8]), SLUG) == []  # an epoch's last batch of one
    assert findings(_turns(builder(), [1, 1, 1, 32]), SLUG) == []  # rollouts of one, updates of 32
    t = _turns(builder(), [1, 1])
    t.put(ev.bn_batch(batch=1, shape=[1, 8], layer="net.1", cls="BatchNorm1d", turn=2), 12)
    assert findings(t, SLUG) == []  # the third forward trained nothing


def test_the_finding_moves_to_the_one_dataloader_of_batch_size_one(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        loader = DataLoader(train_set, batch_size=1, shuffle=True)
        for x, y in loader:
            pass
        """))
    t = builder()
    t.path = str(script)
    f = only(_turns(t, [1, 1, 1], line=3), SLUG)
    assert f.location.line == 1 and "batch_size=1" in f.message
    assert [r.location.line for r in f.related] == [3]


def test_loader_batch_of_one_lines_read_literals_and_names_assigned_only_one(tmp_path):
    script = tmp_path / "m.py"
    script.write_text(textwrap.dedent("""\
        BS = 1
        N = 1
        N = 4
        a = DataLoader(ds, batch_size=1)
        b = torch.utils.data.DataLoader(ds, 1, shuffle=True)
        c = DataLoader(ds, batch_size=BS)
        d = DataLoader(ds, batch_size=N)
        e = DataLoader(ds, batch_size=16)
        f = DataLoader(ds)
        g = other(ds, batch_size=1)
        h = DataLoader(ds, batch_size=True)
        """))
    assert [line for line, _ in loader_batch_of_one_lines(str(script))] == [4, 5, 6]
    assert loader_batch_of_one_lines(str(tmp_path / "missing.py")) == []


def _events(norm, size=1, turns=4, prepare=None, grad=True) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), norm(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(4, 2))
        if prepare is not None:
            prepare(model)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
        for _ in range(turns):
            with torch.set_grad_enabled(grad):
                out = model(torch.randn(size, 3, 8, 8))
            if grad:
                loss = out.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("bn_batch")]


def test_the_watcher_notes_each_turns_batch_size_in_the_first_turns_only():
    seen = _events(nn.BatchNorm2d, turns=BATCH_TURNS + 3)
    assert [e["turn"] for e in seen] == list(range(BATCH_TURNS))
    assert all(e["batch"] == 1 and e["cls"] == "BatchNorm2d" and e["shape"] == [1, 4, 6, 6] for e in seen)
    assert [e["batch"] for e in _events(nn.BatchNorm2d, size=8)] == [8] * 4


def test_the_watcher_notes_nothing_where_batch_statistics_are_not_trained_on():
    def frozen(model):
        model[1].requires_grad_(False)

    def in_eval(model):
        model[1].eval()

    assert _events(lambda c: nn.GroupNorm(2, c)) == []
    assert _events(lambda c: nn.InstanceNorm2d(c, affine=True)) == []
    assert _events(lambda c: nn.BatchNorm2d(c, track_running_stats=False)) == []
    assert _events(nn.BatchNorm2d, prepare=frozen) == []  # frozen-bn-train-mode's
    assert _events(nn.BatchNorm2d, prepare=in_eval) == []
    assert _events(nn.BatchNorm2d, grad=False) == []
    assert _events(nn.SyncBatchNorm, size=1) == []
