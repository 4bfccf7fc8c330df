"""variance-across-features (GD279): hand-written ``feature_variance`` events, and the watcher's
reading of real graphs: a var/std over the features of a batch, pulled to a target."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.featurevar import FeatureVarianceWatcher
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "variance-across-features"

SCRIPT = """\
import torch
opt = torch.optim.Adam(net.parameters())
for step in range(4):
    z = net(x)
    std = torch.sqrt(z.var(dim=1) + 1e-4)
    loss = F.mse_loss(z, net(x2)) + F.relu(1 - std).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _trace(tmp_path, *made):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=2)
    for item in made:
        t.put(item, 7)
    for _ in range(4):
        t.backward(fresh=P, line=7)
        t.step(line=7)
    return t


def test_a_variance_per_sample_is_a_warning_at_its_call(tmp_path):
    made = ev.feature_variance(fn="var", shape=[64, 32], penalty="relu")
    f = only(_trace(tmp_path, made), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert "`z.var(dim=1)`" in f.message and "64 samples" in f.message and "32 features" in f.message
    assert f.fix.startswith("`z.var(dim=0)`")
    assert [r.location.line for r in f.related] == [7]


def test_nothing_without_an_event(tmp_path):
    assert findings(_trace(tmp_path), SLUG) == []


class _Rec:
    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
        pass

    def __init__(self):
        self.made = []

    def emit_aside(self, made, loc):
        self.made.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc

    def retire(self, topic, fn):
        pass


def _seen(loss):
    rec = _Rec()
    FeatureVarianceWatcher(rec).describe_loss(loss)
    return [m[1] for m in rec.made]


def test_the_watcher_sees_a_hinge_on_a_per_sample_std():
    net = torch.nn.Linear(8, 6)
    z = net(torch.randn(16, 8))
    assert _seen(F.relu(1 - torch.sqrt(z.var(dim=1) + 1e-4)).mean()) == [
        {"fn": "var", "shape": [16, 6], "penalty": "relu"}]
    assert _seen(torch.clamp(1 - z.std(-1), min=0).mean())[0]["fn"] == "std"
    assert _seen(((1 - torch.var(z, 1)) ** 2).mean())[0]["penalty"] == "square"


def test_the_watcher_stays_silent_on_the_batch_axis_and_on_standardisation():
    net = torch.nn.Linear(8, 6)
    z = net(torch.randn(16, 8))
    assert _seen(F.relu(1 - torch.sqrt(z.var(dim=0) + 1e-4)).mean()) == []  # VICReg as written
    h = (z - z.mean(-1, keepdim=True)) / z.std(-1, keepdim=True)  # a layer norm by hand
    assert _seen(h.pow(2).mean()) == []
    w = torch.nn.Parameter(torch.randn(16, 6))  # a weight: no data below it
    assert _seen(F.relu(1 - w.std(dim=1)).mean()) == []
