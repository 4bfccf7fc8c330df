from __future__ import annotations

from ..findings import Severity
from .base import Rule

_JUDGED = 2  # backwards at which the term was seen taking its negative side

_FORM = {"where": "`torch.where` between two lines of opposite signs",
         "min": "a minimum of two lines of opposite signs",
         "weights": "a product with weights of both signs"}


class LossTermConcave(Rule):
    """
    ## What it does
    Finds a piecewise-linear loss term that takes its negative side at nearly every element:
    the pinball (quantile) loss with `q` and `q - 1` swapped between the two sides
    (`torch.where(e >= 0, (q - 1) * e, q * e)`, `e * (q - (e >= 0).float())`), or written with
    a minimum where the maximum belongs (`torch.min(q * e, (q - 1) * e)`). At the first
    backwards, `torch.where`, `torch.minimum` / two-tensor `torch.min` of two tensors with
    gradient whose signs are opposite at 95% of the elements, and products of a tensor with
    gradient and constant weights of one or two values, one negative (`q` and `q - 1`), are
    checked: a result negative at 60% of its
    elements or more (and positive at 5% at most) whose autograd node the loss's linear top
    holds with a positive sign (minimised). Reported when that is so at two backwards, at the
    line of the call.

    ## Why is this bad?
    The pinball loss is `max(q * e, (q - 1) * e)`: of two lines of opposite sign it takes the
    positive one, so it is never negative and its minimum is at the q-th quantile. Swapped, it
    takes the negative one: `-|e|`-like, concave, unbounded below. Minimising it pushes every
    prediction away from its target, the quantiles cross and diverge, and the printed loss goes
    down without end.

    ## Example
    ```python
    err = y - pred
    loss = torch.where(err >= 0, (q - 1) * err, q * err).mean()
    ```

    ## Use instead
    ```python
    loss = torch.where(err >= 0, q * err, (q - 1) * err).mean()  # = torch.max(q * err, (q - 1) * err)
    ```

    ## Stays silent on
    The pinball loss written right (with `where`, `max`, or the indicator `e * (q - (e < 0).float())`),
    an expectile loss (`|q - 1{e<0}| * e**2`, never negative), a leaky ReLU or a Huber's
    `where` (branches of one sign), a `where` or a minimum that a loss maximises (held with a
    negative sign), a policy-gradient `-(log_prob * advantage)` (weights of many values, a
    product of both signs). Not judged: tensors on an accelerator, terms computed before the
    first backward's forward window ends.
    """

    code = "GD272"
    slug = "loss-term-concave"
    severity = Severity.WARNING
    summary = ("a piecewise-linear loss term takes its negative side everywhere (a pinball loss with "
               "q and q-1 swapped): it is concave, and minimising it pushes predictions away from "
               "their targets")
    fix = ("weigh the residual e = y - pred by q where it is positive and by q - 1 where it is "
           "negative: torch.max(q * e, (q - 1) * e)")

    def check(self, a):
        seen: dict = {}
        for e in a.of_kind("concave_term"):
            if e.loc is None:
                continue
            seen.setdefault((e.loc.path, e.loc.line), []).append(e)
        for (path, line), events in seen.items():
            if len(events) < _JUDGED:
                continue
            e = events[-1]
            text = a.source.line_text(path, line).split("  #")[0].strip()
            said = f"`{text}`" if text else "this line"
            yield self.finding(
                f"{said} computes {_FORM.get(e['form'], 'a piecewise-linear term')} that is "
                f"negative at {e['negative']:.0%} of its elements, and the loss minimises it, at "
                f"each of the first {len(events)} backwards: of the two sides it takes the "
                f"negative one, so the term is concave (-|e|-like) and unbounded below; "
                f"minimising it pushes every prediction away from its target (a pinball loss "
                f"with q and q - 1 swapped)",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"form": e["form"], "negative": e["negative"], "backwards": len(events)})
