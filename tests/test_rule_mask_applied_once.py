"""mask-applied-once (GD180): hand-written ``mask_regrown`` events, the source search for the
line that applied the mask, and the watcher that records the events from the first steps."""

from __future__ import annotations

import ast

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules import find_rule
from graddoctor.rules.mask_applied_once import _writes_with_mask
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "mask-applied-once"


def _event(t, line=7, cls="MaskedConv2d", defined_at=None):
    t.put(ev.mask_regrown(cls=cls, param="weight", mask="mask", regrown=40, masked=64, steps=1,
                          defined_at=defined_at), line)
    return t


def test_a_regrown_mask_is_a_warning_at_the_forward_when_no_source_is_found():
    f = only(_event(builder()), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "40 of those 64" in f.message and "self.weight * self.mask" in f.fix


def test_no_event_no_finding():
    assert findings(builder(), SLUG) == []


def test_layers_of_one_class_masked_by_one_line_are_one_finding():
    t = _event(_event(builder()))
    assert len(findings(t, SLUG)) == 1
    assert len(findings(_event(t, cls="MaskedLinear"), SLUG)) == 2


def test_points_at_the_line_that_applied_the_mask(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "class MaskedConv2d(Conv2d):\n"                       # 1
        "    def __init__(self):\n"                           # 2
        "        self.register_buffer('mask', m)\n"           # 3
        "        self.weight.data *= self.mask\n"             # 4
        "    def forward(self, x):\n"                         # 5
        "        return super().forward(x)\n"                 # 6
        "out = net(x)\n")                                     # 7
    t = _event(TraceBuilder(str(script)), defined_at=[str(script), 1, 6])
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]
    assert [r.location.line for r in found[0].related] == [7]
    script.write_text(script.read_text().replace("        self.weight.data *= self.mask\n",
                                                 "        pass\n"))
    t = _event(TraceBuilder(str(script)), defined_at=[str(script), 1, 6])
    assert [f.location.line for f in find_rule(SLUG)().check(Analysis(t.trace))] == [5]  # forward


def _stmt(text):
    return ast.parse(text).body[0]


def test_the_writes_that_apply_a_mask():
    assert _writes_with_mask(_stmt("self.weight.data *= self.mask"), "weight", "mask")
    assert _writes_with_mask(_stmt("self.weight.data[self.mask == 0] = 0"), "weight", "mask")
    assert _writes_with_mask(_stmt("self.weight.masked_fill_(~self.mask, 0.0)"), "weight", "mask")
    assert _writes_with_mask(_stmt("layer.weight.data.mul_(layer.mask)"), "weight", "mask")
    assert not _writes_with_mask(_stmt("w = self.weight * self.mask"), "weight", "mask")
    assert not _writes_with_mask(_stmt("self.bias.data *= self.mask"), "weight", "mask")
    assert not _writes_with_mask(_stmt("self.weight.data *= 0.5"), "weight", "mask")


class _Masked(nn.Linear):
    def __init__(self, in_forward=False, reapply=False):
        super().__init__(8, 8)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8), -1))
        self.weight.data *= self.mask
        self.in_forward, self.reapply = in_forward, reapply

    def forward(self, x):
        if self.reapply:
            self.weight.data *= self.mask
        weight = self.weight * self.mask if self.in_forward else self.weight
        return F.linear(x, weight, self.bias)


class _Identity(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(8))
        self.register_buffer("eye", torch.eye(8))

    def forward(self, x):
        return x @ (self.weight + self.eye).t()


def _regrown(make, steps=3):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = make()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).square().mean().backward()
            optimizer.step()
    return [e.data for e in rec.trace.of_kind("mask_regrown")]


def test_the_watcher_finds_a_mask_applied_once():
    (told,) = _regrown(_Masked)
    assert (told["cls"], told["param"], told["mask"], told["masked"]) == ("_Masked", "weight", "mask", 36)
    assert 0 < told["regrown"] <= 36 and told["steps"] == 1
    assert told["defined_at"] is not None and told["defined_at"][0].endswith("test_rule_mask_applied_once.py")


def test_the_watcher_is_silent_on_masks_kept_up_and_on_an_identity_init():
    assert _regrown(lambda: _Masked(in_forward=True)) == []
    assert _regrown(lambda: _Masked(reapply=True)) == []
    assert _regrown(_Identity) == []
