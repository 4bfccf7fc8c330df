"""sample-not-reparameterised (GD146): what the reparameterisation watcher
(instrument/reparam.py) records of samples drawn without gradient and used by a loss, and the rule
over hand-written traces."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "sample-not-reparameterised"


def _cuts(body):
    """The ``reparam_cut`` events of ``body(encoder, decoder)``'s loss, backpropagated twice."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        encoder, decoder = nn.Linear(6, 4), nn.Linear(2, 6)
        opt = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        for _ in range(2):
            x = torch.randn(8, 6)
            mu, log_std = encoder(x).chunk(2, -1)
            loss = body(Normal(mu, log_std.exp()), decoder, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["dist"], e["op"]) for e in rec.trace if e.kind == "reparam_cut"]


def _kl(q):
    return 0.5 * (q.loc.pow(2) + q.scale.pow(2) - 2 * q.scale.log() - 1).sum(-1).mean()


def test_a_sample_used_by_a_loss_that_trains_its_distribution_is_recorded_once():
    found = _cuts(lambda q, dec, x: (dec(q.sample()) - x).pow(2).mean() + _kl(q))
    assert found == [("Normal", "AddmmBackward0")]
    # through a concatenation with data, as a critic's input
    found = _cuts(lambda q, dec, x: (dec(torch.cat([q.sample()[:, :1], x[:, :1]], -1)) - x).pow(2).mean() + _kl(q))
    assert found == [("Normal", "AddmmBackward0")]


def test_rsample_a_score_function_and_a_loss_that_does_not_train_it_are_left_alone():
    assert _cuts(lambda q, dec, x: (dec(q.rsample()) - x).pow(2).mean() + _kl(q)) == []

    def reinforce(q, dec, x):
        a = q.sample()
        reward = -(dec(a) - x).pow(2).mean(-1).detach()
        return -(q.log_prob(a).sum(-1) * reward).mean() + (dec(a) - x).pow(2).mean()
    assert _cuts(reinforce) == []
    # the decoder alone is trained on the samples: the distribution is not in the loss
    assert _cuts(lambda q, dec, x: (dec(q.sample()) - x).pow(2).mean()) == []

    def under_no_grad(q, dec, x):
        with torch.no_grad():
            z = q.sample()
        return (dec(z) - x).pow(2).mean() + _kl(q)
    assert _cuts(under_no_grad) == []


def test_a_sample_with_only_a_constant_weighted_log_prob_is_still_recorded():
    def sac(q, dec, x):  # alpha * log_prob(a) - Q(a): no score-function weight
        a = q.sample()
        return (0.2 * q.log_prob(a).sum(-1) - dec(a).sum(-1)).mean()
    assert _cuts(sac) == [("Normal", "AddmmBackward0")]


def test_a_distribution_without_rsample_is_not_followed():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        logits, emb = nn.Linear(4, 5), nn.Embedding(5, 3)
        opt = torch.optim.SGD([*logits.parameters(), *emb.parameters()], lr=0.1)
        out = logits(torch.randn(8, 4))
        tokens = Categorical(logits=out).sample()
        loss = emb(tokens).sum() + out.logsumexp(-1).mean()
        loss.backward()
        opt.step()
    assert [e for e in rec.trace if e.kind == "reparam_cut"] == []


def test_the_mode_is_gone_after_the_backward_and_after_the_run():
    stack = torch._C._len_torch_function_stack
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        lin = nn.Linear(2, 2)
        q = Normal(lin(torch.randn(3, 2)), 1.0)
        z = q.sample()
        assert stack() >= 1  # this window's mode (the batch-target window may be open too)
        (lin(z).sum() + q.loc.sum()).backward()
        assert stack() == 0
        q = Normal(lin(torch.randn(3, 2)), 1.0)
        q.sample()
        assert stack() >= 1
    assert stack() == 0


def test_the_rule_warns_at_the_sample_with_rsample_as_the_fix():
    t = builder()
    t.put(ev.reparam_cut(dist="Normal", params=[0, 1], op="AddmmBackward0", via="sample", backward=16), line=12)
    t.backward(fresh=[0, 1], line=16)
    t.step(line=17)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "rsample()" in f.fix and "Normal" in f.message
    t = builder()
    t.put(ev.reparam_cut(dist="Normal", params=[5], op="AddmmBackward0", via="sample", backward=16), line=12)
    assert findings(t, SLUG) == []  # no optimizer steps them


def _hand_written(make):
    """The ``reparam_cut`` events' (via, line offset) of a VAE step whose latent is ``make``."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        encoder, decoder = nn.Linear(6, 4), nn.Linear(2, 6)
        opt = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        x = torch.randn(8, 6)
        mu, logvar = encoder(x).chunk(2, -1)
        std = (0.5 * logvar).exp()
        z = make(mu, std)
        kld = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp(), dim=1).mean()
        loss = (decoder(z) - x).pow(2).mean() + kld
        loss.backward()
        opt.step()
    return [e["via"] for e in rec.trace if e.kind == "reparam_cut"]


def test_a_detached_scale_or_mean_of_a_hand_written_reparameterisation_is_recorded():
    assert _hand_written(lambda mu, std: mu + torch.randn_like(std) * std.detach()) == ["scale"]

    def noise_first(mu, std):
        eps = torch.randn_like(mu)
        return mu + std.detach() * eps
    assert _hand_written(noise_first) == ["scale"]
    # detached before the noise is drawn, the noise shaped after the other part: not seen
    assert _hand_written(lambda mu, std: mu + std.detach() * torch.randn_like(mu)) == []
    assert _hand_written(lambda mu, std: mu.detach() + torch.randn_like(mu) * std) == ["location"]
    assert _hand_written(lambda mu, std: mu.detach() + torch.randn_like(std) * std) == []  # not seen

    def detached_first(mu, std):
        location = mu.detach()
        return location + torch.randn_like(mu) * std  # detached before the noise was drawn
    assert _hand_written(detached_first) == ["location"]


def test_an_attached_reparameterisation_and_plain_noise_are_left_alone():
    assert _hand_written(lambda mu, std: mu + torch.randn_like(std) * std) == []
    assert _hand_written(lambda mu, std: mu + 0.0 * (mu.detach() + 0.1 * torch.randn_like(mu))) == []
    assert _hand_written(lambda mu, std: mu + std * torch.randn_like(std) * std.mean().detach()) == []


def test_the_rule_shows_the_line_of_a_hand_written_one():
    t = builder()
    t.put(ev.reparam_cut(dist=None, params=[0, 1], op="AddBackward0", via="scale", backward=16), line=12)
    f = only(t, SLUG)
    assert "scale (std)" in f.message and "drop the .detach()" in f.fix


def test_no_mode_of_graddoctor_outlives_the_run_when_windows_overlap():
    """Two steps of a policy gradient on a Gaussian: the reparameterisation, fresh-sample,
    batch-target and repeated-term windows open and close out of order; none is left on the
    torch-function stack after the instrumentation is removed."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        for _ in range(2):
            logits = policy(torch.randn(16, 4))
            dist = Normal(logits, torch.ones_like(logits))
            ret = -dist.sample().pow(2).sum(-1)
            loss = -(dist.log_prob(dist.sample()).sum(-1) * ret).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert torch._C._len_torch_function_stack() == 0
    assert not [e for e in rec.trace if e.kind == "internal_error"]
