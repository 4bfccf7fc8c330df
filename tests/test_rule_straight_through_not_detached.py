"""straight-through-not-detached (GD181): hand-written ``straight_through_cancelled`` events, the
source search for the sum, the graph shape the watcher looks for, and the watcher itself."""

from __future__ import annotations

import ast

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.stcancel import cancelling
from graddoctor.rules import find_rule
from graddoctor.rules.straight_through_not_detached import cancelling_sum
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "straight-through-not-detached"


def _event(t, line=9):
    t.put(ev.straight_through_cancelled(forms=["add"], kept=["AddmmBackward0"]), line)
    return t


def _check(t):
    return list(find_rule(SLUG)().check(Analysis(t.trace)))


def test_without_source_the_finding_is_a_warning_at_the_backward():
    f = only(_event(builder()), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert findings(builder(), SLUG) == []


def test_points_at_each_sum_of_the_script_outside_no_grad(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                   # 1
        "def quantise(z, z_q):\n"                          # 2
        "    return z + (z_q - z)\n"                       # 3
        "def hard(y_hard, y_soft):\n"                      # 4
        "    return y_hard - y_soft + y_soft\n"            # 5
        "with torch.no_grad():\n"                          # 6
        "    sample = z + (z_q - z)\n"                     # 7
        "ok = z + (z_q - z).detach()\n"                    # 8
        "loss.backward()\n")                               # 9
    found = _check(_event(TraceBuilder(str(script))))
    assert [f.location.line for f in found] == [3, 5]
    assert "z + (z_q - z).detach()" in found[0].fix
    assert "y_hard - y_soft" in found[1].fix and ".detach()" in found[1].fix
    assert [r.location.line for r in found[0].related] == [9]


def _expr(text):
    return ast.parse(text, mode="eval").body


def test_the_sums_whose_operand_cancels_in_the_text():
    assert cancelling_sum(_expr("z + (z_q - z)")) == ("z + (z_q - z)", "z")
    assert cancelling_sum(_expr("(z_q - z) + z"))[1] == "z"
    assert cancelling_sum(_expr("y_hard - y_soft + y_soft"))[1] == "y_soft"
    assert cancelling_sum(_expr("x - (x - torch.round(x))"))[1] == "x"
    for clean in ("z + (z_q - z).detach()", "z + (z_q - z) * t", "z + (z_q - z.mean())",
                  "x - x.detach()", "y_hard - y_soft.detach() + y_soft", "a + (b - c)"):
        assert cancelling_sum(_expr(clean)) is None, clean


def test_the_graph_shapes_whose_gradient_cancels():
    q = torch.randn(3, requires_grad=True)
    z = torch.randn(3, requires_grad=True) * 2
    assert cancelling((z + (q - z)).grad_fn)[0] == "add"
    assert cancelling(((q - z) + z).grad_fn)[0] == "add"
    assert cancelling((z - (z - q)).grad_fn)[0] == "sub"
    assert cancelling((z + (q - z).detach()).grad_fn) is None
    assert cancelling(torch.add(z, q - z, alpha=2).grad_fn) is None
    assert cancelling((z + (q - z * 1)).grad_fn) is None  # another node is subtracted


def _told(detached: bool, steps=3):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        enc, codebook = nn.Linear(4, 2), nn.Embedding(5, 2)
        optimizer = torch.optim.SGD([*enc.parameters(), *codebook.parameters()], lr=0.1)
        for _ in range(steps):
            z = enc(torch.randn(8, 4))
            z_q = codebook(torch.cdist(z, codebook.weight).argmin(1))
            diff = (z_q - z).detach() if detached else z_q - z
            optimizer.zero_grad()
            (z + diff).square().mean().backward()
            optimizer.step()
    return [e.data for e in rec.trace.of_kind("straight_through_cancelled")]


def test_the_watcher_tells_an_undetached_estimator_once_per_backward_line():
    (told,) = _told(detached=False)
    assert told["forms"] == ["add"] and told["kept"] == ["AddmmBackward0"]
    assert _told(detached=True) == []
