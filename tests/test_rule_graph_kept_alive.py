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


def _events(rec):
    return [e for e in rec.trace if e.kind == "graph_kept"]


def _setup():
    torch.manual_seed(0)
    d, g = nn.Linear(3, 1), nn.Linear(2, 3)
    return d, g, torch.optim.SGD(d.parameters(), lr=0.01), torch.optim.SGD(g.parameters(), lr=0.01)


def test_a_loss_computed_every_few_updates_and_kept_until_the_next_is_not_growth():
    # WGAN-GP (eriklindernoren's PyTorch-GAN): g_loss is computed once per n_critic critic
    # updates and lives until the next one: one update's graph, not one more per step
    rec = Recorder(step_budget=None)
    d, g, opt_d, opt_g = _setup()
    with Instrumentation(rec):
        for i in range(20):
            opt_d.zero_grad()
            d_loss = d(g(torch.randn(4, 2)).detach()).mean() - d(torch.randn(4, 3)).mean()
            d_loss.backward()
            opt_d.step()
            if i % 5 == 0:
                opt_g.zero_grad()
                g_loss = -d(g(torch.randn(4, 2))).mean()
                g_loss.backward()
                opt_g.step()
    assert _events(rec) == []


def test_the_sum_of_one_updates_losses_kept_is_not_growth():
    # DCGAN: errD_real and errD_fake each backwarded, errD = their sum kept for the log line
    rec = Recorder(step_budget=None)
    d, g, opt_d, opt_g = _setup()
    with Instrumentation(rec):
        for i in range(10):
            opt_d.zero_grad()
            err_real = d(torch.randn(4, 3)).mean()
            err_real.backward()
            err_fake = -d(g(torch.randn(4, 2)).detach()).mean()
            err_fake.backward()
            err_d = err_real + err_fake
            opt_d.step()
    assert _events(rec) == []


def test_a_gan_keeping_every_generator_loss_is_found():
    # the discriminator's and the generator's updates alternate: the marked updates of the
    # generator are every other one
    rec = Recorder(step_budget=None)
    d, g, opt_d, opt_g = _setup()
    with Instrumentation(rec):
        g_losses = []
        for i in range(10):
            opt_d.zero_grad()
            d(g(torch.randn(4, 2)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = -d(g(torch.randn(4, 2))).mean()
            g_loss.backward()
            opt_g.step()
            g_losses.append(g_loss)
    (e,) = _events(rec)
    assert e.get("name") == "g_losses" and e.get("holder") == "list"


def test_a_running_total_across_accumulation_windows_is_found():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with Instrumentation(rec):
        total = 0.0
        for i in range(48):
            loss = model(x).pow(2).mean() / 4
            loss.backward()
            total = total + loss
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    (e,) = _events(rec)
    assert e.get("name") == "total"
