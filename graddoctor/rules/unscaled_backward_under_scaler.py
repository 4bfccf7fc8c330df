from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, related, times


class UnscaledBackwardUnderScaler(Rule):
    """
    ## What it does
    Finds a `backward()` of a loss that did not go through `scaler.scale(...)` whose gradients
    are added to those of `scaler.scale(loss).backward()` and then unscaled together by
    `scaler.unscale_(optimizer)` or `scaler.step(optimizer)`: a second loss (an auxiliary or
    regularisation term) backpropagated on its own. It is reported at the unscaled backward.
    A disabled scaler (its "scaled" loss is the loss itself), gradients cleared between the two
    backwards, and a plain backward into parameters no unscale touches stay silent.

    ## Why is this bad?
    The unscale divides every gradient it finds by the scale (65536 at first). The scaled
    loss's part comes back to its true size; the part of the loss that skipped
    `scaler.scale` is divided too, so it shrinks 65536 times and that term stops training,
    without an error (and the scaler's inf check never saw its overflow either).

    ## Example
    ```python
    scaler.scale(loss).backward()
    aux_loss.backward()               # not scaled: divided by 65536 at the unscale
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss + aux_loss).backward()      # or scaler.scale(aux_loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Stays silent on
    A term added to the scaled loss; a second model's plain backward and optimizer; the AMP
    gradient-penalty recipe.
    """

    code = "GD217"
    slug = "unscaled-backward-under-scaler"
    severity = Severity.ERROR
    summary = ("a loss backpropagated without scaler.scale adds to scaled gradients: the unscale "
               "divides its part by the scale")
    fix = "scale this loss too (scaler.scale(loss).backward()), or add it to the scaled loss"

    def check(self, a):
        groups: dict = {}
        for mixed in a.ledger.mixed_unscales:
            plain = next(iter(mixed.plain.values()))
            groups.setdefault(plain.loc, []).append(mixed)
        for loc, items in groups.items():
            mixed = items[0]
            pids = list(mixed.plain)
            plain = mixed.plain[pids[0]]
            scale = mixed.scaled.get("scale")
            by = f"{scale:g}" if isinstance(scale, float) else "the loss scale"
            unscale = mixed.unscale
            where = ("scaler.step()" if unscale.get("implicit") else "scaler.unscale_()")
            occurrences = a.count(m.unscale for m in items)
            scaler_var = ((a.source.called_object(mixed.scaled.loc.path, mixed.scaled.loc.line, "scale")
                           if mixed.scaled.loc else None) or "scaler")
            loss_var = (a.source.called_object(loc.path, loc.line, "backward") if loc else None) or "loss"
            if not loss_var.isidentifier():
                loss_var = "loss"
            yield self.finding(
                f"this backward's loss did not go through {scaler_var}.scale(), yet its gradients "
                f"in {a.names(pids)} are added to the scaled ones and {where} divides them all by "
                f"{by}: this loss's part of the update shrinks {by} times (seen {times(occurrences)})",
                loc, step=a.next_step_number(unscale.seq),
                related=(related(mixed.scaled, "the scaled backward it is added to", Role.SCALED_BACKWARD),
                         related(unscale, f"{where} divides both by the scale")),
                fix=(f"scale this loss too (`{scaler_var}.scale({loss_var}).backward()`), or add it "
                     f"to the loss that is scaled"),
                evidence={"params": a.param_names(pids, limit=8), "scale": scale,
                          "occurrences": occurrences},
            )
