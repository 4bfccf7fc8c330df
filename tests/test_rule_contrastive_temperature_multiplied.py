"""contrastive-temperature-multiplied (GD163): a contrastive loss's cosine similarities
multiplied by a temperature below 1 instead of divided, read from the graph below each
log_softmax."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.analysis.source import temperature_products
from graddoctor.instrument.attnaxis import SoftmaxAxisWatcher, multiplied_temperature
from rule_traces import builder, findings, only

SLUG = "contrastive-temperature-multiplied"
N = 6


def _views(seed=0, normalise=True):
    torch.manual_seed(seed)
    enc = nn.Linear(8, 16)
    x = torch.randn(N, 8)
    z1, z2 = enc(x), enc(x + 0.1 * torch.randn_like(x))
    return (F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)) if normalise else (z1, z2)


def _found(logits_of, **kw):
    z1, z2 = _views(**kw)
    return multiplied_temperature(F.log_softmax(logits_of(z1, z2), dim=-1).grad_fn)


@pytest.mark.parametrize("logits_of, factor", [
    (lambda a, b: a @ b.T * 0.07, 0.07),
    (lambda a, b: 0.1 * torch.matmul(a, b.t()), 0.1),
    (lambda a, b: torch.einsum("nd,md->nm", a, b) * 0.2, 0.2),
    (lambda a, b: (a * 0.5) @ (b * 0.5).T, 0.25),  # split over both sides
    (lambda a, b: (a @ b.T * 0.1).masked_fill(torch.eye(N, dtype=torch.bool), -1e9), 0.1),
    (lambda a, b: torch.bmm((a * 0.3)[None], b.T[None])[0], 0.3),
    (lambda a, b: a @ b.T * torch.tensor(0.07), 0.07),
])
def test_cosine_logits_times_a_small_factor_are_found_in_every_form(logits_of, factor):
    found = _found(logits_of)
    assert found is not None
    assert found[0] == pytest.approx(factor, rel=1e-5) and found[1] == (N, N)


@pytest.mark.parametrize("logits_of", [
    lambda a, b: a @ b.T / 0.07,
    lambda a, b: a @ b.T * (1 / 0.07),
    lambda a, b: a @ b.T,  # a temperature of 1
    lambda a, b: a @ b.T * 0.7,  # above the bound
    lambda a, b: a @ b.T * nn.Parameter(torch.tensor(0.07)),  # a learned temperature
    lambda a, b: nn.Parameter(torch.tensor(2.6)).exp() * a @ b.T,  # CLIP's logit scale
])
def test_divided_learned_or_unit_temperatures_stay_silent(logits_of):
    assert _found(logits_of) is None


def test_unnormalised_embeddings_or_one_side_normalised_stay_silent():
    z1, z2 = _views(normalise=False)
    assert multiplied_temperature(F.log_softmax(z1 @ z2.T * 0.07, -1).grad_fn) is None
    one = F.normalize(z1, dim=-1) @ z2.T * 0.07
    assert multiplied_temperature(F.log_softmax(one, -1).grad_fn) is None
    # normalised over the batch, not over the features the product sums
    batch = F.normalize(z1, dim=0) @ F.normalize(z2, dim=0).T * 0.07
    assert multiplied_temperature(F.log_softmax(batch, -1).grad_fn) is None


def test_the_watcher_reads_cross_entropy_but_not_attention_or_regression():
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
    z1, z2 = _views()
    attention = (torch.softmax(z1 @ z2.T * 0.1, dim=-1) @ z2).sum()
    regression = F.mse_loss(z1 @ z2.T * 0.1, torch.eye(N))
    watcher.describe_loss(attention + regression)
    assert events == []
    for _ in range(2):
        z1, z2 = _views()
        watcher.describe_loss(F.cross_entropy(z1 @ z2.T * 0.07, torch.arange(N)))
    assert [made[0] for made in events] == ["temperature_multiplied"]
    assert events[0][1]["factor"] == pytest.approx(0.07) and events[0][1]["shape"] == [N, N]


def _trace(params):
    t = builder(params=[0, 1])
    t.put(ev.temperature_multiplied(factor=0.07, shape=[8, 8], params=list(params)), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_trains_the_embeddings():
    f = only(_trace([0, 1]), SLUG)
    assert f.evidence["factor"] == pytest.approx(0.07)
    assert "[-0.07, 0.07]" in f.message and "divide by the temperature" in f.fix


def test_the_rule_is_silent_when_nothing_trained_makes_the_logits():
    assert findings(_trace([7]), SLUG) == []


def test_the_temperature_lines_and_their_divided_form(tmp_path):
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent("""\
        logits = z1 @ z2.T * 0.07
        logits = tau * (z1 @ z2.T)
        sim *= self.temperature
        x = y * 2
        w = cfg["temperature"] * s
        h = x * 0.5
        g = z1 @ z2.T * alpha
        """))
    found = {line: (divided, product, value)
             for line, _, divided, product, value in temperature_products(str(path))}
    assert found == {1: ("logits = z1 @ z2.T / 0.07", True, 0.07),
                     2: ("logits = z1 @ z2.T / tau", True, None),
                     3: ("sim /= self.temperature", False, None),
                     5: ("w = s / cfg['temperature']", False, None),
                     6: ("h = x / 0.5", False, 0.5)}


def test_similarities_divided_by_a_learned_logit_scale_are_found_in_the_source():
    import ast as _ast
    from graddoctor.rules.contrastive_temperature_multiplied import logit_scale_divisions
    src = (
        "import torch\n"                                                         # 1
        "class Clip:\n"                                                          # 2
        "    def forward(self, a, b, q, k):\n"                                   # 3
        "        logit_scale = self.logit_scale.exp()\n"                         # 4
        "        bad = a @ b.t() / logit_scale\n"                                # 5
        "        bad2 = torch.matmul(a, b.T) / self.logit_scale.exp()\n"         # 6
        "        good = logit_scale * a @ b.t()\n"                               # 7
        "        attn = q @ k.transpose(-2, -1) / self.scale\n"                  # 8
        "        return a @ b.t() / 0.07\n")                                     # 9
    found = [(line, divisor) for line, _, divisor in logit_scale_divisions(_ast.parse(src))]
    assert found == [(5, "logit_scale"), (6, "self.logit_scale.exp()")]
