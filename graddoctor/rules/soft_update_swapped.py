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
# a setting in the call that makes the copy: an EMA class given its decay there
_SETTING = re.compile(r"\d*\.\d+|decay|avg_fn|momentum|beta|alpha|tau", re.IGNORECASE)
_BLEND = re.compile(r"\b(lerp_|mul_|add_|copy_|addcmul_|sub_)\(|\.data\s*=")


class SoftUpdateSwapped(Rule):
    """
    ## What it does
    Finds a copy of the trained model that is meant to trail it — a DQN/DDPG/TD3/SAC target
    network, an EMA or mean teacher, a BYOL target or MoCo key encoder — whose soft update has
    its two weights swapped: at each update the copy moves most of the way to the model. The
    copy is a module no optimizer trains, with the trained model's parameter shapes: one that
    makes targets in the update (under `no_grad`, or an output without gradient), or an
    average kept to evaluate or save (`AveragedModel`, an EMA class). Between two
    steps of the model's optimizer (the first 24; any optimizer that owns its parameters, so
    the base optimizer of a SAM wrapper that never steps itself), a sample of the copy's values is compared
    before and after, with the way from the copy to the model after the step: it is reported
    when, at two updates or more, the copy's move runs straight along that way (cosine
    ≥ 0.99), covers more than half of it and less than all of it, and keeps the same share
    of the copy each time (a constant weight, not a warm-up). It points at the script's
    hand-written update of the copy (`tp.data.copy_(...)`, `mul_`/`add_`, `lerp_`,
    `.data = ...`), the one that names the copy when several do; for an average a library
    keeps (`AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.01))`), at the line
    that makes it, where its decay is given.

    ## Why is this bad?
    A soft update `target = (1 - tau) * target + tau * online` (or an EMA with decay
    `d = 1 - tau`) keeps a copy that changes slowly, so the targets it makes (a bootstrapped
    Q-value, a teacher's prediction, the keys of a contrastive loss) do not chase the network
    that is being fitted to them. With `tau` and `1 - tau` swapped (SpinningUp's `polyak =
    0.995` used as the weight of the online network, `lerp_(p, decay)` instead of
    `lerp_(p, 1 - decay)`), the copy takes 99.5% of the online network at every update: it is
    the online network one step late, the targets move with every step, and the stabilisation
    the copy was there for is gone. Training runs and the loss looks ordinary; Q-values drift or
    a self-distillation collapses. An EMA kept only to evaluate or save does not change the
    training's updates, but it is then the model one step late rather than an average: the
    model you keep is not the one you meant to.

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
    (SWA: 1/2, 1/3, ... of the way); slow weights the model is reset to (Lookahead, Reptile's
    meta-weights, a federated server model: the script moves the model to the copy between two
    steps, so the copy may take any share); a module of the same shapes
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
            targets = bool(event.get("targets"))
            path = event.loc.path if event.loc is not None else _optimizer_path(a, event)
            if path is None or (not targets and _pulled(event)):
                continue
            moves = [row for row in event.get("follows") or () if not row[3]]
            if len(moves) < _MOVES or not all(
                    row[1] is not None and _MOST < row[1] < _EXACT
                    and row[2] is not None and row[2] >= _STRAIGHT for row in moves):
                continue
            kept = [1.0 - row[1] for row in moves]
            if max(kept) > _STEADY * min(kept):
                continue  # the weight changes from update to update: a warm-up, not a swap
            where = self._update_line(a, event, path)
            made = None
            if where is None:
                # the average is kept by a library (AveragedModel, an EMA class): its decay is
                # given where the copy is made
                said = a.source.copy_writers(path, _leaf(event["copy"]))
                if said is not None and said["made"] is not None and (
                        not targets or _SETTING.search(said["made"][1])):
                    made = Location(path, said["made"][0])
            if where is None and made is None and event.loc is None:
                continue
            at = where or made or event.loc
            key = (at.path, at.line)
            if key in done:
                continue
            done.add(key)
            share = sorted(row[1] for row in moves)[len(moves) // 2]
            keep = 1.0 - share
            copy, model = event["copy"], event["model"]
            said = "this update" if where is not None else "its update"
            if targets:
                what = (f"{copy}, a copy of the trained {model} that no optimizer trains and that "
                        f"runs without gradient (targets, a teacher, an evaluation),")
                harm = (f"so it trails the model by less than a step: targets it makes move with "
                        f"every step, and as an average it is not one")
            else:
                what = (f"{copy}, a copy of the trained {model} that no optimizer trains (an "
                        f"average kept to evaluate or save),")
                harm = (f"so it is the model one step late, not an average: the training's "
                        f"updates are not changed, but the copy you evaluate or keep is not the "
                        f"average you meant")
            if made is not None:
                fix = (f"give the average the decay it keeps of itself, {share:.3g}, not "
                       f"{keep:.3g} (an EMA's decay is the weight of the average, 1 - decay "
                       f"the weight of the model)")
            else:
                fix = (f"swap the two weights so the copy keeps {share:.3g} of itself and takes "
                       f"{keep:.3g} of {_leaf(model)}: `tp.mul_({share:.3g}).add_(p, "
                       f"alpha={keep:.3g})`, or `tp.lerp_(p, {keep:.3g})`")
            yield self.finding(
                f"{what} is moved {share:.1%} of the way to {model} by {said} each time it runs "
                f"({len(moves)} times measured): it keeps only {keep:.3g} of itself, {harm}. "
                f"The blend's two weights (tau and 1 - tau, or decay and 1 - decay) are swapped",
                at, evidence={"copy": copy, "model": model, "share": share,
                              "moves": len(moves), "targets": targets},
                fix=fix)

    @staticmethod
    def _update_line(a, event, path: str) -> Location | None:
        """The hand-written blend that writes the copy: among the script's in-place writes
        with arithmetic (not a plain ``copy_(p)`` or ``load_state_dict(m.state_dict())``),
        those that name the copy (in the line, what the loop binds, or the loop's header) when
        any does; of those, when they sit in one loop, the last one that is not a lone scaling
        (``tp.mul_(tau)``); None when they sit in several loops. Without such a write, the
        last ``torch._foreach_*_`` call over the copy's parameters."""
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


def _optimizer_path(a, event) -> str | None:
    """The script file that built the model's optimizer: where a copy that made no targets
    (so has no forward to point at) is looked for."""
    init = a.optimizers.get(event.get("opt"))
    return init.loc.path if init is not None and init.loc is not None else None


def _pulled(event) -> bool:
    """Whether the script moved the model toward the copy between two steps: slow weights
    that the model is reset to (Lookahead, Reptile's meta-weights, a federated server model)
    move toward the model by any share they are given, on purpose."""
    return any(row[1] is not None and row[1] >= _STRAIGHT for row in event.get("pulls") or ())
