"""loss-is-batch-spread (GD309): a loss that is nothing but a batch's spread around its own
mean (a Deep SVDD centre taken from the live batch with its gradient, a batch variance
minimised), read from the loss's graph at the first backwards of each backward line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.spreadloss import SpreadLossWatcher, spread_of
from rule_traces import builder, findings, only

SLUG = "loss-is-batch-spread"


def _z(rows=16):
    torch.manual_seed(0)
    return nn.Linear(5, 3, bias=False)(torch.randn(rows, 5))


@pytest.mark.parametrize("loss_of, form", [
    (lambda z: ((z - z.mean(0)) ** 2).sum(1).mean(), "centred"),
    (lambda z: ((z.mean(dim=0, keepdim=True) - z) ** 2).sum(), "centred"),
    (lambda z: 0.5 * torch.norm(z - z.mean(0), dim=1).pow(2).mean(), "centred"),
    (lambda z: torch.linalg.vector_norm(z - z.mean(0), dim=1).mean() / 4, "centred"),
    (lambda z: z.var(dim=0).sum(), "var"),
    (lambda z: torch.std(z, 0).mean() * 3.0, "var"),
])
def test_a_loss_that_is_only_the_batch_spread_is_found(loss_of, form):
    found = spread_of(loss_of(_z()).grad_fn)
    assert found is not None and found[0] == form and found[1] == (16, 3)


@pytest.mark.parametrize("loss_of", [
    lambda z: ((z - z.mean(0).detach()) ** 2).sum(1).mean(),  # a fixed centre
    lambda z: ((z - torch.zeros(3)) ** 2).sum(1).mean(),
    lambda z: -z.var(dim=0).sum(),  # maximised
    lambda z: torch.relu(1 - z.std(dim=0)).mean(),  # a hinge holding it above 1
    lambda z: z.var(dim=0).sum() + z.pow(2).mean(),  # one term of several
    lambda z: z.var(dim=1).sum(),  # per sample, not over the batch
    lambda z: ((z - z.mean(1, keepdim=True)) ** 2).mean(),  # centred per sample
    lambda z: (z - z.mean(0)).sum(),  # centred, not a spread
])
def test_fixed_centres_other_terms_and_other_uses_stay_silent(loss_of):
    assert spread_of(loss_of(_z()).grad_fn) is None


def test_a_batch_of_three_is_too_small():
    assert spread_of(_z(rows=3).var(dim=0).sum().grad_fn) is None


def test_the_watcher_reports_once_per_line_and_unsubscribes():
    events, retired = [], []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def retire(self, topic, fn):
            retired.append(topic)

        def internal_error(self, where, exc):
            raise exc

    watcher = SpreadLossWatcher(_Rec())
    loss = _z().var(dim=0).sum()
    for _ in range(5):
        watcher.describe_loss(loss)
    assert [made[0] for made in events] == ["spread_minimised"]
    assert events[0][1]["form"] == "var" and events[0][1]["shape"] == [16, 3]
    assert not retired  # a later phase may still bring a line of its own
    for _ in range(600):
        watcher.describe_loss(loss)
    assert retired and len(events) == 1


def _trace(params, path="train.py", line=9):
    t = builder(params=[0, 1])
    t.path = path
    t.put(ev.spread_minimised(form="centred", shape=[64, 8], params=list(params)), line=line)
    t.clear([0, 1], line=line + 1)
    t.backward(fresh=[0, 1], line=line + 2)
    t.step(0, line=line + 3)
    return t


def test_the_rule_points_at_the_centring_line(tmp_path):
    script = tmp_path / "svdd.py"
    script.write_text("import torch\n"
                      "z = torch.zeros(4, 2)\n"
                      "d = ((z - z.mean(0)) ** 2).sum(1)\n"
                      "loss = d.mean()\n"
                      "loss.backward()\n")
    f = only(_trace([0, 1], path=str(script), line=5), SLUG)
    assert f.location.line == 3 and "z.mean(0)" in f.message and "no_grad" in f.fix


def test_the_rule_is_silent_when_nothing_trained_makes_the_outputs():
    assert findings(_trace([7]), SLUG) == []
