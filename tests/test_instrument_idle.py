"""The idle-parameter watcher in-process: it hooks only the modules that own parameters without
a gradient (after 2 steps), records one ``idle_forward`` per call line and grad mode at the
user's line, and leaves no hook behind."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


def test_only_idle_modules_are_hooked_once_per_line_and_mode():
    torch.manual_seed(0)
    body, head, frozen = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 4)
    frozen.requires_grad_(False)
    x = torch.randn(8, 4)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        opt = torch.optim.SGD([*body.parameters(), *head.parameters(), *frozen.parameters()], lr=0.1)
        for _ in range(6):
            opt.zero_grad()
            with torch.no_grad():
                out = head(frozen(body(x)))  # idle head
            loss = body(x).sum() + out.sum()
            loss.backward()
            opt.step()
        with torch.enable_grad():
            head(x).sum()  # head with grad
        hooked = [m for m in (body, head, frozen) if m._forward_pre_hooks]
    assert [e.data for e in rec.trace if e.kind == "internal_error"] == []
    assert hooked == [head]
    assert not head._forward_pre_hooks  # removed on exit
    events = [e for e in rec.trace if e.kind == "idle_forward"]
    assert [(e.loc.line, e["grad"]) for e in events] == [(line_of("# idle head"), False),
                                                          (line_of("# head with grad"), True)]
    head_pids = {rec.pid(p) for p in head.parameters()}
    assert set(events[0]["params"]) == head_pids and events[0]["cls"] == "Linear"
    assert [e["library"] for e in events] == [False, False]  # the user's code called it


def test_a_healthy_run_hooks_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        assert not any(m._forward_pre_hooks for m in model.modules())
    assert not any(e.kind == "idle_forward" for e in rec.trace)


def test_a_step_the_grad_scaler_skipped_is_not_a_step_the_idle_module_missed():
    """The steps of each optimizer are read from ``Progress.stepped``, which leaves out the
    ones a GradScaler skipped (the optimizer's step never ran: no parameter was seen without a
    gradient there): a module idle at every step that ran is still hooked."""
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 2)
    x = torch.randn(8, 4)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        opt = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for i in range(6):
            opt.zero_grad()
            with torch.no_grad():
                out = head(body(x))  # idle head under the scaler
            inp = x * float("inf") if i == 0 else x  # the first step is skipped
            scaler.scale(body(inp).sum() + out.sum()).backward()
            scaler.step(opt)
            scaler.update()
        opt_id = rec.optimizer_id(opt)
        assert rec.progress.opt_steps[opt_id] == 6 and rec.progress.stepped(opt_id) == 5
    assert [e.data for e in rec.trace if e.kind == "internal_error"] == []
    assert [e.loc.line for e in rec.trace if e.kind == "idle_forward"] == [
        line_of("# idle head under the scaler")]


def test_marked_nodes_are_counted_while_alive_and_the_loss_walk_waits_for_one():
    """A loss call walks its input's graph only while some marked node is alive: a marker lives
    in its node's metadata, and ``_LIVE`` empties when every marked graph is freed. (Graphs of
    earlier checks in this test process may still be held by the reports kept for other tests:
    only this test's markers are counted.)"""
    import gc

    from graddoctor.instrument import idle

    gc.collect()
    earlier = set(idle._LIVE)

    def live():
        return set(idle._LIVE) - earlier

    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 2)
    x = torch.randn(8, 4)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        opt = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            body(x).sum().backward()
            opt.step()
        assert not live()  # head idle and hooked, but not called with gradients yet
        out = head(x)  # a marked forward: its output's node carries a marker
        assert len(live()) == 1
        kept = torch.nn.functional.mse_loss(out, torch.zeros_like(out))  # cut from the loss
        del out, kept
        assert not live()  # the marked graph freed with the tensors that held it
    idle_losses = [e for e in rec.trace if e.kind == "idle_loss"]
    assert len(idle_losses) == 1 and idle_losses[0]["fn"] == "mse_loss"
