from __future__ import annotations

import math

from ..findings import Role, Severity
from .base import Rule, related

SHRUNK = 1e-2  # max_norm over the total norm below this at every clip: the clip sets the step size
MIN_CLIPS = 3
TINY_LIMIT = 1e-2  # a max_norm this small is itself the cause (warning); larger: the grads are huge
# optimizers whose update is the lr times the (momentum of the) gradient: a clip's factor scales
# the step; adaptive ones (Adam, RMSprop, Adagrad, ...) divide it out
_PLAIN = frozenset({"SGD", "ASGD"})


class ClipShrinksEveryUpdate(Rule):
    """
    ## What it does
    Finds a `clip_grad_norm_` whose limit is so far below the gradients' norm that it shrinks
    every update it clips by 100× or more: at each of at least 3 calls of one line, `max_norm`
    is under 1/100 of the total norm the call returned, and the optimizer stepped after it
    applies the gradient as it is (`SGD`, `ASGD`, or an update written by hand). A limit of at
    most 0.01 is a warning; a usual limit (0.5, 1.0) under gradients 100× larger is `info` (the
    loss's scale may be the cause). The total norm is read where it is on the CPU (graddoctor
    never syncs a device for it).

    ## Why is this bad?
    Clipping to `max_norm` makes every update `lr × max_norm` long, whatever the gradient: with
    total norms near 1 and `max_norm=1e-4` the effective learning rate is 10,000× smaller than
    the one you set, and the model trains (slowly) along the gradient's direction only. Clipping
    is meant to cut the rare spike, not every step.

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

    ## Stays silent on
    `max_norm=1.0` that clips now and then; a limit near the norms (RL's 0.5 with norms around
    it); a clip under `Adam`/`AdamW`/`RMSprop`/`Adagrad` (they divide the gradient's scale
    out); fewer than 3 clips; `clip_grad_value_`; `clip_grad_norm_(..., inf)`, which only
    measures; a total norm on a GPU (not read).
    """

    code = "GD135"
    slug = "clip-shrinks-every-update"
    severity = Severity.WARNING
    summary = "a gradient clip shrinks every update 100x or more: its max_norm sets the step size"
    fix = ("raise max_norm to about the size of a typical gradient norm (log what clip_grad_norm_ "
           "returns; 1.0 is common), so that it only cuts the spikes")

    def check(self, a):
        lines: dict = {}
        for clip in a.of_kind("clip"):
            if clip.get("via") != "clip_grad_norm_" or clip.get("norm_only") or clip.loc is None:
                continue
            lines.setdefault((clip.loc.path, clip.loc.line), []).append(clip)
        for clips in lines.values():
            found = self._judge(a, clips)
            if found is not None:
                yield found

    def _judge(self, a, clips):
        limit = clips[0].get("limit")
        if not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
            return None
        norms = []
        for clip in clips:
            total = clip.get("total_norm")
            if clip.get("limit") != limit or not isinstance(total, (int, float)) or \
                    not math.isfinite(total) or total <= 0 or limit >= SHRUNK * total:
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
        message = (f"this clip shrinks every one of the {count} updates it clips by 100× or more: "
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
