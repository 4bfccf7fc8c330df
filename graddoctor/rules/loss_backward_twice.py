from __future__ import annotations

from ..findings import Severity
from .base import Rule, related
from .unscaled_accumulation import SCALE_INVARIANT


class LossBackwardTwice(Rule):
    """
    ## What it does
    Finds a loss backpropagated a second time — `loss.backward(retain_graph=True)` and then
    `loss.backward()` on the very same tensor — with no optimizer step and no `zero_grad()`
    between the two. It points at the second backward. Backwards of different losses that share
    part of a graph (a GAN's, an auxiliary loss's), a repeat with `inputs=` that writes other
    parameters, and a repeat after a step or a clear are not reported.

    ## Why is this bad?
    `backward()` adds to `.grad`. Running the same loss twice adds the same gradients twice, so
    the step applies twice the gradient: the effective learning rate doubles for SGD, and
    gradient clipping and weight decay no longer mean what they say. The usual cause is a first
    backward kept "to log the gradient norm" or left over from debugging. Adam-like optimizers
    mostly cancel a constant factor: reported as info there, unless gradients are clipped.

    ## Example
    ```python
    loss.backward(retain_graph=True)
    grad_norm = total_norm(model)
    loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    grad_norm = total_norm(model)
    optimizer.step()
    ```

    ## Stays silent on
    A retained graph used by two different losses (a shared trunk and an auxiliary head);
    the same loss backpropagated twice into disjoint `inputs=`.
    """

    code = "GD118"
    slug = "loss-backward-twice"
    severity = Severity.WARNING
    summary = ("the same loss is backpropagated twice (retain_graph=True) before the step: every "
               "gradient is added twice")
    fix = "backpropagate the loss once per update: drop the second backward(), or zero_grad() before repeating it"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        by_seq = {e.seq: e for e in backwards}
        groups: dict = {}
        for b in backwards:
            first = by_seq.get(b.get("repeats"))
            if first is None:
                continue
            if any(e.kind in ("step", "clear", "step_begin") for e in a.span(first.seq + 1, b.seq - 1)):
                continue  # the same graph used again for another update: another bug, or meant
            written = set(first.get("fresh") or ()) | set(first.get("accumulated") or ())
            doubled = [p for p in b.get("accumulated") or () if p in written]
            if doubled:
                groups.setdefault(b.loc, []).append((b, first, doubled))
        clips = bool(a.by_kind.get("clip"))
        for loc, items in groups.items():
            b, first, doubled = items[0]
            opts = sorted(set().union(*(a.owners.get(p, set()) for p in doubled)))
            classes = [a.optimizer_class(o) for o in opts]
            adaptive = bool(opts) and not clips and all(c.split(" #")[0] in SCALE_INVARIANT for c in classes)
            applied = f"{' and '.join(classes)} applies" if classes else "the step applies"
            message = (f"this backward() runs the same loss again that the backward() at line "
                       f"{first.loc.line if first.loc else '?'} (retain_graph=True) already backpropagated, "
                       f"with no step or zero_grad() between: its gradients are added a second time, "
                       f"so {applied} twice the gradient of {a.names(doubled)}"
                       + (f" (seen {a.count(i[0] for i in items)} times)" if len(items) > 1 else ""))
            if adaptive:
                message += ("; Adam-like optimizers mostly cancel a constant factor, so the update "
                            "changes little — but the logged gradients and any later clipping see "
                            "twice the values")
            yield self.finding(
                message, loc, severity=Severity.INFO if adaptive else None,
                related=(related(first, "the first backward of this loss"),),
                step=a.next_step_number(b.seq),
                evidence={"first": first.loc.line if first.loc else None,
                          "params": [a.param_name(p) for p in dict.fromkeys(doubled)],
                          "optimizers": classes, "occurrences": a.count(i[0] for i in items)})
