from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule, related


class AdvantageNotDetached(Rule):
    """
    ## What it does
    Finds a policy-gradient loss that multiplies a `torch.distributions` log-probability by a
    weight that still carries gradient into parameters the log-probability does not reach —
    an advantage, return or baseline computed from the critic and not detached
    (`-(dist.log_prob(a) * (returns - value))`) — when an optimizer then applies those
    gradients. Judged on the first backwards after log-probabilities are computed, from the
    loss's autograd graph.

    ## Why is this bad?
    The policy gradient treats the advantage as a constant weight. Left attached, the actor's
    loss also trains the critic, with a gradient of `-log_prob(a)` per sample: the value head is
    pushed up wherever the sampled action was unlikely, which has nothing to do with predicting
    the return. The critic's estimates drift and the advantages built from them get worse; it
    trains, just badly. The same holds for the score-function estimators of variational
    inference (REINFORCE, NVIL, VIMCO): the learning signal `log p(x, z) - log q(z | x) - b`
    weights the score `log q(z | x)` as a constant; left attached, the encoder's term also
    trains the decoder, the prior and the baseline.

    ## Example
    ```python
    advantage = returns - values
    actor_loss = -(dist.log_prob(actions) * advantage).mean()
    critic_loss = advantage.pow(2).mean()
    ```

    ## Use instead
    ```python
    advantage = returns - values
    actor_loss = -(dist.log_prob(actions) * advantage.detach()).mean()
    critic_loss = advantage.pow(2).mean()
    ```

    ## Stays silent on
    A detached advantage (`.detach()`, `.item()`, computed under `no_grad`, from a buffer);
    an entropy written as `probs * log_probs` (both factors reach the same parameters), an
    analytic KL `q.probs * (log q - log p)` (an exp of a log-probability is no score); PPO's
    ratio times a stored advantage; a weight whose gradient no optimizer applies (a temperature
    cleared before its own backward); log-probabilities not made by `torch.distributions`.
    """

    code = "GD247"
    slug = "advantage-not-detached"
    severity = Severity.WARNING
    summary = ("a policy-gradient loss weights log_prob by an advantage that is not detached: "
               "the actor's loss trains the critic")
    fix = "detach the weight of the log-probability: (log_prob * advantage.detach())"

    def check(self, a):
        backwards = a.of_kind("backward")
        for e in a.of_kind("advantage_grad"):
            pids = set(e["params"])
            backward = next((b for b in backwards if b.seq > e.seq and b.loc == e.loc), None)
            if backward is None:
                continue
            steps = _applying_steps(a, backward, pids)
            if not steps:
                continue  # cleared before any step applied it: wasted, not wrong
            loc, text, score = e.loc, None, False
            if loc is not None:
                line = a.source.advantage_line(loc.path, loc.line)
                if line is None:
                    line = a.source.score_weight_line(loc.path, loc.line)
                    score = line is not None
                if line is not None:
                    loc, text = Location(loc.path, line[0], loc.function), line[1]
            said = f"`{text}` keeps" if text else "the weight of log_prob keeps"
            shown = sorted(pids & set(a.params))
            names = a.names(shown) if shown else "the critic"
            if score:  # a variational learning signal weighting the score log q(z)
                name = _name(text)
                message = (f"{said} the gradient of {names}: the score-function term "
                           f"{name} * log_prob(z) also trains those parameters, along log_prob(z) "
                           f"per sample, instead of weighting the score by a constant")
                fix = (f"detach the learning signal where the score term uses it: "
                       f"{name}.detach() * log_prob(z) (the model's own loss keeps its gradient)")
            else:
                message = (f"{said} the gradient of {names}: the actor's "
                           f"loss log_prob(a) * advantage also trains those parameters, along "
                           f"-log_prob(a) per sample, which has nothing to do with predicting "
                           f"the return")
                fix = (f"detach the advantage where the actor's loss uses it: "
                       f"log_prob * {_name(text)}.detach() (the critic's own loss keeps its "
                       f"gradient)")
            yield self.finding(
                message, loc, related=(related(steps[0], "the step that applies it"),),
                step=a.step_number.get(steps[0].seq), fix=fix,
                evidence={"params": [a.param_name(p) for p in shown]})


def _applying_steps(a, backward, pids: set) -> list:
    """The first step of each optimizer after ``backward`` that applies some of ``pids``' grads
    as it left them: not cleared in between (``zero_grad`` of that optimizer before its own
    backward, as SAC's temperature optimizer does)."""
    left, seen, out = set(pids), set(), []
    for e in a.of_kind("clear", "step"):
        if e.seq <= backward.seq:
            continue
        if e.kind == "clear":
            left -= set(e.get("params") or ())
            continue
        opt = e.get("opt")
        if opt in seen or e.get("skipped"):
            continue
        seen.add(opt)
        if left & set(a.opt_params.get(opt, ())):
            out.append(e)
    return out


def _name(text: str | None) -> str:
    if text and "=" in text:
        target = text.split("=", 1)[0].strip()
        if target.isidentifier():
            return target
    return "advantage"
