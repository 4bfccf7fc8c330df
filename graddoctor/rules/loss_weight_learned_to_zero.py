from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


def _element_name(name: str, indices) -> str:
    """``log_vars[2]`` for a weight whose terms select elements of it, else its name."""
    if not indices:
        return name
    return " and ".join(f"{name}[{i}]" for i in indices)


class LossWeightLearnedToZero(Rule):
    """
    ## What it does
    Finds a learned tensor that reaches the loss only as a monotone factor of loss terms —
    `exp(-s) * task_loss`, `task_loss / (2 * sigma**2)`, `softplus(w) * task_loss`,
    `w * aux_loss` — with no other term to hold it (Kendall's uncertainty weighting without its
    `+ s` or `+ log(sigma)`), and that the optimizer moved, at each of the first backwards of its
    loss's line, only the way that factor's gradient always points. Read from the autograd graph
    at the first backwards: the loss's linear top is walked with each node's sign; the weighted
    term is a product (or quotient) reached with a positive sign whose one side is a loss by
    construction (a torch loss function, a square, an absolute value, a norm, their sums, means
    and stacks) and whose other side is a chain of monotone ops (exp, negation, reciprocal,
    softplus, sigmoid, powers, constants, indexing) down to the learned tensor; the factor's
    values are those autograd saved for the product. The same when the weight's only other path
    is a regulariser with the wrong sign: a term of the loss's linear top that is a monotone
    chain down to the weight (`- s`, `- log(sigma)`) and whose slope along it has the weighted
    term's sign (`exp(-s) * loss - s`: both fall as `s` grows, so the loss has no minimum);
    then it points at the line that subtracts the weight.

    ## Why is this bad?
    The loss's derivative along the weight is the task loss itself times the factor's slope:
    it has the same sign at every step, whatever the data. Minimising the loss then shrinks
    the factor without end (`s` grows, `sigma` grows, `w` falls to 0 and below): the task
    losses it weighs are switched off (their gradients fade by `exp(-s)`), or, for a plain
    weight `w`, the loss is unbounded below. The printed loss falls nicely while the model
    stops learning the tasks.

    ## Example
    ```python
    loss = torch.exp(-s[0]) * l_reg + torch.exp(-s[1]) * l_cls
    ```

    ## Use instead
    ```python
    loss = torch.exp(-s[0]) * l_reg + s[0] + torch.exp(-s[1]) * l_cls + s[1]
    ```

    ## Stays silent on
    Kendall's weights with `+ s` or `+ log(sigma)` (another path bounds the weight), however
    written (`- (-s)`, `0.5 * s`); a weight whose term rises as the regulariser falls
    (`exp(s) * loss - s`: a minimum exists); a subtracted regulariser beside another path that
    holds the weight; SAC's
    entropy temperature (`-(log_alpha * (logp + target_entropy).detach()).mean()`: the factor
    is no loss and changes sign); a learned CLIP logit scale inside the softmax; a learned
    distillation temperature that also divides the logits; GradNorm-style weights whose
    gradient comes from their own loss and which are renormalised after each step, a Lagrange
    multiplier trained by ascent (`maximize=True`) or a weight that stood still (the factor did
    not move only one way); weights of terms that are no loss by construction (a hand-written
    KL, a log-likelihood); weights on an accelerator or with more than 64 elements (not read).
    """

    code = "GD192"
    slug = "loss-weight-learned-to-zero"
    severity = Severity.WARNING
    summary = ("a learned weight reaches the loss only as a factor of loss terms (exp(-s) * loss "
               "without + s): the optimizer shrinks it without end and switches the losses off")
    fix = "add the weight's regulariser to the loss (exp(-s) * loss + s, loss / (2 * sigma**2) + log(sigma))"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("loss_weight_learned"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            kinds = e.get("kinds") or ()
            picked = dict(zip(e.get("params") or (), e.get("elements") or ()))
            names = ", ".join(_element_name(a.names([pid]), picked.get(pid)) for pid in pids)
            one = len(pids) == 1 and len(picked.get(pids[0]) or ()) <= 1
            loc, text = e.loc, None
            if loc is not None:
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if assigned is not None:
                    loc, text = Location(loc.path, assigned[0]), assigned[1]
            flipped = [pid for pid, r in zip(e.get("params") or (), e.get("reversed") or ())
                       if r and pid in pids]
            if flipped:
                yield self._reversed_finding(a, e, flipped, picked, loc, text)
                continue
            said = f"`{text}`" if text else "the loss"
            how = ("a divisor of" if kinds == ["div"] else "a factor of")
            yield self.finding(
                f"{names} reach{'es' if one else ''} {said} only as {how} "
                f"loss terms, which are never negative: the loss's gradient along "
                f"{'it' if one else 'them'} has the same sign at every step, and the "
                f"optimizer moved {'it' if one else 'them'} only that way over the "
                f"first {e.get('backwards')} backwards. Nothing holds the weight, so it is learned "
                f"away: the factor shrinks without end and the terms it weighs are switched off "
                f"(a plain weight goes below 0 and the loss has no lower bound)",
                loc, step=a.next_step_number(e.seq),
                evidence={"params": pids[:16], "kinds": list(kinds), "terms": e.get("terms")},
                fix=("add the weight's regulariser to the loss: `exp(-s) * loss + s` "
                     "(Kendall's uncertainty weighting), `loss / (2 * sigma**2) + log(sigma)`; or "
                     "keep the weight fixed, or renormalise learned weights to a fixed sum after "
                     "each step"))

    def _reversed_finding(self, a, e, pids, picked, loc, text):
        """Kendall's weighting whose regulariser has the wrong sign (``exp(-s) * loss - s``):
        pointed at the line that subtracts the weight when the script has one such line."""
        names = [_element_name(a.names([pid]), picked.get(pid)) for pid in pids]
        shown = ", ".join(names)
        line = _subtracting_line(a, e, names)
        if line is not None:
            loc, text = Location(e.loc.path, line[0]), line[1]
        said = f"`{text}`" if text else "the loss"
        return self.finding(
            f"{shown} reach{'es' if len(names) == 1 else ''} {said} as a factor of loss terms and "
            f"otherwise only through a regulariser with the sign that pushes {'it' if len(names) == 1 else 'them'} "
            f"the same way: both the weighted term and the regulariser fall as the factor "
            f"shrinks, so the loss has no minimum along the weight, and the optimizer moved it "
            f"only that way over the first {e.get('backwards')} backwards. The factor shrinks "
            f"without end, the terms it weighs are switched off, and the loss falls without bound",
            loc, step=a.next_step_number(e.seq),
            evidence={"params": pids[:16], "kinds": list(e.get("kinds") or ()),
                      "terms": e.get("terms"), "reversed": True},
            fix="give the regulariser the sign that holds the weight: `exp(-s) * loss + s` "
                "(not `- s`), `loss / (2 * sigma**2) + log(sigma)`")



def _subtracting_line(a, e, names: list[str]):
    """``(line, text)`` of the one line of the backward's file that subtracts one of the weights
    (``... - log_vars[0]``, not ``exp(-log_vars[0])``), else None."""
    if e.loc is None:
        return None
    found = sorted({hit for name in names for hit in a.source.subtracting_lines(e.loc.path, name)})
    if not found:  # the weight under another name on the line of its term (s = model.log_vars)
        found = sorted({hit for name in names if name.endswith("]")
                        for hit in a.source.subtracted_beside_factor(e.loc.path, name[name.rindex("["):])})
    return found[0] if len(found) == 1 else None
