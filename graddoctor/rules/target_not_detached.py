from __future__ import annotations

import ast

from ..findings import Severity
from ..location import Location
from .base import Rule

# what a user calls each loss
_LOSS = {"mse_loss": "mse_loss", "l1_loss": "l1_loss", "smooth_l1_loss": "smooth_l1_loss",
         "huber_loss": "huber_loss", "kl_div": "kl_div", "binary_cross_entropy": "binary_cross_entropy",
         "binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
         "cross_entropy": "cross_entropy (probability targets)"}


def _operand(text: str) -> str:
    """``text`` as the receiver of a method call: in parentheses unless it is a name, an
    attribute, a call or a subscript."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return f"({text})"
    return text if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({text})"


# what the target is in each hand-written comparison
_ROLE = {"cross-entropy": "the distribution that multiplies the log-probabilities",
         "squared error": "the subtracted side", "cosine similarity": "the second operand"}


def _target_made(a, loc):
    """Where the target given by name to the loss call on ``loc``'s line was computed (``target
    = r + gamma * q(s2).max(1).values``): the computation to put under ``no_grad``; the call
    when the target is written inline or not found."""
    if loc is None:
        return loc
    made = a.source.target_made(loc.path, loc.line)
    return Location(loc.path, made[0]) if made and made[0] < loc.line else loc


class TargetNotDetached(Rule):
    """
    ## What it does
    Finds a loss whose *target* is computed by the model being trained and still carries its
    gradient: `F.smooth_l1_loss(q(s).gather(1, a), r + gamma * q(s2).max(1)[0])` (a DQN target
    built without `torch.no_grad()`), `F.kl_div(log_softmax(model(x_strong)),
    softmax(model(x_weak)))` (a pseudo-label that is not detached), `mse(pred, encoder(next_x))`.
    It looks at `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`,
    `binary_cross_entropy(_with_logits)` and `cross_entropy` with probability targets (their
    `nn` modules too) on the first calls, and at the same comparisons written by hand, read from
    the loss's graph at the first backwards of each backward line: a distribution (a softmax, a
    sigmoid, an exp, a `torch.where` or a sharpening of one) multiplying a log-probability
    (`-(q * log_softmax(z)).sum(-1)`, `p_t * (log p_t - log p_s)`, a binary cross-entropy), a
    squared or absolute difference of two computed sides, a cosine of two normalised ones
    (SimSiam's, BYOL's loss). It reports when the target needs a gradient and its graph reaches
    parameters that an optimizer steps and that the input's graph reaches too. It points at the
    statement that computes a target given to the loss by name (the one to put under
    `no_grad`), else at the loss call, or at the statement that computes the hand-written
    comparison.

    ## Why is this bad?
    A target is what the prediction should move to. When its gradient is kept, each step also
    moves the target towards the prediction: a Q-network's bootstrapped target drifts with every
    update (the "residual gradient" that learns far more slowly and to another fixed point), a
    pseudo-label collapses to whatever the model predicts most easily, a self-distilled
    teacher is pulled down to its student, a latent target or SimSiam's projection shrinks to a
    constant. Nothing fails and the loss goes down; the model is just not trained towards the
    targets the algorithm assumes.

    ## Example
    ```python
    probs = torch.softmax(model(x_weak), dim=-1)
    mask = probs.max(-1).values.ge(0.95).float()
    loss_u = (-(probs * F.log_softmax(model(x_strong), dim=-1)).sum(-1) * mask).mean()
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        probs = torch.softmax(model(x_weak), dim=-1)
    mask = probs.max(-1).values.ge(0.95).float()
    loss_u = (-(probs * F.log_softmax(model(x_strong), dim=-1)).sum(-1) * mask).mean()
    ```

    ## Stays silent on
    Targets that are data or detached (`.detach()`, `torch.no_grad()`, an argmax or one-hot
    pseudo-label, which has no gradient); a target network or teacher the optimizer does not
    step (a copy, an EMA, DINO's teacher); one distribution on both sides (entropy minimisation's
    `-(p * log p)`); symmetric consistencies that train both sides on purpose: a Π-model's
    `mse(softmax(f(x1)), softmax(f(x2)))` (like outputs of one layer, built-in or by hand),
    R-Drop's `kl(p1 || p2) + kl(p2 || p1)` (the pair both ways round, built-in or by hand); a
    Jensen-Shannon term whose input is made from its targets (AugMix's mixture); two separate
    models distilling each other (no parameter in common); a log-likelihood weighted by a
    computed value that is no distribution (a policy gradient's advantage:
    advantage-not-detached's); metric learning, where one side is compared by distance or cosine
    with two others or more (a triplet's anchor, a query and its documents); a squared
    difference scaled by a learned variance (a Gaussian KL
    between a posterior and a prior sharing a trunk); a physics-informed residual whose sides
    are derivatives of the model taken with `torch.autograd.grad(..., create_graph=True)`
    (`u_t - k * u_xx`, `du - r * u * (1 - u)`: the terms of one equation); a squared residual
    whose first side holds a policy's log-probabilities among its terms, a balance or
    consistency equation trained through every term (a GFlowNet's detailed or trajectory
    balance, `mse(log_F(s) + log_pf, log_F(s') + log_pb)`; path consistency learning's
    `V(s) + tau * log_pi` against `r + gamma * V(s')`, or `V(s)` against `r - tau * log_pi +
    gamma * V(s')` with the policy's log-probability at the states the value reads), where a
    bootstrapped regression
    predicts a value (`q(s).gather(1, a)`); contrastive losses (InfoNCE, CLIP: the logits are a product of
    both views, the targets are data); a target that the same loss also fits to labels (TRADES'
    `kl(log_softmax(model(x_adv)), softmax(model(x)))` beside `cross_entropy(model(x), y)`);
    a loss differentiated only with respect to its inputs (an attack's
    `torch.autograd.grad(loss_kl, [x_adv])`).
    """

    code = "GD245"
    slug = "target-not-detached"
    severity = Severity.WARNING
    summary = ("a loss's target is computed by the model being trained and keeps its gradient: "
               "each step also moves the target towards the prediction")
    fix = "compute the target under torch.no_grad() or pass target.detach()"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("target_grad"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # the target reaches tensors no optimizer steps
            fn = e.get("fn") or ""
            evidence = {"function": fn, "params": pids[:16],
                        "input_op": e.get("input_op"), "target_op": e.get("target_op")}
            if fn.startswith("hand-written "):
                yield self._handwritten(a, e, fn, pids, evidence)
                continue
            shown = _LOSS.get(fn, fn)
            yield self.finding(
                f"the target given to {shown} here is computed by the model being trained and keeps "
                f"its gradient: the loss's gradient flows into {a.names(pids)} through the target "
                f"as well as through the input, so each step also moves the target towards the "
                f"prediction (a bootstrapped or pseudo-label target then chases the model). If "
                f"both sides are meant to train (a symmetric consistency), nothing is wrong; "
                f"otherwise detach the target",
                _target_made(a, e.loc), step=a.next_step_number(e.seq), evidence=evidence,
                fix=("compute the target without gradient: wrap its computation in "
                     "`with torch.no_grad():` or pass `target.detach()` to the loss"))

    def _handwritten(self, a, e, fn: str, pids: list, evidence: dict):
        """A comparison read from the loss's graph at its backward: the finding points at the
        statement that computes it when the script's text shows it."""
        form = fn.removeprefix("hand-written ")
        loc, target = e.loc, None
        if loc is not None:
            found = a.source.comparison_line(loc.path, loc.line, form)
            if found is not None:
                loc, target = Location(loc.path, found[0]), found[2]
        role = _ROLE.get(form, "the target side")
        where = "here" if target else "in the loss backpropagated here"
        said = f"the target of the {fn} {where}, `{target}` ({role})," if target else \
            f"the target of the {fn} {where} ({role})"
        shown = f"{_operand(target) if target else 'target'}.detach()"
        return self.finding(
            f"{said} is computed by the model being trained and keeps its "
            f"gradient: the loss's gradient flows into {a.names(pids)} through it as well as "
            f"through the prediction it is compared with, so each step also moves the target "
            f"towards the prediction (a pseudo-label or a self-distilled target then chases the "
            f"model, a regression target collapses onto it). If both sides are meant to train "
            f"(a symmetric consistency), nothing is wrong; otherwise detach the target",
            loc, step=a.next_step_number(e.seq), evidence={**evidence, "target": target},
            fix=(f"use `{shown}` in the loss, or compute it under `with torch.no_grad():`"))
