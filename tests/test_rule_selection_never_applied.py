"""selection-never-applied (GD357): the source reading over scripts written to a temporary
folder, and the rule over a trace whose backward ran in them."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.unused_selections import unused_selections
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "selection-never-applied"

COTEACHING = """\
import torch
for x, y in loader:
    l1 = F.cross_entropy(net1(x), y, reduction="none")
    l2 = F.cross_entropy(net2(x), y, reduction="none")
    idx1 = torch.argsort(l1.detach())[:k]
    idx2 = torch.argsort(l2.detach())[:k]
    loss1 = l1.mean()
    loss2 = l2[idx1].mean()
    (loss1 + loss2).backward()
"""


def _script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=1)
    for _ in range(2):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    return t


def test_indices_nothing_reads_are_reported_at_the_whole_batch_reduction(tmp_path):
    f = only(_trace(_script(tmp_path, COTEACHING)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert [r.location.line for r in f.related] == [6] and "`idx2`" in f.message
    assert f.fix.endswith("`l1[idx2].mean()`")


def test_an_applied_selection_is_silent(tmp_path):
    text = COTEACHING.replace("loss1 = l1.mean()", "loss1 = l1[idx2].mean()")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_an_unused_mask_without_one_whole_reduction_is_reported_at_itself(tmp_path):
    path = _script(tmp_path, """\
        for u in loader:
            probs = F.softmax(model(u), dim=1).detach()
            conf, pseudo = probs.max(1)
            mask = conf >= 0.95
            loss = F.cross_entropy(model(u), pseudo)
            loss.backward()
        """)
    [found] = unused_selections(path)
    assert found["line"] == 4 and found["name"] == "mask" and found["use_line"] is None
    assert not found["picks"]


def test_logging_numbers_equalities_and_selections_outside_the_loop_are_not_selections(tmp_path):
    path = _script(tmp_path, """\
        l = F.cross_entropy(model(x), y, reduction="none")
        clean = torch.argsort(l)[:10]
        for x, y in loader:
            l = F.cross_entropy(model(x), y, reduction="none")
            share = (l < 0.5).float().mean()
            correct = l.argmax() == y
            l.mean().backward()
        """)
    assert unused_selections(path) == []
