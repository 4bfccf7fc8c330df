"""class-axis-mismatch (GD213): hand-written ``class_axis`` events over scripts written to a
temporary folder (the rule finds the softmax call with that dim), the watcher on real graphs
(gathers and products with target distributions), and its value tests on their own."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.classaxis import ClassAxisWatcher, distribution_axis, varies_along
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "class-axis-mismatch"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    scores = model(x)
    logp = torch.log_softmax(scores, dim=1)
    loss = -logp.gather(2, tags[..., None]).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, how="gather", dim=1, extra=()):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.class_axis(fn="log_softmax", shape=[8, 12, 5], dim=dim, picked=2, how=how), 8)
    for kind in extra:
        t.put(kind, 8)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_softmax_over_another_axis_than_the_pick_is_a_warning_at_its_call(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "8×12×5" in f.message and "dimension 1 (length 12)" in f.message
    assert "along dimension 2 (length 5)" in f.message
    assert f.fix.startswith("`torch.log_softmax(scores, dim=-1)`")


def test_a_target_distribution_is_named_as_such(tmp_path):
    f = only(_trace(_script(tmp_path), how="target"), SLUG)
    assert "one-hot mask or soft labels" in f.message


def test_without_that_dim_in_the_source_nothing_is_reported(tmp_path):
    for dim in ("dim=-1", "dim=axis"):
        assert findings(_trace(_script(tmp_path, SCRIPT.replace("dim=1", dim))), SLUG) == []


def test_a_softmax_over_the_batch_is_left_to_softmax_over_batch(tmp_path):
    path = _script(tmp_path, SCRIPT.replace("dim=1", "dim=0"))
    assert only(_trace(path, dim=0), SLUG)
    batch = ev.softmax_batch(fn="log_softmax", shape=[8, 12, 5], batch=8)
    assert findings(_trace(path, dim=0, extra=[batch]), SLUG) == []


class _Rec:
    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
        pass

    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc=None):
        self.emitted.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc


def _seen(loss):
    rec = _Rec()
    ClassAxisWatcher(rec).describe_loss(loss)
    return [made[1] for made in rec.emitted]


def _scores():
    return torch.randn(4, 6, 3, requires_grad=True) * 1.0  # (B, T, C)


def test_a_gather_along_the_classes_of_scores_normalised_over_time():
    tags = torch.randint(0, 3, (4, 6))
    tags[:, 0], tags[:, 1] = 0, 1  # differs along time
    bad = _seen(-torch.log_softmax(_scores(), dim=1).gather(2, tags[..., None]).mean())
    assert bad == [{"fn": "log_softmax", "shape": [4, 6, 3], "dim": 1, "picked": 2, "how": "gather"}]
    clamped = _seen(torch.softmax(_scores(), dim=1).clamp_min(1e-6).log().gather(2, tags[..., None]).mean())
    assert [e["picked"] for e in clamped] == [2]
    assert _seen(torch.log_softmax(_scores(), dim=-1).gather(2, tags[..., None]).mean()) == []


def test_a_gather_of_whole_distributions_is_left_alone():
    last = torch.full((4, 1, 3), 5)  # the last step of each sequence, expanded over the classes
    assert _seen(torch.log_softmax(_scores(), dim=-1).gather(1, last).mean()) == []


def test_a_product_with_targets_that_are_a_distribution_along_another_axis():
    onehot = F.one_hot(torch.randint(0, 3, (4, 6)), 3).float()
    bad = _seen(-(onehot * torch.log_softmax(_scores(), dim=1)).sum(-1).mean())
    assert [(e["dim"], e["picked"], e["how"]) for e in bad] == [(1, 2, "target")]
    assert _seen(-(torch.log_softmax(_scores(), dim=-1) * onehot).sum(-1).mean()) == []
    weights = torch.rand(4, 6, 3)  # not a distribution along any axis
    assert _seen((weights * torch.log_softmax(_scores(), dim=1)).mean()) == []


def test_a_per_sample_pick_that_indexes_the_normalised_axis_away():
    # a distributional Q-network's (batch, actions, atoms) output, the taken action's row
    # multiplied by a target distribution over the atoms
    out = torch.randn(4, 2, 5, requires_grad=True) * 1.0
    rows, actions = torch.arange(4), torch.tensor([0, 1, 1, 0])
    target = torch.softmax(torch.randn(4, 5), -1)
    bad = _seen(-(target * torch.log_softmax(out, dim=1)[rows, actions]).sum(-1).mean())
    assert bad == [{"fn": "log_softmax", "shape": [4, 2, 5], "dim": 1, "picked": 2, "how": "target"}]
    assert _seen(-(target * torch.log_softmax(out, dim=-1)[rows, actions]).sum(-1).mean()) == []
    assert _seen(-(torch.rand(4, 5) * torch.log_softmax(out, dim=1)[rows, actions]).sum(-1).mean()) == []


def test_the_value_tests():
    index = torch.tensor([[[0], [1]], [[2], [2]]])
    assert varies_along(index, 1) and not varies_along(index, 2)
    assert not varies_along(torch.zeros(2, 3, dtype=torch.long), 1)
    onehot = F.one_hot(torch.tensor([[0, 1, 2]]), 3).float()  # (1, 3, 3): a permutation
    assert distribution_axis(onehot) == {1, 2}
    assert distribution_axis(F.one_hot(torch.tensor([[0, 0, 1]]), 3).float()) == {2}
    assert distribution_axis(-onehot) == set()
    assert distribution_axis(torch.ones(2, 3, dtype=torch.long)) == set()


def test_a_one_hot_target_with_ignored_positions_zeroed_is_still_a_distribution():
    labels = torch.randint(0, 3, (2, 5, 6))
    valid = torch.ones(2, 5, 6, dtype=torch.bool)
    valid[:, 0] = False  # an ignored row of pixels
    target = F.one_hot(labels, 3).permute(0, 3, 1, 2).float() * valid[:, None]
    assert distribution_axis(target) == {1}
    # mostly zeroed: no longer read as a distribution
    valid[:, :4] = False
    assert distribution_axis(F.one_hot(labels, 3).permute(0, 3, 1, 2).float() * valid[:, None]) == set()
    valid[:, :4] = True
    scores = torch.randn(2, 3, 5, 6, requires_grad=True) * 1.0
    bad = _seen(-(target * torch.log_softmax(scores, dim=-1)).sum())
    assert [(e["dim"], e["picked"], e["how"]) for e in bad] == [(3, 1, "target")]
    assert _seen(-(target * torch.log_softmax(scores, dim=1)).sum()) == []
