"""graph-kept-alive (GD238): hand-written traces over a small script on disk, and the liveness
markers in-process (a running total of loss tensors found, .item() not)."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "graph-kept-alive"

SCRIPT = """\
total = 0.0
for step in range(10):
    loss = f(model(x))
    loss.backward()
    opt.step()
    total += loss
"""


def test_the_line_that_keeps_the_graphs_is_named(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    t = TraceBuilder(str(path))
    t.put(ev.graph_kept(name="total", holder="tensor", steps=2), 4)
    f = only(t, SLUG)
    assert f.location.line == 6 and "total" in f.message and f.related[0].location.line == 4


def test_a_hidden_state_carried_on_purpose_is_left_to_its_rule():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.backward(fresh=[0], line=4, history=[[1, [0]]])
    t.put(ev.graph_kept(name="h", holder="tensor", steps=2), 4)
    assert findings(t, SLUG) == []


def train(keep):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with Instrumentation(rec):
        total = 0.0
        for _ in range(7):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = total + keep(loss)
    return [e for e in rec.trace if e.kind == "graph_kept"], total


def test_the_markers_find_a_running_total_of_tensors():
    (e,), _ = train(lambda loss: loss)
    assert e.get("name") == "total" and e.get("holder") == "tensor"


def test_item_and_detach_keep_nothing():
    assert train(lambda loss: loss.item())[0] == []
    assert train(lambda loss: loss.detach())[0] == []


def test_losses_kept_until_the_accumulation_step_are_not_reported():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with Instrumentation(rec):
        for _ in range(4):
            window = []
            for _ in range(8):
                loss = model(x).pow(2).mean()
                (loss / 8).backward()
                window.append(loss)
            opt.step()
            opt.zero_grad()
            logged = torch.stack(window).mean().item()
    assert [e for e in rec.trace if e.kind == "graph_kept"] == []
