from __future__ import annotations

from ..findings import Severity
from .base import Rule
from .hyperparameter_out_of_range import strong_decay

DOMINATES = 10.0  # the decay term over the loss's, on half of the group's weights or more
MIN_UPDATES = 3
# a coupled weight decay below this is the usual regularisation: when the gradients are near 0
# (a converged model being fine-tuned) any decay is many times them, yet the weights barely move
COUPLED_FLOOR = 1e-2
# optimizers that divide the gradient (decay term included) by its running scale: a dominant
# decay term makes each step about lr × sign(p)
_NORMALISED = frozenset({"Adam", "NAdam", "RAdam", "Adamax", "RMSprop", "Adagrad", "Adadelta"})


def _g(value) -> str:
    return f"{value:g}"


class WeightDecayDominatesUpdate(Rule):
    """
    ## What it does
    Finds a param group whose weight decay, not the loss, makes the update its optimizer
    applies: at each of the optimizer's first 3 updates the decay term is 10× the loss's
    gradient or more on most of the group's weights (the element-weighted median over its
    parameters). For a coupled decay (L2: `SGD`, `Adam`, `RMSprop`, `Adagrad`, ... add
    `weight_decay × p` to the gradient) that is `weight_decay × ‖p‖ / ‖g‖` per parameter, and
    the weight decay must be 0.01 or more; for a decoupled one (`AdamW`,
    `decoupled_weight_decay=True`) it is `weight_decay × |p|` (the decay step is
    `lr × weight_decay × p`, an Adam step at most about `lr` per weight). It points at the
    optimizer's construction. CPU parameters only.

    ## Why is this bad?
    The update then follows the weights toward 0, not the loss downhill. Adam, RMSprop and
    Adagrad divide what they are given by its running scale, so with `weight_decay=1` and
    gradients of 1e-3 each step is about `lr × sign(p)`: the loss's gradient is a rounding
    error in it, and the weights shrink until the decay is no larger than the gradient (weights
    of about 1e-3). Under SGD the gradient's share stays, but the step is mostly shrinkage and
    the model settles where the weights are as small as the gradients. Coupled L2 in Adam is
    the usual slip: a weight decay chosen for AdamW (0.01 to 1) given to Adam, whose decay goes
    through the normalisation.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1.0)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ```

    ## Stays silent on
    `AdamW(weight_decay=0.01 to 0.1)` at the usual lrs, `SGD(weight_decay=5e-4)` or 1e-4,
    `Adam(weight_decay=1e-4)` or 1e-5 (coupled, but below 0.01: a converged model being
    fine-tuned has gradients near 0, and any decay is then many times them), a weight decay on
    some groups only (each group is judged alone), a decay the loss's gradient still outweighs
    on most weights or at some of the first updates, optimizers of the script's own or of other
    libraries, and SGD or AdamW with `lr × weight_decay ≥ 0.1`
    (`hyperparameter-out-of-range`'s).
    """

    code = "GD168"
    slug = "weight-decay-dominates-update"
    severity = Severity.WARNING
    summary = ("the weight decay, not the loss, makes the update: it is 10x the loss's gradient "
               "or more on most weights at every update (coupled L2 in Adam, a huge weight_decay)")
    fix = ("lower weight_decay until it is a small fraction of the loss's gradient (SGD: 1e-4 to "
           "5e-4; Adam: use AdamW with 0.01 to 0.1)")

    def check(self, a):
        by_opt: dict[int, list] = {}
        for e in a.by_kind.get("decay_share", ()):
            if self._dominated(a, e):
                by_opt.setdefault(e.get("opt"), []).append(e)
        for opt, shares in by_opt.items():
            yield self._finding(a, opt, shares)

    @staticmethod
    def _dominated(a, e) -> bool:
        ratios = e.get("ratios") or []
        decay = e.get("weight_decay")
        if len(ratios) < MIN_UPDATES or not isinstance(decay, (int, float)):
            return False
        if not all(isinstance(r, (int, float)) and r >= DOMINATES for r in ratios):
            return False
        if not e.get("decoupled") and decay < COUPLED_FLOOR:
            return False
        cls = e.get("cls")
        seen = [p.lr for p in a.lr_timeline.get(e.get("opt"), {}).get(e.get("group"), ())
                if p.lr is not None]
        lr = max(seen) if seen else e.get("lr")
        return not strong_decay(cls, lr, decay)  # hyperparameter-out-of-range reports it

    def _finding(self, a, opt, shares):
        first = shares[0]
        cls = first.get("cls")
        init = a.optimizers.get(opt)
        loc = init.loc if init is not None else None
        decay, ratios = first.get("weight_decay"), first.get("ratios")
        lo, hi = min(ratios), max(ratios)
        size = f"{lo:.3g}×" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}× to {hi:.3g}×"
        measured = [e for e in a.by_kind.get("decay_share", ()) if e.get("opt") == opt]
        indices = [e.get("group") for e in shares]
        groups = ("" if len(measured) == 1 and indices == [0] else
                  f" of param group{'s' if len(indices) > 1 else ''} "
                  f"{', '.join(map(str, indices))}")
        given = a.source.call_argument(loc.path, loc.line, cls, 99, "weight_decay") \
            if loc is not None else None
        setting = f"`weight_decay={given}`" if given else f"weight_decay={_g(decay)}"
        if first.get("decoupled"):
            what = (f"{cls}'s decoupled weight_decay={_g(decay)} shrinks the weights by "
                    f"lr × {_g(decay)} × p at each step, while an Adam step moves a weight by "
                    f"about lr at most: weight_decay × |p| was {size} that on most weights"
                    f"{groups} at each of the first {len(ratios)} updates")
            effect = ("each update is mostly the decay: the weights are pulled toward 0 faster "
                      "than the loss's gradient can move them")
            fix = f"lower {setting} to 0.01 to 0.1 (AdamW's usual range)"
        else:
            what = (f"{cls} adds weight_decay={_g(decay)} × p to the gradient: the decay term was "
                    f"{size} the loss's gradient on most weights{groups} at each of the first "
                    f"{len(ratios)} updates")
            if cls in _NORMALISED:
                effect = (f"{cls} normalises that sum, so each step is about lr × sign(p): the "
                          f"weights shrink toward 0 and the loss barely steers them")
                fix = (f"build torch.optim.AdamW(..., weight_decay=0.01) instead of Adam with "
                       f"{setting} (AdamW's decay is not normalised with the gradient), or lower "
                       f"it to 1e-5 to 1e-4" if cls == "Adam" else
                       f"lower {setting} far below the gradients' scale (1e-5 to 1e-4)")
            else:
                effect = ("each step is mostly shrinkage: the weights settle where they are as "
                          "small as the gradients")
                fix = f"lower {setting} to 1e-4 to 5e-4"
        return self.finding(
            f"the weight decay, not the loss, makes this optimizer's updates: {what}; {effect}",
            loc, step=(first.get("steps") or [1])[0], fix=fix,
            evidence={"optimizer": cls, "weight_decay": decay,
                      "decoupled": bool(first.get("decoupled")), "ratios": ratios,
                      "groups": indices})
