from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

DOMINATED = 0.5  # share of the group's elements in parameters where eps dominates: most
MIN_UPDATES = 2


def _g(value) -> str:
    return f"{value:g}"


class EpsDominatesUpdate(Rule):
    """
    ## What it does
    Finds an adaptive optimizer (`Adam`, `AdamW`, `NAdam`, `RAdam`, `RMSprop`, `Adagrad`) whose
    `eps` outweighs the root of its own second-moment estimate: after each of its first 3
    updates, most of a param group's elements lie in parameters where `eps ≥ 10 × sqrt(v)` on
    most elements (`v` the bias-corrected running average of the squared gradient, Adagrad's
    sum). It is read from the optimizer's state, not from the value of `eps`: the same `eps`
    is harmless next to large gradients. Groups with `eps` below 1e-5 are not judged. It
    points at the optimizer's construction. CPU parameters only.

    ## Why is this bad?
    These optimizers step each weight by `lr × m / (sqrt(v) + eps)`: dividing by the gradient's
    own scale is what makes them adaptive. When `eps` is ten times `sqrt(v)` or more, the
    division is by `eps` alone and the step is `lr × m / eps`: plain (momentum) SGD with an lr
    of `lr / eps`, the same for every weight whatever its gradient's scale. With `eps=1` and
    gradients of 1e-2 that is SGD at a thousandth of the lr a well-tuned SGD would use: the
    run trains, slowly, and nothing says the optimizer is not the one it was built as.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1.0)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)   # eps=1e-8
    ```

    An `RMSprop` with momentum and `eps=1.0`, TensorFlow's Inception recipe (which steps as
    momentum SGD by design), is told as `info`.

    ## Stays silent on
    torch's default `eps` (1e-8, Adagrad's 1e-10) and the usual 1e-6 to 1e-7; a larger `eps`
    (1e-3, 1e-1) next to gradients large enough that it stays small against `sqrt(v)` on
    most weights (a summed loss, loss scaling); an `eps` that dominates only some parameters
    (a rarely used embedding) or only some of the first updates; `Adafactor` (its `eps` is a
    floor on the scale, not a term of the denominator), optimizers of the script's own or of
    other libraries, and parameters on an accelerator.
    """

    code = "GD176"
    slug = "eps-dominates-update"
    severity = Severity.WARNING
    summary = ("an adaptive optimizer's eps outweighs sqrt(v) on most weights at every update: "
               "Adam/RMSprop/Adagrad stepping as plain SGD at lr / eps")
    fix = "lower eps far below the gradients' scale (the default 1e-8)"

    def check(self, a):
        by_opt: dict[int, list] = {}
        for e in a.of_kind("eps_share"):
            shares = e.get("shares") or []
            if len(shares) >= MIN_UPDATES and all(s >= DOMINATED for s in shares):
                by_opt.setdefault(e.get("opt"), []).append(e)
        for opt, events in by_opt.items():
            yield self._finding(a, opt, events)

    def _finding(self, a, opt, events):
        first = events[0]
        cls, eps = first.get("cls"), first.get("eps")
        init = a.optimizers.get(opt)
        loc = init.loc if init is not None else None
        ratios = [r for e in events for r in e.get("ratios") or ()]
        lo, hi = min(ratios), max(ratios)
        size = f"{lo:.3g}×" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}× to {hi:.3g}×"
        shares = [s for e in events for s in e.get("shares") or ()]
        measured = [e for e in a.of_kind("eps_share") if e.get("opt") == opt]
        indices = [e.get("group") for e in events]
        groups = ("" if len(measured) == 1 and indices == [0] else
                  f" in param group{'s' if len(indices) > 1 else ''} "
                  f"{', '.join(map(str, indices))}")
        given = a.source.call_argument(loc.path, loc.line, cls, 99, "eps") \
            if loc is not None else None
        if loc is not None and given:
            # a construction written over several lines: the line that says eps=
            written = a.source.keyword_line(loc.path, loc.line, "eps")
            if written is not None:
                loc = Location(loc.path, written[0], loc.function)
        setting = f"`eps={given}`" if given else f"eps={_g(eps)}"
        momentum = "momentum SGD" if cls != "Adagrad" and not (
            cls == "RMSprop" and not self._has_momentum(a, opt)) else "SGD"
        held = "all" if min(shares) >= 1 else f"{min(shares):.0%} or more"
        numerator = "m" if momentum == "momentum SGD" else "g"
        # TensorFlow's Inception recipe, RMSProp(decay=0.9, momentum=0.9, epsilon=1.0), steps as
        # momentum SGD by design (TF adds eps under the root, with the same effect): a port of
        # it is no slip, so it is told, not warned about
        recipe = cls == "RMSprop" and eps == 1.0 and momentum == "momentum SGD"
        note = (" (TensorFlow's Inception recipe, RMSProp with momentum 0.9 and epsilon=1.0, "
                "does this on purpose: if that recipe is what was ported, the run is momentum "
                "SGD by design)") if recipe else ""
        return self.finding(
            f"{cls}'s eps={_g(eps)} outweighs the root of its second-moment estimate: eps was "
            f"{size} sqrt(v) (the median), and ≥ 10× it on most elements of parameters "
            f"holding {held} of the weights{groups}, after each of its first "
            f"{len(first.get('shares') or ())} updates, so each step is lr × {numerator} / eps — plain "
            f"{momentum} with lr / eps as its lr, no longer scaled per weight by the "
            f"gradient's size{note}",
            loc, step=(first.get("steps") or [1])[0],
            severity=Severity.INFO if recipe else self.severity,
            fix=f"lower {setting} far below the gradients' scale (the default 1e-8; 1e-6 under "
                f"mixed precision); if plain SGD is what you want, use torch.optim.SGD with "
                f"its own lr",
            evidence={"optimizer": cls, "eps": eps, "groups": indices, "shares": shares,
                      "ratios": ratios})

    @staticmethod
    def _has_momentum(a, opt) -> bool:
        for e in a.of_kind("optimizer_init"):
            if e.get("opt") == opt:
                return any((h or {}).get("momentum") for h in e.get("hyper") or ())
        return False
