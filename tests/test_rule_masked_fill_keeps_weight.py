"""masked-fill-keeps-weight (GD313): scores masked with masked_fill before a softmax whose
masked positions keep their weight (a fill of +1e9, 1e-9 or 0 instead of a large negative
number), read from the softmax's saved result and the mask the fill saved."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.attnaxis import SoftmaxAxisWatcher, masked_after_softmax, masked_fill_weight
from rule_traces import builder, findings, only

SLUG = "masked-fill-keeps-weight"
B, S = 6, 7


def _scores(seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(4, 1)
    return lin(torch.randn(B, S, 4)).squeeze(-1)


def _pad():
    pad = torch.zeros(B, S, dtype=torch.bool)
    for b in range(B):
        pad[b, 3 + b % 3:] = True
    pad[0] = False  # a row without padding: not judged
    return pad


@pytest.mark.parametrize("weights_of, takes", [
    (lambda s, m: F.softmax(s.masked_fill(m, 1e9), dim=-1), True),
    (lambda s, m: s.masked_fill(m, 1e4).softmax(-1), True),
    (lambda s, m: torch.softmax(s.masked_fill(m, 1e-9) / 0.1, dim=1), False),
    (lambda s, m: F.softmax(s.masked_fill(m, 0.0) * 2.0, dim=-1), False),
    (lambda s, m: F.softmax(s.masked_fill(m, -1e9).masked_fill(m, 1e9).clone(), dim=-1), True),
])
def test_fills_that_leave_weight_on_the_masked_positions_are_found(weights_of, takes):
    found = masked_fill_weight(weights_of(_scores(), _pad()).grad_fn)
    assert found is not None
    share, masked, rows, shape, by = found
    assert rows == B - 1 and shape == (B, S) and by == "masked_fill"
    assert (share > 0.99) if takes else (0.01 < share < 0.99)
    assert 0 < masked < 1


@pytest.mark.parametrize("weights_of", [
    lambda s, m: F.softmax(s.masked_fill(m, -1e9), dim=-1),
    lambda s, m: F.softmax(s.masked_fill(m, float("-inf")) * 0.5, dim=-1),
    lambda s, m: s.masked_fill(m, torch.finfo(s.dtype).min).softmax(-1),
    lambda s, m: F.softmax(s.masked_fill(m, -1e4), dim=-1),
    lambda s, m: F.softmax(s.masked_fill(m, 1e9) * -1.0, dim=-1),  # a negative factor: not judged
    lambda s, m: F.softmax(s.masked_fill(m, 0.0) + torch.randn(S), dim=-1),  # a bias after it
    lambda s, m: F.softmax(s.masked_fill(m, 0.0).unsqueeze(1), dim=1),  # not the last axis
    lambda s, m: F.softmax(s.masked_fill(torch.zeros_like(m), 0.0), dim=-1),  # masks nothing here
    lambda s, m: F.softmax(s.masked_fill(torch.ones_like(m), 0.0), dim=-1),  # every position
    lambda s, m: F.softmax(s, dim=-1).masked_fill(m, 0.0),  # filled after the softmax
    lambda s, m: s.masked_fill(m, float("inf")).softmax(-1),  # NaN rows: nonfinite-grad's
])
def test_masks_that_mask_or_fills_that_are_no_mask_stay_silent(weights_of):
    weights = weights_of(_scores(), _pad())
    node = weights.grad_fn
    if not type(node).__name__.startswith("SoftmaxBackward"):
        node = node.next_functions[0][0]
    assert masked_fill_weight(node) is None


def test_a_mask_broadcast_over_heads_and_queries_is_expanded():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    q = lin(torch.randn(B, 2, S, 8))
    scores = q @ q.transpose(-2, -1) / math.sqrt(8)
    weights = scores.masked_fill(_pad()[:, None, None, :], 1e9).softmax(-1)
    share, masked, rows, shape, by = masked_fill_weight(weights.grad_fn)
    assert shape == (B, 2, S, S) and rows == (B - 1) * 2 * S and share > 0.99


def test_the_watcher_reports_once_with_the_parameters():
    events = []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
            pass

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def internal_error(self, where, exc):
            raise exc

    watcher = SoftmaxAxisWatcher(_Rec())
    for fill in (1e9, 1e9, -1e9):
        loss = (F.softmax(_scores().masked_fill(_pad(), fill), dim=-1) * torch.randn(B, S)).sum()
        watcher.describe_loss(loss)
    assert [made[0] for made in events] == ["masked_fill_weight"]
    assert events[0][1]["share"] > 0.99 and events[0][1]["shape"] == [B, S]


def _trace(params, share=1.0):
    t = builder(params=[0, 1])
    t.put(ev.masked_fill_weight(share=share, masked=0.4, rows=5, shape=[6, 7], params=list(params)),
          line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_trains_the_scores():
    f = only(_trace([0, 1]), SLUG)
    assert "take 100%" in f.message and "large positive" in f.message
    assert "-inf" in f.fix
    g = only(_trace([1], share=0.3), SLUG)
    assert "keep 30.0%" in g.message and "masks nothing" in g.message


def test_the_rule_is_silent_when_nothing_trained_makes_the_scores():
    assert findings(_trace([7]), SLUG) == []


def _fill_node(weights):
    node = weights.grad_fn
    assert type(node).__name__.startswith("MaskedFillBackward")
    return node


@pytest.mark.parametrize("filled_of, log", [
    (lambda s, m: F.softmax(s, dim=-1).masked_fill(m, 0.0), False),
    (lambda s, m: F.log_softmax(s, dim=1).masked_fill(m, 0.0), True),
    (lambda s, m: torch.log_softmax(s / 0.5, dim=-1).clone().masked_fill(m, 0.0), True),
])
def test_padding_taken_out_after_the_softmax_is_found(filled_of, log):
    found = masked_after_softmax(_fill_node(filled_of(_scores(), _pad())), set())
    assert found is not None
    share, masked, rows, shape, softmax = found
    assert rows == B - 1 and shape == (B, S) and 0.01 < share < 1 and 0 < masked < 1
    assert type(softmax).__name__.startswith("LogSoftmaxBackward" if log else "SoftmaxBackward")


def _one_hot_rows():
    return F.one_hot(torch.arange(B) % S, S).bool()


def _left_pad():
    return _pad().flip(-1)


@pytest.mark.parametrize("filled_of", [
    lambda s, m: F.log_softmax(s.masked_fill(m, float("-inf")), dim=1).masked_fill(m, 0.0),
    lambda s, m: F.softmax(s.masked_fill(m, -1e9), dim=-1).masked_fill(m, 0.0),
    lambda s, m: F.softmax(s, dim=-1).masked_fill(_one_hot_rows(), 0.0),  # a class per row
    lambda s, m: F.softmax(s, dim=-1).masked_fill(torch.rand(B, S) > 0.5, 0.0),  # no padding
    lambda s, m: F.softmax(s.unsqueeze(1), dim=1).squeeze(1).masked_fill(m, 0.0),  # other axis
    lambda s, m: (s * 2).masked_fill(m, 0.0),  # no softmax below
])
def test_fills_after_a_masked_softmax_or_of_no_padding_stay_silent(filled_of):
    assert masked_after_softmax(_fill_node(filled_of(_scores(), _pad())), set()) is None


def test_left_padding_is_padding_too():
    filled = F.softmax(_scores(), dim=-1).masked_fill(_left_pad(), 0.0)
    assert masked_after_softmax(_fill_node(filled), set()) is not None


def test_the_watcher_skips_a_fill_renormalised_afterwards():
    events = []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
            pass

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def internal_error(self, where, exc):
            raise exc

    watcher = SoftmaxAxisWatcher(_Rec())
    w = F.softmax(_scores(), dim=-1).masked_fill(_pad(), 0.0)
    watcher.describe_loss(((w / w.sum(-1, keepdim=True)) * torch.randn(B, S)).sum())
    assert events == []
    watcher.describe_loss((F.log_softmax(_scores(), dim=-1).masked_fill(_pad(), 0.0)).sum())
    assert [made[0] for made in events] == ["masked_fill_weight"]
    assert events[0][1]["after"] is True and events[0][1]["shape"] == [B, S]


def test_the_rule_points_at_the_normaliser_when_the_fill_comes_after(tmp_path):
    script = tmp_path / "listwise.py"
    script.write_text("import torch\n"
                      "s = torch.zeros(2, 3)\n"
                      "log_p = torch.log_softmax(s, dim=1)\n"
                      "loss = -log_p.masked_fill(s > 0, 0.0).sum()\n")
    t = builder(params=[0, 1])
    t.path = str(script)
    t.put(ev.masked_fill_weight(share=0.3, masked=0.4, rows=5, shape=[6, 7], params=[0, 1],
                                after=True), line=4)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert f.location.line == 3 and "log_softmax(s, dim=1)" in f.message
    assert "30.0%" in f.message and "before the softmax" in f.fix


def test_scores_multiplied_by_a_zero_one_mask_keep_weight():
    import torch
    from graddoctor.instrument.attnaxis import masked_fill_weight
    scores = torch.randn(6, 5, requires_grad=True)
    mask = torch.ones(6, 5)
    mask[:, 3:] = 0
    found = masked_fill_weight(torch.softmax(scores * mask, dim=-1).grad_fn)
    assert found is not None and found[-1] == "mul" and found[0] > 0.01 and found[2] == 6
    # the additive form masks; a gate of other values than 0/1 is a scale, not a mask
    assert masked_fill_weight(torch.softmax(scores * mask + (1 - mask) * -1e4, dim=-1).grad_fn) is None
    assert masked_fill_weight(torch.softmax(scores * (mask + 0.5), dim=-1).grad_fn) is None
    filled = masked_fill_weight(torch.softmax(scores.masked_fill(mask == 0, 0.0), dim=-1).grad_fn)
    assert filled is not None and filled[-1] == "masked_fill"


def test_the_product_line_is_the_one_product_above_the_softmax(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules.masked_fill_keeps_weight import product_line
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "train.py"
    script.write_text("att = q @ k.t() / 8\n"            # 1
                      "att = att * keep[:, None]\n"       # 2
                      "att = att.softmax(-1)\n"            # 3
                      "loss.backward()\n")                 # 4
    t = TraceBuilder(str(script))
    t.backward(line=4)
    a = Analysis(t.trace)
    assert product_line(a, str(script))[0] == 2
    script.write_text("att = att * keep\natt = att * gate\natt = att.softmax(-1)\n")
    assert product_line(Analysis(TraceBuilder(str(script)).trace), str(script)) is None
