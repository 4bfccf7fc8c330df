from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .copy_never_follows import _leaf

_MOVES = 2  # intervals in which the copy moved by a blend, at least
_MOST = 0.5  # share of the way to the model covered at each of them: more than this
_EXACT = 0.99999  # a share this close to 1: a hard sync written with arithmetic, not a blend
_STRAIGHT = 0.99  # cosine of the copy's move with the way to the model, at least
_STEADY = 1.1  # largest over smallest of what the copy kept (1 - share): one constant weight
_BLEND = re.compile(r"\b(lerp_|mul_|add_|copy_|addcmul_|sub_)\(|\.data\s*=")


class SoftUpdateSwapped(Rule):
    """
    ## What it does
    Finds a copy of the trained model that is meant to trail it — a DQN/DDPG/TD3/SAC target
    network, an EMA or mean teacher, a BYOL target or MoCo key encoder — whose soft update has
    its two weights swapped: at each update the copy moves most of the way to the model. The
    copy is a module no optimizer trains, with the trained model's parameter shapes, that
    makes targets in the update (under `no_grad`, or an output without gradient). Between two
    steps of the model's optimizer (the first 24), a sample of the copy's values is compared
    before and after, with the way from the copy to the model after the step: it is reported
    when, at two updates or more, the copy's move runs straight along that way (cosine
    ≥ 0.99), covers more than half of it and less than all of it, and keeps the same share
    of the copy each time (a constant weight, not a warm-up). It points at the script's
    hand-written update of the copy (`tp.data.copy_(...)`, `mul_`/`add_`, `lerp_`,
    `.data = ...`), the one that names the copy when several do.

    ## Why is this bad?
    A soft update `target = (1 - tau) * target + tau * online` (or an EMA with decay
    `d = 1 - tau`) keeps a copy that changes slowly, so the targets it makes (a bootstrapped
    Q-value, a teacher's prediction, the keys of a contrastive loss) do not chase the network
    that is being fitted to them. With `tau` and `1 - tau` swapped (SpinningUp's `polyak =
    0.995` used as the weight of the online network, `lerp_(p, decay)` instead of
    `lerp_(p, 1 - decay)`), the copy takes 99.5% of the online network at every update: it is
    the online network one step late, the targets move with every step, and the stabilisation
    the copy was there for is gone. Training runs and the loss looks ordinary; Q-values drift or
    a self-distillation collapses.

    ## Example
    ```python
    tau = 0.005
    for p, tp in zip(critic.parameters(), critic_target.parameters()):
        tp.data.copy_(tau * tp.data + (1 - tau) * p.data)
    ```

    ## Use instead
    ```python
    for p, tp in zip(critic.parameters(), critic_target.parameters()):
        tp.data.copy_(tau * p.data + (1 - tau) * tp.data)  # or tp.lerp_(p, tau)
    ```

    ## Stays silent on
    Soft updates that keep most of the copy (`tau` = 0.005, decay 0.99...); hard syncs
    (`load_state_dict`, `copy_(p)`) every step or every N steps; an EMA whose decay warms up
    from 0 (mean teacher's `min(1 - 1 / (step + 1), alpha)`, TF's `(1 + n) / (10 + n)`: the
    share the copy keeps grows from one update to the next); a running equal-weight average
    (SWA: 1/2, 1/3, ... of the way); Lookahead's slow weights (the model is reset to them);
    copies that make no targets (an EMA kept only for evaluation); a module of the same shapes
    that moves toward another model (its move is not along the way to this one). Not told
    apart: a weight between 0.5 and 1 on the online network chosen on purpose.
    """

    code = "GD186"
    slug = "soft-update-swapped"
    severity = Severity.WARNING
    summary = ("a target network or EMA copy moves most of the way to the trained model at each "
               "soft update: tau and 1 - tau (decay and 1 - decay) are swapped")
    fix = ("give the copy the large weight: target = (1 - tau) * target + tau * online "
           "(`tp.mul_(1 - tau).add_(p, alpha=tau)` or `tp.lerp_(p, tau)`)")

    def check(self, a):
        done: set = set()
        for event in a.by_kind.get("model_copy", ()):
            # not event["equal"]: a blend that runs before the first step already leaves the
            # copy a rounding away from the model; the straight move toward it tells the pair
            if not event.get("targets") or event.loc is None:
                continue
            moves = [row for row in event.get("follows") or () if not row[3]]
            if len(moves) < _MOVES or not all(
                    row[1] is not None and _MOST < row[1] < _EXACT
                    and row[2] is not None and row[2] >= _STRAIGHT for row in moves):
                continue
            kept = [1.0 - row[1] for row in moves]
            if max(kept) > _STEADY * min(kept):
                continue  # the weight changes from update to update: a warm-up, not a swap
            where = self._update_line(a, event)
            key = (where.path, where.line) if where is not None else (event["copy"],)
            if key in done:
                continue
            done.add(key)
            share = sorted(row[1] for row in moves)[len(moves) // 2]
            keep = 1.0 - share
            copy, model = event["copy"], event["model"]
            said = "this update" if where is not None else "its update"
            yield self.finding(
                f"{copy}, a copy of the trained {model} that makes the targets of the update, is "
                f"moved {share:.1%} of the way to {model} by {said} each time it runs "
                f"({len(moves)} times measured): it keeps only {keep:.3g} of itself, so it trails "
                f"the model by less than a step and its targets move with every step (the blend's "
                f"two weights, tau and 1 - tau or decay and 1 - decay, are swapped)",
                where if where is not None else event.loc,
                evidence={"copy": copy, "model": model, "share": share,
                          "moves": len(moves)},
                fix=(f"swap the two weights so the copy keeps {share:.3g} of itself and takes "
                     f"{keep:.3g} of {_leaf(model)}: `tp.mul_({share:.3g}).add_(p, "
                     f"alpha={keep:.3g})`, or `tp.lerp_(p, {keep:.3g})`"))

    @staticmethod
    def _update_line(a, event) -> Location | None:
        """The hand-written blend that writes the copy: among the script's in-place writes
        with arithmetic (not a plain ``copy_(p)`` or ``load_state_dict(m.state_dict())``),
        those that name the copy (in the line, what the loop binds, or the loop's header) when
        any does; of those, when they sit in one loop, the last one that is not a lone scaling
        (``tp.mul_(tau)``); None when they sit in several loops. Without such a write, the
        last ``torch._foreach_*_`` call over the copy's parameters."""
        path = event.loc.path
        copy = _leaf(event["copy"])
        found = []
        for line, _root, text, bound in a.source.param_writes(path):
            if not _BLEND.search(text) and "load_state_dict" not in text:
                continue
            if "lerp_" not in text and not re.search(r"[*+/-]|alpha\s*=", text):
                continue  # a plain copy (copy_(p), load_state_dict(model.state_dict())): a sync
            loop = a.source.innermost_loop(path, line)
            header = a.source.line_text(path, loop[0]) if loop is not None else ""
            named = bool(re.search(rf"\b{re.escape(copy)}\b", f"{text} {bound or ''} {header}"))
            found.append((named, loop, line, text))
        if not found:
            # a multi-tensor update: torch._foreach_lerp_/mul_/add_ over the copy's parameters
            lines = a.source.foreach_writes(path, copy)
            return Location(path, lines[-1]) if lines else None
        if any(named for named, *_ in found):
            found = [f for f in found if f[0]]
        if len({f[1] for f in found}) > 1:
            return None  # blends in several places, none of them naming the copy
        mine = found
        scaling = re.compile(r"^[\w.\[\]]+\.mul_\([^()]*\)$")
        chosen = [f for f in mine if not scaling.match(f[3])] or mine
        return Location(path, chosen[-1][2])
