"""loss-rows-misaligned (GD315): hand-written ``rows_misaligned`` events over scripts written to
a temporary folder (the rule finds the target's flattening call in the source for its fix), the
shape tests on their own, and the watcher on real graphs through check runs of small scripts."""

from __future__ import annotations

import textwrap

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.viewaxes import leading_merged
from graddoctor.rules.loss_rows_misaligned import reorder
from graddoctor.trace import TraceBuilder
from fixture_runs import check_script
from rule_traces import P, findings, only

SLUG = "loss-rows-misaligned"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, 5), tags_tb.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, scores_from=(16, 12, 5), target_from=(12, 16)):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.rows_misaligned(fn="cross_entropy/nll_loss", scores_from=list(scores_from),
                             scores=[192, 5], target_from=list(target_from), target=[192]), 6)
    for _ in range(4):
        t.backward(fresh=P, line=7)
        t.step(line=7)
    return t


def test_targets_flattened_in_another_axis_order_are_a_warning_at_the_flattening(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "(16, 12, 5)" in f.message and "(12, 16)" in f.message
    # the target's call is named, not the scores' reshape on the same line
    assert "`tags_tb.reshape(-1)`" in f.message
    assert f.fix.startswith("`tags_tb.transpose(0, 1).reshape(-1)` in place of `tags_tb.reshape(-1)`")


def test_three_axes_reordered_get_a_permute(tmp_path):
    text = SCRIPT.replace("tags_tb.reshape(-1)", "masks.flatten()")
    f = only(_trace(_script(tmp_path, text), scores_from=(4, 8, 6, 5), target_from=(8, 6, 4)), SLUG)
    assert f.fix.startswith("`masks.permute(2, 0, 1).flatten()`")


def test_without_the_call_in_the_source_the_finding_has_no_edit(tmp_path):
    text = SCRIPT.replace("tags_tb.reshape(-1)", "flat_tags")
    f = only(_trace(_script(tmp_path, text)), SLUG)
    assert f.fix is None or "in place of" not in f.fix


def test_the_shape_tests():
    assert leading_merged((16, 12, 5), (192, 5)) == (16, 12)
    assert leading_merged((12, 16), (192,)) == (12, 16)
    assert leading_merged((4, 8, 6), (192,)) == (4, 8, 6)
    assert leading_merged((16, 12, 5), (16, 60)) is None  # the trailing axes merged, not the leading
    assert leading_merged((16,), (16,)) is None  # nothing merged
    assert leading_merged((16, 12, 5), (96, 10)) is None  # a regrouping
    assert reorder((12, 16), (16, 12)) == [1, 0]
    assert reorder((8, 6, 4), (4, 8, 6)) == [2, 0, 1]
    assert reorder((8, 8), (8, 8)) is None  # one length twice: no order named


MISALIGNED = """\
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 5))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    tokens = torch.randint(0, 30, (6, 9))
    tags = (tokens % 5).t()
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, 5), torch.reshape(tags, (-1,)))
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_the_watcher_pairs_the_target_with_its_flattening_call(tmp_path, monkeypatch):
    report = check_script(_script(tmp_path, MISALIGNED), monkeypatch=monkeypatch)
    found = [f for f in report.findings if f.rule == SLUG]
    assert [f.location.line for f in found] == [11]
    assert found[0].evidence["scores_from"] == [6, 9, 5] and found[0].evidence["target_from"] == [9, 6]


def test_the_same_axis_order_is_silent(tmp_path, monkeypatch):
    text = MISALIGNED.replace("tags = (tokens % 5).t()", "tags = tokens % 5")
    report = check_script(_script(tmp_path, text), monkeypatch=monkeypatch)
    assert [f.rule for f in report.findings] == []
