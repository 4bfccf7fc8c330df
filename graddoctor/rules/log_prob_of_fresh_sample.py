from __future__ import annotations

import re

from ..findings import Severity
from .base import Rule


class LogProbOfFreshSample(Rule):
    """
    ## What it does
    Finds a policy-gradient loss that weights the log-probability of a fresh sample instead of
    the action the script acted on: `action = dist.sample()` goes to the environment (or the
    reward, or a buffer), and the loss takes `dist.log_prob(dist.sample())` — a second draw,
    of the same distribution or of one built again from the same logits, that nothing but
    `log_prob` ever reads — times the return or advantage, while it holds no log-probability
    of the action taken. `sample` and `log_prob` of `torch.distributions` are wrapped; a
    sample drawn after another of a distribution with equal parameters in the same step is
    followed (a `TorchFunctionMode`, until the next backward, first few times only) and the
    loss's graph judged at the backward. It points at the `log_prob` call.

    ## Why is this bad?
    The score-function gradient `grad log_prob(a) * G` is unbiased only when `G` is the return
    of `a`. The fresh sample is drawn independently of everything the return depends on, and
    the expected score of a sample is zero (`E[grad log_prob(x)] = 0`): whatever the returns,
    the policy's gradient is noise around zero. Nothing fails; the loss moves, the policy does
    a random walk and never learns which actions pay.

    ## Example
    ```python
    action = dist.sample()
    state, reward, done = env.step(action.item())
    log_probs.append(dist.log_prob(dist.sample()))
    ```

    ## Use instead
    ```python
    action = dist.sample()
    state, reward, done = env.step(action.item())
    log_probs.append(dist.log_prob(action))
    ```

    ## Stays silent on
    `log_prob(action)` of the action taken; several actions for several environments sampled
    in one batch and the log-probability of that batch; a second sample the script also uses
    (a sampled baseline's rollout, a second environment); PPO's stored actions evaluated under
    the new policy; SAC's `rsample()` with `log_prob` of the same sample; a Monte-Carlo entropy
    bonus `-dist.log_prob(dist.sample()).mean()` beside a policy-gradient term on the action
    taken, or weighted by its own log-probability; importance weights of behaviour samples;
    a fresh sample whose log-probability is not weighted (no product in the loss); samples
    drawn under `no_grad` or after `torch.compile` was called (not followed).
    """

    code = "GD156"
    slug = "log-prob-of-fresh-sample"
    severity = Severity.WARNING
    summary = ("a policy-gradient loss weights the log_prob of a fresh dist.sample(), not of the "
               "action the script acted on: its expected gradient is zero whatever the returns")
    fix = ("take the log-probability of the action the environment received: "
           "dist.log_prob(action)")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("fresh_sample_scored"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None:
                continue
            dist = e.get("dist") or "distribution"
            acted, sampled = e.get("acted"), e.get("sampled")
            took = f"the sample drawn at line {acted}" if acted else "an earlier sample"
            fresh = (f"the sample drawn at line {sampled}" if sampled and sampled != e.loc.line
                     else "a fresh sample")
            action = _action_name(a.source.line_text(e.loc.path, acted)) if acted else None
            owner = _log_prob_owner(a.source.line_text(e.loc.path, e.loc.line)) or "dist"
            yield self.finding(
                f"this log_prob is of {fresh} of the {dist}, which nothing else reads, while the "
                f"script used {took}; the loss backpropagated at line {e.get('backward')} weights "
                f"it by a return or advantage and holds no log_prob of the action taken, so the "
                f"gradient of {a.names(pids)} is noise with expectation zero whatever the returns",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"dist": e.get("dist"), "acted": acted, "sampled": sampled,
                          "params": [a.param_name(p) for p in pids[:16]]},
                fix=(f"take the log-probability of the action the environment received: "
                     f"{owner}.log_prob({action})" if action else
                     f"take the log-probability of the action the environment received: keep "
                     f"the sampled tensor (action = ...sample(), act on it) and use "
                     f"{owner}.log_prob(action)"))


def _log_prob_owner(line: str) -> str | None:
    """The name whose ``.log_prob(`` a line calls (``m`` of ``m.log_prob(m.sample())``), or None."""
    found = re.search(r"([A-Za-z_][\w.]*)\.log_prob\(", line)
    return found.group(1) if found else None


def _action_name(line: str) -> str | None:
    """The name a line like ``action = dist.sample()`` assigns the sampled tensor to, or None."""
    code = line.split("  #", 1)[0].strip()
    if "=" not in code or "==" in code.split("=", 1)[0]:
        return None
    target, value = (part.strip() for part in code.split("=", 1))
    if not target.isidentifier() or not re.search(r"\.sample\([^()]*\)$", value):
        return None  # not the sampled tensor itself (a .tolist(), an .item() of it)
    return target
