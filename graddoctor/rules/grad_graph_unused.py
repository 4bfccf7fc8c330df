from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class GradGraphUnused(Rule):
    """
    ## What it does
    Finds gradients taken with `torch.autograd.grad(..., create_graph=True)` that the loss
    backpropagated afterwards never reads: no backward before the optimizer step (and no later
    `torch.autograd.grad`) goes through the graph of the gradients that call returned, at every
    step the call ran (two at least, in the first six steps). It points at the
    statement that computes the loss backpropagated (`loss = ...` for `loss.backward()`, after
    the call; the statement of the term when that loss only sums one term per task,
    `meta_loss = meta_loss + query_loss`) when the script has one, else at the
    `autograd.grad` call.

    ## Why is this bad?
    `create_graph=True` is asked for so that the update differentiates through the gradient:
    MAML's outer loss through the adapted weights, a gradient penalty (WGAN-GP, R1), a
    physics-informed residual, double backpropagation. When the loss that is backpropagated
    does not read it (the query loss computed with the unadapted model, the adapted weights
    overwritten by a loop variable, the penalty computed and left out of the sum, or added as a
    float with `.item()`), that term is missing from every update: MAML trains a plain
    multi-task model, the critic is unconstrained, the PDE is never enforced. Nothing fails.

    ## Example
    ```python
    grads = torch.autograd.grad(loss, params.values(), create_graph=True)
    fast = {n: p - inner_lr * g for (n, p), g in zip(params.items(), grads)}
    query_loss = F.mse_loss(model(x_query), y_query)
    query_loss.backward()
    ```

    ## Use instead
    ```python
    grads = torch.autograd.grad(loss, params.values(), create_graph=True)
    fast = {n: p - inner_lr * g for (n, p), g in zip(params.items(), grads)}
    query_loss = F.mse_loss(functional_call(model, fast, (x_query,)), y_query)
    query_loss.backward()
    ```

    ## Stays silent on
    Gradients that a later `autograd.grad` differentiates when that call's result is used in turn
    or carries no graph (a first derivative `u_x` taken again for a `u_xx` the loss reads, a
    Hessian-vector product for a logged curvature; MAML's inner steps each differentiating the
    previous one count only when the query loss reads the last); terms backpropagated by
    a separate backward before the same step; MAML whose query losses are backpropagated one
    task at a time; gradients taken without `create_graph` (first-order MAML, a logged gradient
    norm: they carry no graph); a call whose gradients are used at one step out of several (a
    lazy R1 penalty every k steps); a call seen at one step only; graphs too large to walk
    (20,000 nodes). Not told apart: `create_graph=True` followed by `.detach()` of the gradients
    on purpose (first-order MAML written that way) reads as the bug; pass `create_graph=False`
    there.
    """

    code = "GD193"
    slug = "grad-graph-unused"
    severity = Severity.WARNING
    summary = ("gradients taken with create_graph=True are never differentiated: the loss "
               "backpropagated leaves out the adapted weights, penalty or residual built from them")
    fix = ("make the loss read the gradients' result (the adapted weights through "
           "functional_call, the penalty added as a tensor), or drop create_graph=True")

    def check(self, a):
        for e in a.of_kind("grad_graph_unused"):
            backward = e.get("backward")
            loc, related, text = e.loc, [], None
            backward_loc = Location(backward[0], backward[1]) if backward else None
            if backward_loc is not None and loc is not None and backward_loc.path == loc.path:
                # past a rescale (``meta_loss = meta_loss / tasks``): the statement of its terms
                found = a.source.loss_term_assignment(loc.path, backward_loc.line)
                if found is not None and found[0] > loc.line:
                    # a sum of per-task losses (``meta_loss = meta_loss + query_loss``): the
                    # statement that computes the term
                    found = a.source.accumulated_term(loc.path, found[0], loc.line) or found
                    # the loss that leaves the gradients out, computed after them: the line to change
                    loc, text = Location(loc.path, found[0]), found[1]
                    related.append(Related(e.loc, "the gradients taken with create_graph=True"))
            if backward_loc is not None:
                related.append(Related(backward_loc, "the backward whose loss does not read them"))
            said = (f"the loss computed here (`{text}`) and backpropagated never reads the "
                    f"gradients taken with create_graph=True at line {e.loc.line}"
                    if text else
                    "the gradients torch.autograd.grad returns here are built with "
                    "create_graph=True, so that a backward can differentiate through them, but "
                    "the loss backpropagated before the optimizer step never reads them")
            yield self.finding(
                f"{said} (at {e.get('steps')} steps): the second-order term they were taken for "
                f"(MAML's adapted weights, a gradient penalty, an equation's residual) is missing "
                f"from every update. Look for a loss computed with the unadapted model or "
                f"weights, a term left out of the sum, or one added as a float (.item(), "
                f".detach())",
                loc, related=tuple(related), step=a.next_step_number(e.seq),
                evidence={"steps": e.get("steps"), "call_line": e.loc.line if e.loc else None},
                fix=("make the loss read what these gradients make: evaluate the outer loss "
                     "with the adapted weights (functional_call(model, fast_weights, x)), add "
                     "the penalty to the loss as a tensor; if they are only logged, drop "
                     "create_graph=True"))
