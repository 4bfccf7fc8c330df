from __future__ import annotations

import math

from ..findings import Role, Severity
from .base import Rule, related

SHRUNK = 1e-2  # max_norm over the total norm below this at every clip: the clip sets the step size
MIN_CLIPS = 3
TINY_LIMIT = 1e-2  # a limit this small is itself the cause (warning); larger: the grads are huge
# under a limit that small, every update shrunk 20x or more already sets the step size: the
# gradient applied is 5% of the gradient or less, at every update (SGD's lr in effect / 20)
SHRUNK_TINY = 5e-2
# clip_grad_value_: the share of the gradients' elements set to ±clip_value at every measured
# call, and the most of the gradient's norm those calls kept: the update is sign(g) × clip_value
NEARLY_ALL = 0.9
KEPT_AT_MOST = 0.5
# optimizers whose update is the lr times the (momentum of the) gradient: a clip's factor scales
# the step; adaptive ones (Adam, RMSprop, Adagrad, ...) divide it out
_PLAIN = frozenset({"SGD", "ASGD"})
_ADAPTIVE = frozenset({"Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop", "Adagrad",
                       "Adadelta", "SparseAdam", "Adafactor"})


class ClipShrinksEveryUpdate(Rule):
    """
    ## What it does
    Finds a gradient clip that cuts every update down to its limit. A `clip_grad_norm_` whose
    `max_norm` is under 1/100 of the total norm the call returned at each of at least 3 calls
    of one line (under 1/20 when `max_norm` is itself at most 0.01: `clip_grad_norm_(params,
    5e-3)` under gradients of norm 0.4), when the optimizer stepped after it applies the
    gradient as it is (`SGD`, `ASGD`, or an update written by hand). A `clip_grad_value_` that, at each of at least 3
    measured calls of one line (the run's first ones, CPU gradients), sets 90% or more of the
    gradients' elements to ±`clip_value` and keeps at most half of the gradient's norm: the
    update is then `sign(g) × clip_value`. A limit of at most 0.01 under `SGD`, `ASGD` or a
    hand-written update is a warning; a usual limit (0.5, 1.0) under gradients far larger is
    `info` (the loss's scale may be the cause), and so is a value clip under an adaptive
    optimizer (Adam, RMSprop, ...: their own update is close to the sign of the gradient's
    average, so the clip changes it less). The total norm is read where it is on the CPU
    (graddoctor never syncs a device for it).

    ## Why is this bad?
    Clipping to `max_norm` makes every update `lr × max_norm` long, whatever the gradient: with
    total norms near 1 and `max_norm=1e-4` the effective learning rate is 10,000× smaller than
    the one you set, and the model trains (slowly) along the gradient's direction only.
    Clipping every element to `clip_value` goes further: each weight moves by
    `lr × clip_value` in the direction of its gradient's sign, whatever the gradient's size,
    so the gradient's magnitudes (which weights matter more) are lost as well. Clipping is
    meant to cut the rare spike, not every step.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ...
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-4)   # norms are ~1: every step cut
    optimizer.step()
    ```

    ## Use instead
    ```python
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)    # the size of a typical norm
    ```
    and for `clip_grad_value_(model.parameters(), 1e-3)` under gradients of about 0.1 per
    element, a clip value above the typical element (1.0 or 5.0), or `clip_grad_norm_`.

    ## Stays silent on
    `max_norm=1.0` that clips now and then; a limit near the norms (RL's 0.5 with norms around
    it); a clip under `Adam`/`AdamW`/`RMSprop`/`Adagrad` (they divide the gradient's scale
    out); fewer than 3 clips; `clip_grad_value_(..., 1.0)` or 5.0 that clips a few elements
    now and then (an RL script's occasional clip); a value clip that sets most elements to the
    limit but keeps most of the norm (gradients just above it); `clip_grad_norm_(..., inf)`,
    which only measures; a total norm or gradients on a GPU (not read).
    """

    code = "GD135"
    slug = "clip-shrinks-every-update"
    severity = Severity.WARNING
    summary = ("a gradient clip shrinks every update: max_norm 100x below the norm, or "
               "clip_value below nearly every element (the update is sign(g) x clip_value)")
    fix = ("raise max_norm to about the size of a typical gradient norm (log what clip_grad_norm_ "
           "returns; 1.0 is common), so that it only cuts the spikes")

    def check(self, a):
        lines: dict = {}
        for clip in a.of_kind("clip"):
            via = clip.get("via")
            if via not in ("clip_grad_norm_", "clip_grad_value_") or clip.get("norm_only") \
                    or clip.loc is None:
                continue
            lines.setdefault((via, clip.loc.path, clip.loc.line), []).append(clip)
        for (via, _, _), clips in lines.items():
            found = self._judge(a, clips) if via == "clip_grad_norm_" else \
                self._judge_value(a, clips)
            if found is not None:
                yield found

    @staticmethod
    def _applied_by(a, clips):
        """(the optimizer's class or "the hand-written update", the step after the clips) or
        None when no known optimizer applies them."""
        step = a.next_step(clips[0].seq)
        if step is not None:
            init = a.optimizers.get(step.get("opt"))
            cls = init.get("cls") if init is not None else None
            return (cls, step) if isinstance(cls, str) else None
        if a.optimizers:
            return None
        return "the hand-written update", None

    def _judge_value(self, a, clips):
        limit = clips[0].get("limit")
        if not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
            return None
        measured = [c for c in clips if c.get("clipped") is not None]
        if len(measured) < MIN_CLIPS:
            return None
        for clip in measured:
            if clip.get("limit") != limit or clip.get("clipped") < NEARLY_ALL or \
                    not isinstance(clip.get("kept"), (int, float)) or clip.get("kept") > KEPT_AT_MOST:
                return None
        applied = self._applied_by(a, clips)
        if applied is None:
            return None
        by, step = applied
        adaptive = by not in _PLAIN and by != "the hand-written update"
        if adaptive and by not in _ADAPTIVE:
            return None  # an optimizer of the script's own: its update rule is unknown
        shares = [c.get("clipped") for c in measured]
        kept = max(c.get("kept") for c in measured)
        severity = None if limit <= TINY_LIMIT and not adaptive else Severity.INFO
        applies = (f"{by} then applies about sign(g) × {limit:g}: every weight moves by lr × "
                   f"{limit:g} whatever its gradient's size, and the gradient's magnitudes are "
                   f"lost" if not adaptive else
                   f"{by} then normalises sign(g) × {limit:g}: its update follows the average "
                   f"sign of each gradient, close to its own update, but the gradient's size "
                   f"over time no longer weighs in")
        cause = ("" if limit <= TINY_LIMIT else
                 f" (gradients far above {limit:g} per element: a loss summed instead of "
                 f"averaged, unnormalised inputs or targets?)")
        message = (f"this clip_grad_value_ sets nearly every gradient element to ±{limit:g}: at "
                   f"each of the {len(measured)} calls measured {min(shares):.0%} or more of the "
                   f"elements were beyond it, and the clipped gradient kept at most "
                   f"{kept * 100:.2g}% of its norm{cause}; {applies}")
        if limit <= TINY_LIMIT:
            fix = (f"raise clip_value={limit:g} above the typical gradient element (1.0 or 5.0 "
                   f"clips only outliers), or clip the norm instead: "
                   f"torch.nn.utils.clip_grad_norm_(params, 1.0)")
        else:
            fix = ("bring the gradients to the size clip_value was chosen for (average the loss "
                   "over the batch, reduction='mean'; normalise the inputs and targets), or "
                   "raise clip_value above the typical gradient element")
        return self.finding(
            message, clips[0].loc, severity=severity, step=a.next_step_number(clips[0].seq),
            fix=fix,
            related=(related(step, "the step that applies the clipped gradients", Role.STEP),)
            if step is not None else (),
            evidence={"clip_value": limit, "clips": len(measured), "clipped": shares,
                      "kept": [c.get("kept") for c in measured], "optimizer": by},
        )

    def _judge(self, a, clips):
        limit = clips[0].get("limit")
        if not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
            return None
        norms = []
        shrunk = SHRUNK_TINY if limit <= TINY_LIMIT else SHRUNK
        for clip in clips:
            total = clip.get("total_norm")
            if clip.get("limit") != limit or not isinstance(total, (int, float)) or \
                    not math.isfinite(total) or total <= 0 or limit >= shrunk * total:
                return None
            norms.append(total)
        count = a.count(clips)
        if count < MIN_CLIPS:
            return None
        step = a.next_step(clips[0].seq)
        if step is not None:
            init = a.optimizers.get(step.get("opt"))
            cls = init.get("cls") if init is not None else None
            if cls not in _PLAIN:
                return None  # adaptive (or unknown): the clip's factor is divided out
            by = cls
        elif a.optimizers:
            return None
        else:
            by = "the hand-written update"
        first, last = norms[0], norms[-1]
        severity = None if limit <= TINY_LIMIT else Severity.INFO
        cause = (f"max_norm={limit:g} is far below the gradients' size" if severity is None else
                 f"the gradients' total norm is 100× max_norm={limit:g} or more (a loss summed "
                 f"instead of averaged, unnormalised inputs?)")
        factor = min(norms) / limit
        times = "100×" if factor >= 100 else f"{factor:.0f}×"
        message = (f"this clip shrinks every one of the {count} updates it clips by {times} or more: "
                   f"the total norm was {first:.3g} at the first (the gradient applied is "
                   f"{limit / first:.1g} of it) and {last:.3g} at the last; {cause}, so {by} "
                   f"steps lr × {limit:g} along the gradient's direction every time: the lr you "
                   f"set is in effect divided by {first / limit:.2g}")
        fix = None if severity is None else (
            "bring the gradients to the size max_norm was chosen for (average the loss over the "
            "batch, reduction='mean'; normalise the inputs and targets), or raise max_norm to "
            "about a typical total norm, so that the clip only cuts the spikes")
        return self.finding(
            message, clips[0].loc, severity=severity, step=a.next_step_number(clips[0].seq), fix=fix,
            related=(related(step, "the step that applies the shrunk gradients", Role.STEP),),
            evidence={"max_norm": limit, "clips": count, "first_total_norm": first,
                      "last_total_norm": last, "optimizer": by},
        )
