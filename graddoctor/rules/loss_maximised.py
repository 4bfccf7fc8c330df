from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule, related

# the loss functions' autograd nodes, as a user knows them
_CRITERIA = {
    "NllLossBackward0": "cross-entropy (negative log-likelihood)",
    "NllLoss2DBackward0": "cross-entropy (negative log-likelihood)",
    "MseLossBackward0": "the mean squared error",
    "BinaryCrossEntropyBackward0": "binary cross-entropy",
    "BinaryCrossEntropyWithLogitsBackward0": "binary cross-entropy",
    "SmoothL1LossBackward0": "the smooth L1 loss",
    "HuberLossBackward0": "the Huber loss",
}


def _interleaved(a, opt, steps) -> bool:
    """Whether another optimizer steps between this one's first and last step (a GAN's two
    players, an adversary), as opposed to optimizers of successive phases (pre-training, then
    fine-tuning), each of which minimises its own loss."""
    first, last = steps[0].seq, steps[-1].seq
    stepped = {s["opt"] for s in a.steps}
    if any(other not in stepped for other in a.optimizers):
        return True  # an optimizer the replay never saw step: its part in the game is unknown
    return any(s["opt"] != opt and first < s.seq < last for s in a.steps)


def _negated(text: str) -> str | None:
    """``loss = expr`` as ``loss = -(expr)``, or None when the text is no single assignment."""
    name, sep, value = text.partition(" = ")
    if not sep or not name.strip().isidentifier() or "=" in value.replace("==", ""):
        return None
    return f"{name.strip()} = -({value.strip()})"


class LossMaximised(Rule):
    """
    ## What it does
    Finds a training loop whose only optimizer steps on the negative of a torch loss function
    (`loss = -F.cross_entropy(out, y)`, `criterion(out, y) * -1`, `1 - criterion(out, y)`) or on
    its reciprocal (`1 / F.mse_loss(out, y)`, `1 / (loss + eps)`) at every update: gradient
    ascent on a loss that is minimised by definition. The same mistake written by hand: a
    negative log-likelihood without its minus (`(1 - p_t) ** gamma * logp_t`, `(w[y] *
    log_probs[range(n), y]).mean()`), where the loss rises with the log-probability of the labels
    the DataLoader served (a `gather` or index of a `log_softmax`, reached through means, sums
    and factors of one sign only).

    ## Why is this bad?
    The optimizer minimises what it is given; minimising `-loss` maximises the loss. The model
    is trained to be as wrong as it can: cross-entropy grows without bound, and nothing crashes
    until the numbers overflow. A loss that goes down "nicely" in the log (it is negative) hides it.

    ## Example
    ```python
    loss = -criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    ## Stays silent on
    Optimizers that step between each other's steps, where maximising a loss is a player's move
    (a minimax GAN generator's `-BCE(D(G(z)), 0)`, an adversary); an optimizer of plain tensors
    in a run of several (a perturbation optimised against the trained model); optimizers of
    successive phases (pre-training, then fine-tuning) are each judged on their own;
    a negated log-likelihood or score written by hand (`-dist.log_prob(x).mean()`,
    `-(log_probs * advantages).mean()`: the negation *makes* the loss); the reciprocal of a
    score written by hand (`1 / (dice + eps)`); a loss divided by a computed baseline
    (`mse / baseline.detach()`); a sum of terms one of
    which is negated (a gradient-reversal objective); `F.l1_loss` and `kl_div`, which torch
    builds from plain ops (not recognised). For a hand-written log-likelihood: one picked at
    sampled actions rather than the served labels (REINFORCE minimising a cost's
    `(cost * logp_a).mean()`), weighted by factors of both signs (advantages), or a loss that
    also holds a negated pick (a contrast of two likelihoods); a negative entropy
    (`(p * log_p).sum(1)`: no pick).
    """

    code = "GD127"
    slug = "loss-maximised"
    severity = Severity.WARNING
    summary = ("the optimizer steps on the negative of a loss function (-criterion(out, y)): "
               "every update increases the loss")
    fix = "backpropagate the loss itself, without the minus sign"

    def check(self, a):
        windows = a.ledger.windows
        steps_of: dict[int, list] = {}  # closure steps too: a framework's backward runs in one
        for step in a.steps:
            steps_of.setdefault(step["opt"], []).append(step)
        for opt, steps in steps_of.items():
            if _interleaved(a, opt, steps):
                continue  # another optimizer steps between its steps: an adversary may ascend
            if len(steps_of) > 1 and not all(
                    (a.params.get(pid) or {}).get("is_parameter") for pid in a.opt_params.get(opt, ())):
                continue  # a phase that optimises plain tensors (an attack's perturbation)
            negated = [(step, window) for step in steps
                       if (window := windows.get(step.seq)) and all(b.get("loss_negated") for b in window)]
            if len(negated) < 2 or len(negated) != len(steps):
                continue
            first = negated[0][1][0]
            node = first.get("loss_negated")
            reciprocal = node.startswith("1/")
            node = node[2:] if reciprocal else node
            what = _CRITERIA.get(node, f"a loss function (`{node}`)")
            loc, text = first.loc, None
            if loc is not None:
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if assigned is not None:
                    loc, text = Location(loc.path, assigned[0]), assigned[1]
            said = f"`{text}`" if text else "the loss"
            yield self.finding(
                f"{said} is the {'reciprocal' if reciprocal else 'negative'} of {what}, and "
                f"{a.optimizer_class(opt)} minimises it at every update: each step makes the loss "
                f"function larger, so the model is trained away from its targets (the loss printed "
                f"goes down because it is {'one over the loss function' if reciprocal else 'negative'})",
                loc,
                related=(related(negated[0][0], "the step that applies its gradient"),),
                step=a.step_number.get(negated[0][0].seq),
                evidence={"criterion": node, "optimizer": opt},
                fix=("backpropagate the loss itself, without the "
                     + ("reciprocal (`loss = criterion(out, y)`, not `1 / criterion(out, y)`)"
                        if reciprocal else "minus sign or the negative factor")
                     + " (to maximise a score, negate the score, not a loss function)"))
        yield from self._hand_written(a, steps_of)

    def _hand_written(self, a, steps_of):
        """A hand-written log-likelihood of the served labels minimised (``loglik_minimised``)
        by optimizers that each minimise their own loss, with two steps or more."""
        events = a.by_kind.get("loglik_minimised", ())
        if not events or sum(len(s) for s in steps_of.values()) < 2:
            return
        for opt, steps in steps_of.items():
            if _interleaved(a, opt, steps):
                return  # a player of a game may ascend on purpose
            if len(steps_of) > 1 and not all(
                    (a.params.get(pid) or {}).get("is_parameter") for pid in a.opt_params.get(opt, ())):
                return  # a phase that optimises plain tensors (an attack's perturbation)
        told: set = set()
        for event in events:
            loc = event.loc
            if loc is None:
                continue
            text = None
            found = a.source.unsigned_loglik_line(loc.path)
            if found is None:
                found = a.source.loss_assignment(loc.path, loc.line)
            if found is not None:
                loc, text = Location(loc.path, found[0]), found[1]
            if (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            opt = next(iter(steps_of))
            said = f"`{text}`" if text else "the loss"
            yield self.finding(
                f"{said} grows with the log-probability the model gives the served labels (picked "
                f"from a log_softmax, weighted only by non-negative factors, with no minus sign), "
                f"and {a.optimizer_class(opt)} minimises it: each step lowers the probability of the "
                f"right class, so the model is trained away from its labels (the printed loss is "
                f"negative and keeps falling)",
                loc,
                evidence={"picks": event.get("picks"), "optimizer": opt},
                fix=("negate the log-likelihood: a negative log-likelihood is `-(weight * log_prob)`"
                     + (f" (`{_negated(text)}`)" if text and _negated(text) else "")))
