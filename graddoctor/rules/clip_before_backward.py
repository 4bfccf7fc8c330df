from __future__ import annotations

from ..accumulation import written
from ..findings import Severity
from ..ledger import ledger_of
from .base import Rule, names, related


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
    """

    code = "GD203"
    slug = "clip-before-backward"
    severity = Severity.ERROR
    summary = "gradients are clipped before backward() produced the ones the step applies"
    fix = "clip after the update's last backward() and before optimizer.step()"

    def check(self, trace):
        led = ledger_of(trace)
        live: dict[int, int] = {}  # pid -> backward calls in its .grad not yet used by a step
        used_by: dict[int, object] = {}  # pid -> the step that used its latest gradient
        candidates = []  # (clip, owned pids, step that already used them or None)
        for e in trace:
            kind = e.kind
            if kind == "backward":
                for pid in written(e):
                    fresh = pid not in e.get("accumulated", ())
                    live[pid] = 1 if fresh else live.get(pid, 0) + 1
                    used_by.pop(pid, None)
            elif kind == "clear":
                for pid in e["params"]:
                    live[pid] = 0
            elif kind == "step":
                for pid in led.opt_params.get(e["opt"], ()):
                    if live.get(pid):
                        used_by[pid] = e
                    live[pid] = 0
            elif kind == "clip" and not e.get("norm_only"):
                owned = [pid for pid in e["params"] if pid in led.owners]
                if owned and not any(live.get(pid) for pid in owned):
                    used = next((used_by[p] for p in owned if p in used_by), None)
                    candidates.append((e, owned, used))
        groups: dict = {}
        for clip, owned, used in candidates:
            nxt = self._next_use(trace, led, clip, set(owned))
            if nxt is not None and nxt.kind == "backward":
                groups.setdefault(clip.loc, []).append((clip, owned, used, nxt))
        for loc, items in groups.items():
            clip, owned, used, backward = items[0]
            step = next((s for s in led.steps if s.seq > backward.seq), None)
            if used is not None:
                where = ("it runs after optimizer.step() on gradients that step already applied; "
                         "the next update's gradients are never clipped")
            else:
                where = ("it runs before backward() produced this update's gradients, so it clips "
                         "nothing the step applies")
            yield self.finding(
                f"this clip of {names(trace, owned)} comes too early: {where}",
                loc,
                related=(related(used, "the step that already applied the clipped gradients"),
                         related(backward, "the backward that produces the update's gradients afterwards"),
                         related(step, "the step that applies them unclipped")),
                step=next((i for i, s in enumerate(led.steps, 1) if s.seq > clip.seq), None),
                evidence={"params": [trace.param_name(p) for p in owned[:8]], "clip": clip.get("via"),
                          "after_step": used is not None, "occurrences": len(items)},
            )

    @staticmethod
    def _next_use(trace, led, clip, owned: set):
        """The first backward writing those params or step of an optimizer owning them."""
        opts = set().union(*(led.owners.get(pid, set()) for pid in owned))
        for e in trace.events[clip.seq + 1:]:
            if e.kind == "backward" and owned.intersection(written(e)):
                return e
            if e.kind == "step" and e["opt"] in opts:
                return e
        return None
