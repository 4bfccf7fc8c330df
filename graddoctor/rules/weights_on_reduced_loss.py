from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .sample_weights_broadcast import _SPAN, _product_line
from ..analysis.source import walk

_SHAPE_WORDS = {"mean": "the batch's mean", "sum": "the batch's sum"}


def _shape(shape) -> str:
    dims = list(shape or ())
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "") or ""


def _loss_call(node: ast.AST) -> bool:
    """A call that reads as a loss's: ``F.mse_loss(...)``, ``criterion(...)``,
    ``self.loss_fn(...)``, ``nn.BCEWithLogitsLoss()(...)``, ``F.cross_entropy(...)``."""
    if not isinstance(node, ast.Call):
        return False
    name = _call_name(node).lower()
    if isinstance(node.func, ast.Call):  # nn.MSELoss()(pred, y)
        name = _call_name(node.func).lower()
    return "loss" in name or "criterion" in name or "cross_entropy" in name


def _unreduced(call: ast.Call) -> bool:
    return any(k.arg == "reduction" and isinstance(k.value, ast.Constant) and k.value.value == "none"
               for k in call.keywords)


def _with_no_reduction(call: ast.Call) -> str:
    """The call's source with ``reduction="none"`` (replacing a reduction it names)."""
    keywords = [k for k in call.keywords if k.arg != "reduction"]
    keywords.append(ast.keyword(arg="reduction", value=ast.Constant("none")))
    return ast.unparse(ast.Call(func=call.func, args=call.args, keywords=keywords))


def _functional(call: ast.Call) -> bool:
    """A loss function that takes ``reduction=`` as a keyword (``F.x_loss``), not a module."""
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id in ("F", "functional", "nnf") or (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and func.value.attr == "functional")


def _loss_assignment(tree: ast.AST, line: int) -> int:
    """The line of the latest assignment, within ``_SPAN`` lines above, of the name whose
    ``.backward()`` is called on ``line`` (a line of several statements,
    ``opt.zero_grad(); loss.backward(); opt.step()``, is searched from its backward); ``line``
    itself when there is none."""
    names = {n.func.value.id for n in walk(tree) if isinstance(n, ast.Call)
             and getattr(n, "lineno", None) == line and isinstance(n.func, ast.Attribute)
             and n.func.attr == "backward" and isinstance(n.func.value, ast.Name)}
    bound = [n.lineno for n in walk(tree) if isinstance(n, ast.Assign) and line - _SPAN <= n.lineno < line
             and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)]
    return max(bound) if len(names) == 1 and bound else line


def reduced_loss_call(tree: ast.AST, line: int) -> tuple[int, ast.Call | None] | None:
    """The line of the loss call whose reduced value the backward on ``line`` multiplies by a
    factor, with the call (None when the product's own statement is the best known line),
    searched from the product statement (``sample_weights_broadcast._product_line``): a loss
    call that is a side of a product, or the latest assignment above the product, within
    ``_SPAN`` lines, of a name a side reads, from a loss call without ``reduction=``."""
    found = _product_line(tree, _loss_assignment(tree, line))
    if found is None:
        return None
    product_line, products = found
    assigns = [n for n in walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
               and isinstance(n.targets[0], ast.Name) and _loss_call(n.value)
               and product_line - _SPAN <= n.lineno < product_line]
    for product in products:
        if not isinstance(product.op, ast.Mult):
            continue
        for side in (product.left, product.right):
            for node in walk(side):
                if _loss_call(node) and not _unreduced(node):
                    return product_line, node
                if isinstance(node, ast.Name):
                    bound = [n for n in assigns if n.targets[0].id == node.id]
                    if bound:
                        latest = max(bound, key=lambda n: n.lineno)
                        if not _unreduced(latest.value):
                            return latest.lineno, latest.value
    return product_line, None


def construction(tree: ast.AST, call: ast.Call, line: int) -> ast.Assign | None:
    """The latest assignment above ``line`` that builds the loss module ``call`` calls
    (``criterion = nn.MSELoss()``, ``self.loss_fn = nn.BCEWithLogitsLoss(pos_weight=w)``),
    or None."""
    name = ast.unparse(call.func)
    built = [n for n in walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and ast.unparse(n.targets[0]) == name and isinstance(n.value, ast.Call)
             and "loss" in _call_name(n.value).lower()]
    before = [n for n in built if n.lineno < line]
    if before:
        return max(before, key=lambda n: n.lineno)
    return built[0] if len(built) == 1 else None  # a class's __init__ below its use


class WeightsOnReducedLoss(Rule):
    """
    ## What it does
    Finds a product on the loss's path between a loss that torch already reduced over the batch
    (`F.binary_cross_entropy_with_logits(logits, y)`, `criterion(out, y)` with the default
    `reduction="mean"` or with `"sum"`) and a factor with one value per sample: sample weights,
    a focal loss's `alpha_t * (1 - p_t) ** gamma`, a validity mask, importance weights. Seen in
    the graph of the first backwards: a multiplication one of whose inputs comes straight out of
    a reduced torch loss node, the other of shape `(N, ...)` with `N` the loss input's batch
    (4 samples or more). Reported at the loss call the script makes without `reduction=`.

    ## Why is this bad?
    A reduced loss is one number. `(loss * w).mean()` is `loss * w.mean()`: every sample is
    weighted by the batch's mean weight, not its own, so the weighting does nothing but scale
    the learning rate from batch to batch. A focal loss built on a reduced cross-entropy
    modulates the whole batch by one factor: hard examples are no longer weighted up, the easy
    majority class dominates again, and an imbalanced classifier's recall collapses. The
    shapes broadcast, the loss falls, torch says nothing.

    ## Example
    ```python
    bce = F.binary_cross_entropy_with_logits(logits, targets)  # one number
    p_t = torch.exp(-bce)
    loss = (alpha_t * (1 - p_t) ** gamma * bce).mean()
    ```

    ## Use instead
    ```python
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")  # one per sample
    p_t = torch.exp(-bce)
    loss = (alpha_t * (1 - p_t) ** gamma * bce).mean()
    ```

    ## Stays silent on
    Per-sample losses (`reduction="none"`) weighted and then reduced; a reduced loss times a
    number or a 0-d tensor (a task weight, a learned log-variance, a warm-up factor); a stack of
    reduced task losses times a weight per task (`torch.stack([l1, l2]) * w`: its length is the
    tasks', not the batch's); class weights passed to the loss (`weight=`, `pos_weight=`);
    batches of fewer than 4 samples (a factor of that length could be one per task). Composite
    losses torch writes out of other ops (`l1_loss`, `poisson_nll_loss`, `gaussian_nll_loss`,
    `kl_div`) are not recognised as losses; a product between the reduced loss and its factor
    through another op (`(l1 + l2) * w`) is not followed.
    """

    code = "GD329"
    slug = "weights-on-reduced-loss"
    severity = Severity.WARNING
    summary = ("per-sample weights or a per-sample factor multiply a loss torch already reduced "
               "over the batch: every sample gets the batch's mean factor, not its own")
    fix = ("compute the per-sample losses with reduction=\"none\", multiply them by the "
           "factor, then reduce")

    def check(self, a):
        used: set = set()
        for event in a.by_kind.get("weighted_reduced", ()):
            loc = event.loc
            fn, reduction = event["fn"], event["reduction"]
            tree = a.source.tree(loc.path) if loc is not None else None
            found = reduced_loss_call(tree, loc.line) if tree is not None else None
            fix = None
            if found is not None:
                line, call = found
                if (loc.path, line) in used:
                    continue
                used.add((loc.path, line))
                loc = Location(loc.path, line)
                if call is not None:
                    text = ast.unparse(call)
                    if _functional(call):
                        fixed = _with_no_reduction(call)
                        fix = (f"`{fixed}`: one loss per sample, then weight and reduce "
                               f"it (`.mean()` or a weighted mean)")
                    elif (built := construction(tree, call, line)) is not None:
                        loc = Location(loc.path, built.lineno)
                        fix = (f"`{ast.unparse(built.targets[0])} = {_with_no_reduction(built.value)}`"
                               f": `{text}` then gives one loss per sample, to weight and reduce")
                    else:
                        fix = (f"build `{ast.unparse(call.func)}` with reduction=\"none\" so that "
                               f"`{text}` gives one loss per sample, then weight and reduce it")
            yield self.finding(
                f"{fn} is reduced to one number ({reduction} over the batch) before it is "
                f"multiplied by a factor of shape {_shape(event['factor_shape'])}, one value per "
                f"sample of its {_shape(event['input_shape'])} input: the product is the loss "
                f"times {_SHAPE_WORDS[reduction]} factor, so no sample is weighted by its own "
                f"(sample weights, a focal factor or a mask only rescale the batch's loss)",
                loc, step=a.next_step_number(event.seq),
                evidence={"fn": fn, "reduction": reduction, "input_shape": event["input_shape"],
                          "factor_shape": event["factor_shape"],
                          "factor_grad": event["factor_grad"]},
                fix=fix)
