from __future__ import annotations

from ..analysis.importance_ratio import inverted_importance_ratios
from ..findings import Severity
from ..trace import Location
from .base import Rule

_WHAT = {
    "cancels": ("the importance ratio divides this log-probability by itself: {text} makes the "
                "old log-probability the new one, so the ratio is identically 1 and its gradient "
                "exactly 0; the clipped objective gives {params} no gradient at all (only the other "
                "terms of the loss train them)"),
    "denominator": ("the old log-probability in the importance ratio ({text}) carries gradient "
                    "into {params}, the parameters of the new one: it is the same {dist} "
                    "evaluated at the same actions, so at the parameters it was taken at its "
                    "gradient is the numerator's and the ratio's gradient cancels to 0"),
    "inverted": ("the importance ratio is inverted ({text}): only the subtracted log-probability "
                 "carries gradient, so the ratio is p_old / p and maximising ratio * advantage "
                 "lowers the probability of the actions with a positive advantage in {params}"),
}
_FIX = {
    "cancels": ("take the old log-probability from the rollout, computed under torch.no_grad() "
                "(or old_logp = logp.detach() before the update epochs), never the current one"),
    "denominator": ("detach the old log-probability where the rollout stores it "
                    "(old_logp = dist.log_prob(action).detach(), or compute it under torch.no_grad())"),
    "inverted": "put the current log-probability first: ratio = torch.exp(logp - old_logp)",
}


class ImportanceRatioWrong(Rule):
    """
    ## What it does
    Finds a policy-gradient importance ratio (PPO's `exp(logp - old_logp)`, or `p / p_old`)
    whose gradient is cut or flipped: the old log-probability is the current one itself
    (`old_logp = logp`, the ratio is identically 1), or another evaluation of the same
    distribution at the same actions that carries gradient into the same parameters (the
    rollout's log-probability kept with its graph), or the ratio is inverted
    (`exp(old_logp - logp)`: only the subtracted side carries gradient; or a logged propensity
    divided by the policy's probability gathered from a softmax, `propensity / probs.gather(1,
    a)`, in off-policy (IPS) training). `log_prob` of
    `torch.distributions` is wrapped, and so are gathers of `log_softmax` outputs (a language
    model's token log-probabilities in token-level PPO or GRPO: the first two faults) and of
    `softmax` outputs (probabilities: the inverted quotient); at the
    first backwards that follow, the loss's graph is walked for `exp` and quotient nodes and the
    two sides of each compared. It points at the line that makes the old log-probability or the
    ratio (for an inverted ratio written as the exp of a log-ratio, the difference), following a
    log-probability that a helper returns (an agent's `get_action_and_value`) to the name its
    call assigns it to. A ratio or rho assigned the behaviour policy's log-probability minus the
    current one's (`log_rhos = behaviour_logp - target_logp`, `ratio = (old_logp - logp).exp()`,
    `mu_probs / pi_probs`) is also read from the script's source, in the files whose backwards
    ran: the weights made without gradient (V-trace's and Retrace's truncated ratios, computed
    under `no_grad`) never show in the loss's graph.

    ## Why is this bad?
    The ratio is how the policy's gradient enters PPO's clipped objective: its numerator must be
    the current policy's log-probability with its gradient, its denominator a constant from the
    rollout. A ratio of a value over itself is 1 with a gradient of exactly 0: the actor gets no
    gradient from the objective (an entropy bonus alone moves it), while the critic trains and
    the loss looks fine. An inverted ratio trains the policy away from the actions the advantage
    rewards. The same goes for an off-policy bandit's weight `pi(a|x) / p_logged`: written
    `p_logged / pi(a|x)` it rewards the policy for lowering the probability of the actions that
    were rewarded.

    ## Example
    ```python
    logp = dist.log_prob(actions)
    old_logp = logp
    ratio = torch.exp(logp - old_logp)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        old_logp = policy(states).log_prob(actions)  # from the rollout, before the update epochs
    ...
    ratio = torch.exp(dist.log_prob(actions) - old_logp)
    ```

    ## Stays silent on
    The old log-probability from a rollout under `no_grad` or detached; TRPO-like
    `exp(logp - logp.detach())`; DPO-style log-ratios against a frozen reference model (no
    `exp` of them, and the reference carries no gradient); GRPO's k3 KL estimator
    `exp(ref_logp - logp) - (ref_logp - logp) - 1` (over token log-probabilities an
    `exp(constant - logp)` is not judged as an inverted ratio); importance weights of a learned
    proposal at a sample that carries gradient (IWAE); exps of values no optimizer steps;
    log-probabilities made neither by `torch.distributions` nor by gathering a `log_softmax`
    (`take_along_dim`, a log-probability of the script's own); an IPS weight written right,
    `probs.gather(1, a) / propensity` or `exp(log_pi_a - log(propensity))`; in the source, KL
    estimates (`approx_kl = (old_logp - logp).mean()`), a reference model's ratio and values
    that name no policy (`old_values - values`).
    """

    code = "GD147"
    slug = "importance-ratio-wrong"
    severity = Severity.WARNING
    summary = ("a policy-gradient importance ratio carries no gradient or the wrong one: the old "
               "log-probability is the current one (the ratio is 1, its gradient 0), carries "
               "gradient, or is the numerator")
    fix = ("compute the old log-probability in the rollout under torch.no_grad() and use "
           "ratio = torch.exp(logp - old_logp)")

    def check(self, a):
        reported = set()
        for finding in self._from_graph(a):
            if finding.location is not None:
                reported.add((finding.location.path, finding.location.line))
            yield finding
        # a ratio made without gradient (V-trace's and Retrace's truncated weights, computed
        # under no_grad) leaves no trace in the loss's graph: its text is all there is
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, target, behaviour, current in inverted_importance_ratios(a.source.full(path)):
                if (path, line) in reported:
                    continue
                yield self.finding(
                    f"the importance ratio is inverted (`{text}`): `{target}` is the behaviour "
                    f"policy `{behaviour}` over the current one `{current}`, where importance "
                    f"sampling weighs by the current policy over the one that acted, so actions the "
                    f"policy now prefers get less weight and those it avoids more (and a "
                    f"truncation clips the wrong transitions)",
                    Location(path, line, None),
                    evidence={"fault": "inverted", "source": True, "ratio": target,
                              "behaviour": behaviour, "current": current},
                    fix=f"swap the two sides: `{current}` minus (or over) `{behaviour}`")

    def _from_graph(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("ratio_fault"):
            fault = e.get("fault")
            if fault not in _WHAT:
                continue
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            loc, text = e.loc, None
            if loc is not None:
                line = a.source.ratio_line(loc.path, loc.line, fault)
                if line is not None:
                    loc, text = Location(loc.path, line[0], loc.function), line[1]
            said = f"`{text}`" if text else "the ratio made from this log_prob"
            fix = _FIX[fault]
            if fault == "inverted" and e.get("dist") == "softmax":  # p_logged / p
                yield self.finding(
                    f"the importance weight is inverted ({said}): the policy's probability, the "
                    f"one with gradient, is the divisor, so the weight is p_logged / p instead of "
                    f"p / p_logged, and maximising weight * reward lowers the probability of the "
                    f"logged actions that were rewarded in {a.names(pids)}",
                    loc, step=a.next_step_number(e.seq),
                    evidence={"fault": fault, "dist": "softmax", "params": [a.param_name(p) for p in pids[:16]]},
                    fix=("divide the policy's probability by the logged one: "
                         "w = pi_a / propensity (the logged propensity is the constant denominator)"))
                continue
            if fault == "denominator" and text and "exp" in text:  # recomputed inline in the ratio
                fix = ("compute the old log-probability once, in the rollout under torch.no_grad(), "
                       "and use that stored value here instead of a fresh call with gradient")
            yield self.finding(
                _WHAT[fault].format(text=said, params=a.names(pids), dist=e.get("dist") or "distribution"),
                loc, step=a.next_step_number(e.seq),
                evidence={"fault": fault, "dist": e.get("dist"), "params": [a.param_name(p) for p in pids[:16]]},
                fix=fix)
