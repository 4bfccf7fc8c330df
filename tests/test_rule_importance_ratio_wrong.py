"""importance-ratio-wrong (GD147): what the ratio watcher (instrument/ratios.py) records of a
policy ratio's two sides, the node comparison it rests on, and the rule over hand-written traces."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.ratios import same
from rule_traces import builder, findings, only

SLUG = "importance-ratio-wrong"


def _faults(ratio_of, epochs=2, rollout_grad=False):
    """The ``ratio_fault`` events of a small PPO update whose ratio is ``ratio_of(logp, old)``."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        states = torch.randn(16, 4)
        with torch.set_grad_enabled(rollout_grad):
            rollout = Categorical(logits=policy(states))
            actions = rollout.sample()
            old = rollout.log_prob(actions)
        for _ in range(epochs):
            logp = Categorical(logits=policy(states)).log_prob(actions)
            ratio = ratio_of(logp, old)
            loss = -torch.min(ratio * torch.randn(16), ratio.clamp(0.8, 1.2) * torch.randn(16)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["fault"], e["dist"]) for e in rec.trace if e.kind == "ratio_fault"]


def test_a_ratio_of_the_log_probability_over_itself_is_recorded_once():
    assert _faults(lambda logp, old: torch.exp(logp - logp)) == [("cancels", "Categorical")]
    assert _faults(lambda logp, old: logp.exp() / logp.exp()) == [("cancels", "Categorical")]
    assert _faults(lambda logp, old: (logp.sum(-1) - logp.sum(-1)).exp()) == [("cancels", "Categorical")]


def test_an_inverted_ratio_is_recorded():
    assert _faults(lambda logp, old: torch.exp(old - logp)) == [("inverted", "Categorical")]
    assert _faults(lambda logp, old: torch.exp(-(logp - old))) == [("inverted", "Categorical")]
    assert _faults(lambda logp, old: old.exp() / logp.exp()) == [("inverted", "Categorical")]


def test_a_denominator_with_gradient_at_the_same_actions_is_recorded():
    found = _faults(lambda logp, old: torch.exp(logp - old), epochs=1, rollout_grad=True)
    assert found == [("denominator", "Categorical")]


def test_correct_ratios_are_left_alone():
    assert _faults(lambda logp, old: torch.exp(logp - old)) == []
    assert _faults(lambda logp, old: logp.exp() / old.exp()) == []
    assert _faults(lambda logp, old: torch.exp(logp - logp.detach())) == []  # TRPO-like
    assert _faults(lambda logp, old: torch.exp(-logp)) == []  # no constant minuend: not a ratio


def test_a_ratio_of_other_actions_or_of_a_sample_with_gradient_is_left_alone():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        encoder = nn.Linear(4, 4)
        opt = torch.optim.SGD(encoder.parameters(), lr=0.1)
        mu, log_std = encoder(torch.randn(8, 4)).chunk(2, -1)
        q = Normal(mu, log_std.exp())
        z = q.rsample()
        log_w = Normal(0.0, 1.0).log_prob(z).sum(-1) - q.log_prob(z).sum(-1)  # IWAE's weights
        loss = -torch.exp(log_w).mean()
        loss.backward()
        opt.step()
    assert [e for e in rec.trace if e.kind == "ratio_fault"] == []


def test_same_compares_ops_and_their_arguments():
    x = torch.randn(4, 3, requires_grad=True)
    y = x * 2
    assert same(y.grad_fn, y.view(12).grad_fn)  # a view keeps the values
    assert same(y.sum(-1).grad_fn, y.sum(-1).grad_fn)
    assert not same(y.sum(-1).grad_fn, y.sum(0).grad_fn)
    assert not same(y.grad_fn, (x * 3).grad_fn)
    assert not same(y.grad_fn, (y - y.mean()).grad_fn)


def test_the_rule_points_at_the_alias_and_names_the_parameters():
    t = builder()
    t.put(ev.ratio_fault(fault="cancels", dist="Categorical", params=[0, 1], backward=16), line=14)
    t.backward(fresh=[0, 1], line=16)
    t.step(line=17)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 14
    assert "identically 1" in f.message and "no_grad" in f.fix
    t = builder()
    t.put(ev.ratio_fault(fault="inverted", dist="Normal", params=[0], backward=16), line=14)
    f = only(t, SLUG)
    assert "inverted" in f.message and "logp - old_logp" in f.fix
    t = builder()
    t.put(ev.ratio_fault(fault="minimised", dist="Normal", params=[0], backward=16), line=14)
    assert findings(t, SLUG) == []  # surrogate-minimised's
    t = builder()
    t.put(ev.ratio_fault(fault="cancels", dist="Normal", params=[7], backward=16), line=14)
    assert findings(t, SLUG) == []  # no optimizer steps it


def _token_faults(ratio_of, rollout_grad=False):
    """The ``ratio_fault`` events of a token-level update whose log-probabilities are
    ``log_softmax(logits).gather(-1, tokens)`` and whose ratio is ``ratio_of(logp, old)``."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        lm = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
        opt = torch.optim.SGD(lm.parameters(), lr=0.1)
        ids = torch.randint(0, 10, (6, 5))
        with torch.set_grad_enabled(rollout_grad):
            old = lm(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        logp = torch.gather(torch.log_softmax(lm(ids[:, :-1]), -1), 2, ids[:, 1:, None]).squeeze(-1)
        loss = -(ratio_of(logp, old) * torch.randn(6, 4)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [(e["fault"], e["dist"]) for e in rec.trace if e.kind == "ratio_fault"]


def test_token_log_probabilities_gathered_from_log_softmax_are_judged_too():
    assert _token_faults(lambda logp, old: torch.exp(logp - logp)) == [("cancels", "log_softmax")]
    found = _token_faults(lambda logp, old: torch.exp(logp - old), rollout_grad=True)
    assert found == [("denominator", "log_softmax")]
    assert _token_faults(lambda logp, old: torch.exp(logp - old)) == []
    assert _token_faults(lambda logp, old: torch.exp(logp - logp.detach())) == []


def test_the_k3_kl_estimator_against_a_frozen_reference_is_no_inverted_ratio():
    def k3(logp, ref):
        return torch.exp(ref - logp) - (ref - logp) - 1
    assert _token_faults(k3) == []


def test_a_log_prob_returned_by_a_helper_is_followed_to_the_difference_after_its_call(tmp_path):
    from textwrap import dedent

    from graddoctor.analysis.source import ratio_line

    script = tmp_path / "ppo.py"
    script.write_text(dedent("""\
        class Agent:
            def get_action_and_value(self, x, action=None):
                dist = self.dist(x)
                return action, dist.log_prob(action), dist.entropy(), self.critic(x)
        for epoch in range(4):
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
            logratio = old_logprobs - newlogprob
            ratio = logratio.exp()
            loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
        """))
    # the difference is what an inverted ratio changes; the exp is what a cancelled one names
    assert ratio_line(str(script), 4, "inverted") == (7, "logratio = old_logprobs - newlogprob")
    assert ratio_line(str(script), 4, "cancels") == (8, "ratio = logratio.exp()")
    assert ratio_line(str(script), 4, "minimised")[0] == 9


def test_an_old_log_prob_recomputed_inline_by_its_helper_is_named_at_the_ratio(tmp_path):
    from textwrap import dedent

    from graddoctor.analysis.source import ratio_line

    script = tmp_path / "rlhf.py"
    script.write_text(dedent("""\
        def token_logps(model, seq):
            logits = model(seq[:, :-1])
            return torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
        for epoch in range(2):
            logps = token_logps(policy, seq)
            ratio = (logps - token_logps(policy, seq)).exp()
            loss = -(adv * ratio).mean()
        """))
    assert ratio_line(str(script), 3, "denominator") == (6, "ratio = (logps - token_logps(policy, seq)).exp()")
    # a helper whose value is stored first: its own return stays the statement to change
    script.write_text(dedent("""\
        def token_logps(model, seq):
            return torch.log_softmax(model(seq), -1).gather(-1, seq[..., None]).squeeze(-1)
        old = token_logps(policy, seq)
        ratio = torch.exp(token_logps(policy, seq) - old)
        """))
    assert ratio_line(str(script), 2, "denominator")[0] == 2


def _ips_faults(weight_of):
    """The ``ratio_fault`` events of a few off-policy bandit updates whose importance weight is
    ``weight_of(probs, actions, propensity)``."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        x, a = torch.randn(16, 4), torch.randint(0, 3, (16,))
        propensity, reward = torch.rand(16) * 0.5 + 0.2, torch.rand(16)
        for _ in range(2):
            probs = torch.softmax(policy(x), dim=1)
            loss = -(weight_of(probs, a, propensity) * reward).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["fault"], e["dist"]) for e in rec.trace if e.kind == "ratio_fault"]


def test_a_logged_propensity_over_the_policys_probability_is_inverted():
    assert _ips_faults(lambda p, a, p0: p0 / p.gather(1, a[:, None]).squeeze(1)) == [("inverted", "softmax")]
    assert _ips_faults(lambda p, a, p0: (p0 / p.gather(1, a[:, None]).squeeze(1)).clamp(max=10)) == \
        [("inverted", "softmax")]


def test_ips_weights_written_right_are_left_alone():
    assert _ips_faults(lambda p, a, p0: p.gather(1, a[:, None]).squeeze(1) / p0) == []
    assert _ips_faults(lambda p, a, p0: torch.exp(torch.log(p.gather(1, a[:, None]).squeeze(1)) - torch.log(p0))) == []
    pick = lambda p, a: p.gather(1, a[:, None]).squeeze(1)  # noqa: E731
    assert _ips_faults(lambda p, a, p0: p0 / pick(p, a).detach() * torch.log(pick(p, a))) == []
    assert _ips_faults(lambda p, a, p0: 1.0 / (p.gather(1, a[:, None]).squeeze(1) + 1.0)) == []


def test_the_rule_words_an_inverted_ips_weight_for_probabilities():
    t = builder()
    t.put(ev.ratio_fault(fault="inverted", dist="softmax", params=[0], backward=16), line=14)
    f = only(t, SLUG)
    assert "p_logged / p" in f.message and "pi_a / propensity" in f.fix


# --- the source pass: ratios made without gradient, read from the script's text -------------

import pytest  # noqa: E402

from graddoctor.analysis.importance_ratio import inverted_importance_ratios  # noqa: E402


@pytest.mark.parametrize("text, found", [
    ("log_rhos = behaviour_logp - target_logp\n", [(1, "log_rhos", "behaviour_logp", "target_logp")]),
    ("ratio = torch.exp(old_logp - logp)\n", [(1, "ratio", "old_logp", "logp")]),
    ("ratio = (b_logprobs[mb] - newlogprob).exp()\n", [(1, "ratio", "b_logprobs", "newlogprob")]),
    ("rho = mu_probs / pi_probs\n", [(1, "rho", "mu_probs", "pi_probs")]),
    ("is_weights = torch.clamp(torch.exp(mu_logp - logp), max=1.0)\n", [(1, "is_weights", "mu_logp", "logp")]),
    ("rhos = torch.minimum(torch.exp(behaviour_log_probs - target_log_probs), one)\n",
     [(1, "rhos", "behaviour_log_probs", "target_log_probs")]),
])
def test_source_reads_a_ratio_written_behaviour_over_current(tmp_path, text, found):
    path = tmp_path / "ratio.py"
    path.write_text(text)
    assert [(l, t, b, c) for l, _, t, b, c in inverted_importance_ratios(str(path))] == found


@pytest.mark.parametrize("text", [
    "log_rhos = target_logp - behaviour_logp\n",
    "ratio = torch.exp(logp - old_logp)\n",
    "logratio = newlogprob - b_logprobs[mb_inds]\n",
    "ratio = new_probs / old_probs\n",
    "ratio = torch.exp(ref_logps - logps)\n",  # a reference model: a KL term
    "approx_kl = (old_logp - logp).mean()\n",  # no ratio
    "ratio = torch.exp(old_values - values)\n",  # no policy
])
def test_source_reads_right_ratios_and_other_differences_as_nothing(tmp_path, text):
    path = tmp_path / "ratio.py"
    path.write_text(text)
    assert inverted_importance_ratios(str(path)) == []


def test_source_finding_at_the_ratio_line_once_the_file_ran_a_backward(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "vtrace.py"
    script.write_text("import torch\nlog_rhos = behaviour_logp - target_logp\n")
    rule = find_rule(SLUG)()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [2]
    assert "`target_logp` minus" in found[0].fix
