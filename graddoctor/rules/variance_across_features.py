from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule, related

_NAMES = frozenset({"var", "std"})


def _dim(text: str) -> int | None:
    """The literal ``dim`` of a ``var``/``std`` call's source (``z.var(dim=1)``, ``z.std(1)``,
    ``torch.var(z, 1)``, ``torch.std(z, dim=-1)``), else None."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    value = next((k.value for k in call.keywords if k.arg == "dim"), None)
    if value is None:
        func = call.func
        module = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.value.id == "torch"
        position = 1 if module else 0
        value = call.args[position] if len(call.args) > position else None
    try:
        return int(ast.literal_eval(value)) if value is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None


class VarianceAcrossFeatures(Rule):
    """
    ## What it does
    Finds a variance or standard deviation meant per feature across the batch but taken per
    sample across the features, and pulled to a target: VICReg's variance hinge
    `relu(1 - sqrt(z.var(dim=1) + eps))` on (batch, features) embeddings, a W-MSE or VCReg
    variance term, a hand-written "keep the features spread" regulariser. Seen in the loss's
    graph at the first backwards: a `var`/`std` that reduced axis 1 of a 2-D tensor whose axis
    0 holds the batch's samples, its result (through an epsilon and a square root) shifted by a
    constant and given to `relu`, a clamp, a square or a regression loss. Reported at the
    `var`/`std` call with `dim=1` (or `-1`) in the script.

    ## Why is this bad?
    The variance term is what stops a joint-embedding method from collapsing: each embedding
    dimension must keep a standard deviation of at least 1 across the batch. Per sample it
    measures how different one vector's entries are from each other, which a collapsed
    representation (the same vector for every input) satisfies as long as that vector's
    entries vary. The term is then no guard at all, the invariance term pulls every sample to
    the same point, and the loss still falls. Nothing fails, every shape agrees.

    ## Example
    ```python
    x = x - x.mean(dim=0)
    std_x = torch.sqrt(x.var(dim=1) + 0.0001)
    std_loss = torch.mean(F.relu(1 - std_x))
    ```

    ## Use instead
    ```python
    std_x = torch.sqrt(x.var(dim=0) + 0.0001)     # per feature, over the batch
    std_loss = torch.mean(F.relu(1 - std_x))
    ```

    ## Stays silent on
    The variance or std over the batch (`dim=0`); a per-sample std that is not pulled to a
    target (a layer norm written by hand, a standardisation `(x - mean) / std`, a logged
    statistic); a std of something that is no batch of samples (a weight: nothing below it is
    data); a std over the batch compared with a target (VICReg as written).
    """

    code = "GD279"
    slug = "variance-across-features"
    severity = Severity.WARNING
    summary = ("a variance hinge meant per feature across the batch (VICReg's) is taken per "
               "sample, across the features: it no longer stops the embeddings collapsing")
    fix = "take the variance over the batch, per feature: `z.var(dim=0)`"

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("feature_variance", ()):
            loc = event.loc
            if loc is None:
                continue
            fn = event["fn"]
            calls = [(line, text) for line, text, _forward in a.source.calls_named(loc.path, _NAMES)
                     if _dim(text) in (1, -1) and (loc.path, line) not in told]
            where = Location(loc.path, calls[0][0]) if calls else loc
            if (where.path, where.line) in told:
                continue
            told.add((where.path, where.line))
            shown = f"`{calls[0][1]}`" if calls else f"the {fn}"
            batch, features = event["shape"]
            penalty = event["penalty"]
            how = (f"compared with a target by {penalty}" if penalty.endswith("_loss")
                   else f"shifted by a constant and penalised by {penalty}")
            more = ""
            if len(calls) > 1:
                more = " (and the same at line " + ", ".join(str(line) for line, _ in calls[1:]) + ")"
            fixed = None
            if calls:
                text = calls[0][1]
                fixed = (text.replace("dim=1", "dim=0").replace("dim=-1", "dim=0")
                         if "dim=" in text else None)
            yield self.finding(
                f"{shown}{more} takes the {fn} of each of the {batch} samples across its "
                f"{features} features, and the result is {how}: a variance term meant to keep "
                f"every feature spread across the batch (VICReg's) then measures each vector's "
                f"own spread, which embeddings collapsed to one point still satisfy, so nothing "
                f"stops the representation collapsing",
                where,
                related=(related(event, "the backward of the loss that holds the term"),)
                if calls else (),
                evidence={"fn": fn, "shape": event["shape"], "penalty": penalty},
                fix=(f"`{fixed}`: the {fn} of each feature over the batch" if fixed else self.fix))
