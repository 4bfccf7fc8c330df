from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class SurrogateMinimised(Rule):
    """
    ## What it does
    Finds PPO's clipped surrogate minimised instead of maximised: the loss reaches
    `min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A)` with a positive sign
    (`loss = torch.min(surr1, surr2).mean()` without its minus), or a `max` of such a pair with
    a negative sign. `log_prob` of `torch.distributions` is wrapped, and so are gathers of
    `log_softmax` outputs (token-level PPO on a language model); at the first backwards that
    follow, the loss's linear top (sums, means, negations, constant factors) is walked with each
    term's sign to the `minimum`/`maximum` of a ratio's product and its clamped copy's. It
    points at the line that takes the `min` or `max`.

    ## Why is this bad?
    The clipped surrogate is a pessimistic bound that PPO maximises, so the loss is its
    negation: `-min(r * A, clip(r) * A)`, or `max(-r * A, -clip(r) * A)`. Minimised as it is,
    the policy's gradient points the other way: it lowers the probability of the actions with a
    positive advantage and raises the others' (or, for `-max(...)`, it follows an optimistic
    bound that clips nothing). Training runs and the loss goes down while the returns get worse.

    ## Example
    ```python
    surr1 = ratio * advantages
    surr2 = torch.clamp(ratio, 1 - clip, 1 + clip) * advantages
    loss = torch.min(surr1, surr2).mean()
    ```

    ## Use instead
    ```python
    loss = -torch.min(surr1, surr2).mean()
    ```

    ## Stays silent on
    `-torch.min(...)`; CleanRL's `torch.max(-A * ratio, -A * clamp(ratio))` (a `max` reached
    with a positive sign: its advantage's sign is in the data, not in the graph, so a forgotten
    minus there is not seen); PPO's clipped value loss `max((v - R)**2, (v_clip - R)**2)`;
    a min or max that is no clipped pair of one ratio.
    """

    code = "GD261"
    slug = "surrogate-minimised"
    severity = Severity.WARNING
    summary = ("PPO's clipped surrogate min(ratio * A, clip(ratio) * A) is minimised: its sign is "
               "flipped, so the policy moves away from the actions with a positive advantage")
    fix = "negate the clipped surrogate: loss = -torch.min(surr1, surr2).mean()"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("ratio_fault"):
            if e.get("fault") != "minimised":
                continue
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            loc, text = e.loc, None
            if loc is not None:
                line = a.source.ratio_line(loc.path, loc.line, "minimised")
                if line is not None:
                    loc, text = Location(loc.path, line[0], loc.function), line[1]
            said = f"`{text}`" if text else "the loss"
            yield self.finding(
                f"the clipped surrogate is minimised: {said} reaches the minimised loss as a "
                f"min of ratio * advantage and its clipped copy with a positive sign (or as a max "
                f"with a negative one), so the gradient of {a.names(pids)} points away from the "
                f"actions the advantage rewards",
                loc, step=a.next_step_number(e.seq),
                evidence={"dist": e.get("dist"), "params": [a.param_name(p) for p in pids[:16]]})
            return
