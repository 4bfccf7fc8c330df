from __future__ import annotations

from ..findings import Severity
from .base import Rule

# Adam's family: an update m / (sqrt(v) + eps) with m and v running means of g and g**2
_ADAM = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam"})
# momentum buffers buf = momentum * buf + (1 - dampening) * g
_MOMENTUM = frozenset({"SGD", "RMSprop"})
# optimizers whose weight decay multiplies the weights by (1 - lr * weight_decay) at each step,
# the update not normalised: SGD's L2 term and the decoupled decay of AdamW
_DECAY = frozenset({"SGD", "AdamW"})

# SGD's dampening at or below this, with no weight decay: a decay (1e-4, 5e-4) that went into
# dampening, the fourth positional argument; real dampenings are 0 or near the momentum
_DAMPENING_AS_DECAY = 0.01

_DECAY_STRONG = 0.1  # lr * weight_decay: every weight shrinks by 10% per step or more


def strong_decay(cls, lr, decay) -> bool:
    """Whether this rule reports the weight decay: ``lr × weight_decay ≥ 0.1`` on an optimizer
    whose decay multiplies the weights by ``1 - lr × weight_decay``."""
    return cls in _DECAY and bool(decay) and lr is not None and lr * decay >= _DECAY_STRONG


def _g(value) -> str:
    return f"{value:g}"


class HyperparameterOutOfRange(Rule):
    """
    ## What it does
    Finds an optimizer built with a setting outside the range where its update rule works,
    whatever the model: Adam's `betas` with `beta1² ≥ beta2` (swapped: `(0.999, 0.9)`), a
    `momentum` of 1 or more (SGD, RMSprop), SGD's `dampening` of 1 or more, RMSprop's
    smoothing `alpha` of 1 or more, and a weight decay that shrinks every weight by 10% or
    more at each step (`lr × weight_decay ≥ 0.1` for SGD and AdamW, whose decay multiplies
    the weights by `1 - lr × weight_decay`), and SGD's `dampening` at a weight decay's size
    (above 0, at most 0.01) with no weight decay: `SGD(params, 0.1, 0.9, 1e-4)` puts the decay
    meant by the fourth positional value into `dampening`. It points at the optimizer's
    construction.

    ## Why is this bad?
    torch checks only that these numbers are not negative (and that Adam's betas are below 1),
    so the optimizer runs. But the update no longer does what it is for: with
    `beta1² ≥ beta2` Adam's step `m / sqrt(v)` is no longer bounded by about the lr (the
    bound needs `beta1² < beta2`), so it jumps when gradients shrink; a momentum of 1 never
    forgets a gradient and one above 1 grows the buffer geometrically until it overflows; a
    dampening of 1 keeps every gradient after the first out of the buffer; RMSprop's average
    of squares with `alpha ≥ 1` stays 0 or turns negative; `lr × weight_decay ≥ 1` zeroes
    or flips the sign of every weight at each step, and above 0.1 the decay outweighs
    what the gradients can teach. Such values are usually a slip: the two betas swapped,
    `momentum=9` for 0.9, a weight decay meant for a 1000× smaller lr.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.999, 0.9))
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    ```

    ## Stays silent on
    The betas of GANs and reinforcement learning (`(0.5, 0.999)`, `(0.0, 0.99)`, `(0.9, 0.9)`),
    Nesterov momentum 0.9 or 0.99, AdamW with `weight_decay=0.1` or 1 at a small lr, SGD's
    `weight_decay=5e-4`, TensorFlow-style RMSprop with `eps=1`, and optimizers of the
    script's own (their update rule is unknown); SGD's positional arguments in their order
    (`SGD(params, 0.01, 0.9, 0, 5e-4)`), Lua-style `dampening` equal to the momentum, a small
    dampening next to a weight decay that is set.
    """

    code = "GD131"
    slug = "hyperparameter-out-of-range"
    severity = Severity.WARNING
    summary = ("an optimizer is built with a setting outside the range its update rule works in "
               "(Adam's betas swapped, momentum ≥ 1, lr × weight_decay ≥ 0.1, a weight decay in "
               "SGD's dampening)")
    fix = "give the optimizer a setting inside its update rule's range"

    def check(self, a):
        for opt, init in a.optimizers.items():
            cls = init.get("cls")
            problems = []
            first = 0  # the index, among the optimizer's groups, of the event's first group
            for e in a.by_kind.get("optimizer_init", ()):
                if e.get("opt") != opt:
                    continue
                for g, hyper in enumerate(e.get("hyper") or ()):
                    if hyper:
                        problem = self._problem(a, opt, cls, hyper, e, g, first + g)
                        if problem is not None and problem not in problems:
                            problems.append(problem)
                first += len(e.get("lrs") or e.get("hyper") or ())
            if problems:
                yield self._finding(a, opt, init, problems)

    @staticmethod
    def _lr(a, opt, init_event, group: int, index: int) -> float | None:
        """The largest lr the group (``index`` among the optimizer's, ``group`` among the
        event's) stepped with, else the one it was built with."""
        seen = [p.lr for p in a.lr_timeline.get(opt, {}).get(index, ()) if p.lr is not None]
        if seen:
            return max(seen)
        lrs = init_event.get("lrs") or []
        return lrs[group] if group < len(lrs) else None

    def _problem(self, a, opt, cls, hyper, init_event, group, index):
        """``(severity, key, what, why, fix)`` or None."""
        betas = hyper.get("betas")
        if cls in _ADAM and betas is not None:
            b1, b2 = betas
            if b1 * b1 >= b2 and b1 > 0:
                swapped = f" (swapped? the usual order is ({_g(b2)}, {_g(b1)}))" if b1 > b2 else ""
                return (Severity.WARNING, "betas", f"betas=({_g(b1)}, {_g(b2)})",
                        f"beta1² = {_g(b1 * b1)} ≥ beta2 = {_g(b2)}{swapped}: the average of the "
                        f"gradient (beta1) remembers longer than the average of its square "
                        f"(beta2), so m / sqrt(v) is no longer bounded by about 1 and a step "
                        f"can be many times the lr when gradients shrink",
                        "betas=(beta1, beta2) with beta1² < beta2: (0.9, 0.999) by default, "
                        "(0.5, 0.999) for GANs")
        momentum = hyper.get("momentum")
        if cls in _MOMENTUM and momentum is not None and momentum >= 1:
            grows = momentum > 1
            return (Severity.ERROR if grows else Severity.WARNING, "momentum",
                    f"momentum={_g(momentum)}",
                    "the momentum buffer grows by that factor at every step until it overflows"
                    if grows else "the momentum buffer never forgets a gradient: every step "
                                  "applies the sum of all the gradients so far",
                    "momentum below 1 (0.9 is usual)")
        dampening = hyper.get("dampening")
        if cls == "SGD" and momentum and dampening is not None and dampening >= 1:
            return (Severity.ERROR, "dampening", f"dampening={_g(dampening)}",
                    "the buffer takes (1 - dampening) of each new gradient: none after the first "
                    "step" + (", or its opposite" if dampening > 1 else ""),
                    "dampening=0 (the default)")
        decay = hyper.get("weight_decay")
        if (cls == "SGD" and dampening is not None and 0 < dampening <= _DAMPENING_AS_DECAY
                and not decay):
            return (Severity.WARNING, "dampening", f"dampening={_g(dampening)} with weight_decay=0",
                    "a dampening that small changes nearly nothing, and it is the size of a "
                    "weight decay: SGD's arguments are (params, lr, momentum, dampening, "
                    "weight_decay), so a decay given as the fourth positional value (or under "
                    "dampening's name) lands in dampening and the model trains with no weight "
                    "decay",
                    f"weight_decay={_g(dampening)} by keyword (SGD(params, lr=..., momentum=..., "
                    f"weight_decay={_g(dampening)})), dampening left at 0")
        alpha = hyper.get("alpha")
        if cls == "RMSprop" and alpha is not None and alpha >= 1:
            return (Severity.ERROR, "alpha", f"alpha={_g(alpha)}",
                    "the running average of squared gradients takes (1 - alpha) of each new one: "
                    "it stays 0 (each step is the gradient divided by eps)" if alpha == 1
                    else "the running average of squared gradients turns negative (NaN steps)",
                    "alpha below 1 (0.99 by default); the lr is RMSprop's second argument")
        if cls in _DECAY and decay:
            lr = self._lr(a, opt, init_event, group, index)
            if strong_decay(cls, lr, decay):
                factor = round(1 - lr * decay, 12)
                effect = ("zeroes every weight at each step" if factor == 0 else
                          "flips the sign of every weight at each step" if factor < 0 else
                          f"shrinks every weight by {lr * decay:.0%} at each step, before the "
                          f"gradient moves it")
                return (Severity.ERROR if factor <= 0 else Severity.WARNING, "weight_decay",
                        f"weight_decay={_g(decay)} at lr {_g(lr)}",
                        f"lr × weight_decay = {_g(lr * decay)}: the decay multiplies the weights "
                        f"by {_g(factor)}, which {effect}",
                        "a weight decay with lr × weight_decay far below 0.1 (SGD: 1e-4 to 5e-4; "
                        "AdamW: 0.01 to 0.1 at its usual lr)")
        return None

    def _finding(self, a, opt, init, problems):
        cls = init.get("cls")
        loc = init.loc
        severity = Severity.ERROR if any(p[0] is Severity.ERROR for p in problems) else self.severity
        first = problems[0]
        given = None
        if loc is not None:
            given = a.source.call_argument(loc.path, loc.line, cls, 99, first[1])
        what = "; ".join(f"{p[2]}: {p[3]}" for p in problems)
        fix = "; ".join(p[4] for p in problems)
        if given:
            fix = f"replace `{first[1]}={given}`: " + fix
        return self.finding(
            f"{cls} is built with {what}", loc, step=1, severity=severity,
            evidence={"optimizer": cls, "settings": [p[1] for p in problems],
                      "values": [p[2] for p in problems]},
            fix=fix)
