"""Which tensors a backward wrote (read from their grads before and after), and when the graph
is walked for leaves graddoctor does not track yet (per call line; see instrument/backward.py)."""

import torch
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument import backward as bw


def _backwards(rec):
    return [e for e in rec.trace.events if e.kind == "backward"]


def _count_walks(monkeypatch) -> list:
    walks = []
    original = bw._leaves

    def counting(tensors, inputs):
        walks.append(1)
        return original(tensors, inputs)

    monkeypatch.setattr(bw, "_leaves", counting)
    return walks


def test_a_line_is_walked_on_its_first_backwards_and_every_16th_after(monkeypatch):
    walks = _count_walks(monkeypatch)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(20):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
    assert len(walks) == bw.WALK_FIRST + 1  # calls 1-3, then call 16
    assert [sorted(b["fresh"]) for b in _backwards(rec)] == [[0, 1]] * 20


def test_a_line_with_non_parameter_leaves_is_walked_every_time(monkeypatch):
    walks = _count_walks(monkeypatch)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            x = torch.randn(4, 3, requires_grad=True)  # FGSM-style input leaf
            model(x).sum().backward()
            opt.zero_grad()
    assert len(walks) == 8
    assert [b["extra_leaves"] for b in _backwards(rec)] == [1] * 8


def test_a_parameter_registered_later_is_found_by_the_next_walk():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        body = nn.Linear(3, 3)
        opt = torch.optim.SGD(body.parameters(), lr=0.1)
        head = None
        for i in range(10):
            if i == 6:
                head = nn.Linear(3, 1)  # no optimizer owns it: only a walk can find it
            opt.zero_grad()
            out = body(torch.randn(4, 3))
            (head(out) if head is not None else out).sum().backward()
            opt.step()
        head_pid = rec.pid(head.weight)
    assert head_pid is not None
    written = [set(b["fresh"]) | set(b["accumulated"]) for b in _backwards(rec)]
    assert head_pid in written[6] and head_pid in written[9]  # the head accumulates: no zero_grad


def test_only_the_tensors_a_backward_wrote_are_listed():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        a, b = nn.Linear(3, 1), nn.Linear(3, 1)
        torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)  # tracks all four
        x = torch.randn(4, 3)
        a(x).sum().backward()  # b is not in this graph
        (a(x) + b(x)).sum().backward(inputs=[b.weight])  # only b.weight is written
        pids = {name: rec.pid(t) for name, t in
                (("a.w", a.weight), ("a.b", a.bias), ("b.w", b.weight), ("b.b", b.bias))}
    first, second = _backwards(rec)
    assert sorted(first["fresh"]) == sorted([pids["a.w"], pids["a.b"]]) and not first["accumulated"]
    assert second["fresh"] == [pids["b.w"]] and not second["accumulated"]


def test_the_grads_held_during_a_backward_are_let_go():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as inst:
        model = nn.Linear(3, 1)
        torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 3)).sum().backward()
        ctx = bw.BackwardContext()
        inst.backward.read_before(ctx)
        assert len(ctx.before) == 2
        inst.backward.end(ctx, None, {})
        assert ctx.before == []
