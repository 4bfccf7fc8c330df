from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Related, Rule


class PenaltyWithoutGraph(Rule):
    """
    ## What it does
    Finds a gradient penalty built from `torch.autograd.grad(...)` called without
    `create_graph=True` whose result is added into the loss that is then backpropagated (an R1
    or WGAN-GP penalty, a gradient-norm regulariser, input-gradient smoothing).

    ## Why is this bad?
    Without `create_graph=True`, `autograd.grad` returns plain tensors with no history: the
    penalty computed from them is a constant. Adding it to the loss changes the number printed
    but not one gradient: the regulariser does nothing, and the run trains as if it were not
    there (a WGAN-GP critic without its Lipschitz constraint, an R1-regularised GAN without R1).

    ## Example
    ```python
    grad, = torch.autograd.grad(d_real.sum(), real_in, retain_graph=True)
    r1 = grad.pow(2).sum(1).mean()
    loss = d_loss + 10.0 * r1
    loss.backward()
    ```

    ## Use instead
    ```python
    grad, = torch.autograd.grad(d_real.sum(), real_in, create_graph=True)
    r1 = grad.pow(2).sum(1).mean()
    loss = d_loss + 10.0 * r1
    loss.backward()
    ```

    ## Stays silent on
    `create_graph=True`; an input gradient used to perturb the input (FGSM, adversarial
    training: the loss is computed by the model on the perturbed input); a gradient computed
    for logging or for a hand-written update that never reaches the backpropagated loss.
    """

    code = "GD237"
    slug = "penalty-without-graph"
    severity = Severity.WARNING
    summary = "a gradient penalty from torch.autograd.grad without create_graph=True: it adds a constant, no gradient"
    fix = "pass create_graph=True to torch.autograd.grad so that the penalty can be backpropagated"

    def check(self, a):
        backwards = a.of_kind("backward")
        seen = set()
        for e in a.of_kind("functional_grad"):
            if e.get("api") != "torch.autograd.grad" or e.get("create_graph") is not False:
                continue
            if e.loc is None or (e.loc.path, e.loc.line) in seen:
                continue
            if not any(b.seq > e.seq for b in backwards):
                continue
            line = a.source.result_reaches_backward(e.loc.path, e.loc.line)
            if line is None:
                continue
            seen.add((e.loc.path, e.loc.line))
            yield self.finding(
                "torch.autograd.grad is called without create_graph=True, and the loss "
                f"backpropagated at line {line} is computed from its result: that result has no "
                "history, so the penalty is a constant that changes the loss value but no gradient",
                e.loc, related=(Related(Location(e.loc.path, line), "the backward of that loss"),),
                evidence={"backward_line": line})
