from __future__ import annotations

from ..analysis import written
from ..findings import Role, Severity
from .base import Rule, related


class ClipBeforeBackward(Rule):
    """
    ## What it does
    Finds gradient clipping on parameters that hold no gradient of the current update: the clip
    runs before `backward()` has produced this update's gradients (right after `zero_grad()`, or
    after `optimizer.step()` on gradients that were already applied).

    ## Why is this bad?
    The clip touches `None`, zeros, or gradients the optimizer has already used; the gradients
    the next step applies are never clipped. Training runs exactly as without clipping, which
    is what the clip was there to prevent (exploding gradients, loss spikes).

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        loss_fn(model(x), y).backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    ```

    ## Stays silent on
    A clip between backward and step; `clip_grad_norm_(..., inf)` after the step, which only
    measures the norm for logging; a clip hook overridden in Lightning to clip only after
    warm-up.
    """

    code = "GD203"
    slug = "clip-before-backward"
    severity = Severity.ERROR
    summary = "gradients are clipped before backward() produced the ones the step applies"
    fix = "clip after the update's last backward() and before optimizer.step()"

    def check(self, a):
        groups: dict = {}
        for state in a.ledger.clips:
            clip, owned = state.clip, state.owned
            if not owned or state.unused:
                continue
            used = next((state.used_by[p] for p in owned if p in state.used_by), None)
            nxt = self._next_use(a, clip, set(owned))
            if nxt is not None and nxt.kind == "backward":
                groups.setdefault(clip.loc, []).append((clip, owned, used, nxt))
        for loc, items in groups.items():
            clip, owned, used, backward = items[0]
            if used is not None:
                where = ("it runs after optimizer.step() on gradients that step already applied; "
                         "the next update's gradients are never clipped")
            else:
                where = ("it runs before backward() produced this update's gradients, so it clips "
                         "nothing the step applies")
            yield self.finding(
                f"this clip of {a.names(owned)} comes too early: {where}",
                loc,
                related=(related(used, "the step that already applied the clipped gradients"),
                         related(backward, "the backward that produces the update's gradients afterwards"),
                         related(a.next_step(backward.seq), "the step that applies them unclipped", Role.STEP)),
                step=a.next_step_number(clip.seq),
                evidence={"params": [a.param_name(p) for p in owned[:8]], "clip": clip.get("via"),
                          "after_step": used is not None, "occurrences": a.count(i[0] for i in items)},
            )

    @staticmethod
    def _next_use(a, clip, owned: set):
        """The first backward writing those params or step of an optimizer owning them."""
        opts = set().union(*(a.owners.get(pid, set()) for pid in owned))
        for e in a.after(clip.seq):
            if e.kind == "backward" and owned.intersection(written(e)):
                return e
            if e.kind == "step" and e["opt"] in opts:
                return e
        return None
