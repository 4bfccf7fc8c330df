from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_SQUASH = ("sigmoid", "softmax", "log_softmax", "sigmoid_", "softmax_", "clamp", "clip")


def _summed(node: ast.AST) -> list[ast.AST]:
    """The expressions ``node`` sums: ``x.sum(...)``, ``torch.sum(x, ...)``, ``x.mean(...)``."""
    out = []
    for sub in walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr in ("sum", "mean"):
            if isinstance(sub.func.value, ast.Name) and sub.func.value.id == "torch" and sub.args:
                out.append(sub.args[0])
            else:
                out.append(sub.func.value)
    return out


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def overlap_scores_names(function: ast.AST) -> set[str]:
    """Names a function sums both multiplied by another name (the intersection ``(p * t).sum()``)
    and alone or added (the size ``p.sum()``, ``(p + t).sum()``): the scores of an overlap
    ratio. Only functions that divide."""
    if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in walk(function)):
        return set()
    products, sizes = set(), set()
    for summed in _summed(function):
        if isinstance(summed, ast.BinOp) and isinstance(summed.op, ast.Mult) \
                and isinstance(summed.left, ast.Name) and isinstance(summed.right, ast.Name):
            products |= {summed.left.id, summed.right.id}
        elif isinstance(summed, ast.Name):
            sizes.add(summed.id)
        elif isinstance(summed, ast.BinOp) and isinstance(summed.op, ast.Add):
            sizes |= _names(summed)
    return products & sizes


def _squashed(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr in _SQUASH)
        or (isinstance(n.func, ast.Name) and n.func.id in _SQUASH)) for n in walk(expr))


def overlap_site(tree: ast.AST) -> tuple[int, str, str] | None:
    """``(line, function, scores name)`` where the script's one overlap function (a soft dice,
    IoU or Tversky written by hand) takes its scores: the first statement of the function that
    assigns the scores name (``inputs = inputs.flatten(1)``, where a sigmoid belongs), or the
    function's line when it reads its parameter as given. None when no function, or more than
    one, computes such a ratio on a name nothing squashes."""
    sites = []
    for function in walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in function.args.args]
        for name in sorted(overlap_scores_names(function)):
            assigns = [n for n in walk(function) if isinstance(n, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
            if any(_squashed(n.value) for n in assigns):
                continue  # the function squashes them itself
            if assigns:
                first = min(assigns, key=lambda n: n.lineno)
                sites.append((first.lineno, function.name, name))
            elif name in params:
                sites.append((function.lineno, function.name, name))
    # the mask is multiplied and summed too: keep, in each function, the name that is no mask
    chosen = []
    for fn in dict.fromkeys(fn for _, fn, _ in sites):
        scores = [site for site in sites if site[1] == fn and not _mask_like(tree, fn, site[2])]
        if len(scores) == 1:
            chosen.append(scores[0])
    return chosen[0] if len(chosen) == 1 else None


_MASK_WORDS = ("target", "mask", "label", "gt", "onehot", "one_hot", "truth", "true")


def _mask_like(tree: ast.AST, function_name: str, name: str) -> bool:
    """A name that holds the 0/1 mask by its spelling (``target``, ``onehot``, ``gt_mask``) or by
    its making in the function (``F.one_hot(...)``, a comparison)."""
    if any(word in name.lower() for word in _MASK_WORDS) or name.lower() in ("y", "t", "m"):
        return True
    for function in walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name == function_name:
            for n in walk(function):
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                    if any(isinstance(sub, ast.Compare) or (isinstance(sub, ast.Call) and "one_hot" in ast.unparse(sub.func))
                           for sub in walk(n.value)):
                        return True
    return False


class OverlapOnRawScores(Rule):
    """
    ## What it does
    Finds a soft overlap ratio (dice, IoU, Tversky) computed on raw scores: in the graph of the
    first 3 backwards, a division whose numerator sums a product of a tensor with a graph and a
    0/1 mask without one (the intersection) and whose denominator reads the same tensor (its
    size), where that tensor is, through views and indexing only, a layer's signed output (a
    linear layer, a matrix product, a convolution) — logits, not probabilities. Reported where
    the script's one function computing such a ratio takes its scores (the statement that
    reshapes them, where the `sigmoid` belongs), else at the backward.

    ## Why is this bad?
    Dice and IoU measure overlap between a probability map in [0, 1] and a mask. On logits the
    "intersection" and "size" are sums of signed numbers: negative scores shrink the
    denominator, the ratio leaves [0, 1], and the loss is lowered by pushing scores to large
    magnitudes instead of covering the mask. Nothing fails; the mask head's dice term fights the
    cross-entropy or focal term beside it, and the masks come out worse.

    ## Example
    ```python
    def dice_loss(inputs, targets):
        inputs = inputs.flatten(1)
        numerator = 2 * (inputs * targets).sum(-1)
        denominator = inputs.sum(-1) + targets.sum(-1)
        return 1 - (numerator + 1) / (denominator + 1)
    ```

    ## Use instead
    ```python
    def dice_loss(inputs, targets):
        inputs = inputs.sigmoid().flatten(1)
        ...
    ```

    ## Stays silent on
    The ratio on a sigmoid's or softmax's output, whether the loss function or its caller
    applies it, or on a ReLU's or a clamp's (nothing below 0); a weighted mean (`sum(w * x) / sum(w)` divides by the weights,
    not the scores); soft targets (a mask of more than two values); products with no 0/1
    factor (cosine similarities, attention averages).
    """

    code = "GD385"
    slug = "overlap-on-raw-scores"
    severity = Severity.WARNING
    summary = ("a soft dice/IoU ratio is computed on raw scores that go below 0 (logits), not on "
               "probabilities")
    fix = "apply sigmoid (or softmax over the classes) to the scores before the overlap ratio"

    def check(self, a):
        told = set()
        for e in a.of_kind("overlap_scores"):
            loc, related, where = e.loc, (), ""
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                site = overlap_site(tree) if tree is not None else None
                if site is not None:
                    line, function, name = site
                    loc = Location(e.loc.path, line)
                    related = (Related(e.loc, "the backward whose loss holds the ratio"),)
                    where = f" `{name}` in {function}()"
            key = (loc.path, loc.line) if loc is not None else None
            if key in told:
                continue
            told.add(key)
            shape = "×".join(str(s) for s in e["shape"])
            yield self.finding(
                f"a soft overlap ratio (dice/IoU) divides the sum of scores × a 0/1 mask ({shape}) "
                f"by the sum of the same scores, and those scores{where} are a {e['producer']}'s "
                f"raw output, not probabilities: negative scores shrink the denominator, the "
                f"ratio leaves [0, 1], and the loss is lowered by inflating the scores rather "
                f"than by covering the mask",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=(f"squash the scores first: `{name} = {name}.sigmoid()` (or a softmax over "
                     f"the classes) before the ratio" if where else self.fix),
                evidence={"shape": list(e["shape"]), "producer": e["producer"]})
