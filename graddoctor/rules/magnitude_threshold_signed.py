from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# methods that keep a tensor's values (a copy, a view, a detach): `p.detach()` is `p`
_SAME_VALUES = {"detach", "clone", "flatten", "view", "reshape", "contiguous", "float", "cpu",
                "ravel", "view_as", "reshape_as"}
# what turns magnitudes into a threshold: an order statistic of them
_ORDER = {"kthvalue", "quantile", "nanquantile", "topk", "sort", "median", "percentile"}


def _base(node: ast.AST) -> str | None:
    """``p`` of ``p``, ``p.data``, ``p.detach()``, ``p.detach().flatten()``, ``self.w.data``;
    None for anything else."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _SAME_VALUES:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr == "data":
            node = node.value
        else:
            break
    if isinstance(node, ast.Name) or (isinstance(node, ast.Attribute)
                                      and isinstance(node.value, (ast.Name, ast.Attribute))):
        return ast.unparse(node)
    return None


def _magnitudes_of(node: ast.AST) -> set[str]:
    """The tensors whose absolute values ``node`` reads (``p.abs()``, ``torch.abs(p)``,
    ``abs(p)``, ``p.detach().abs()``)."""
    found = set()
    for n in walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "abs" \
                and not n.args:
            base = _base(n.func.value)
        elif isinstance(n, ast.Call) and n.args and (
                (isinstance(n.func, ast.Name) and n.func.id == "abs")
                or (isinstance(n.func, ast.Attribute) and n.func.attr == "abs")):
            base = _base(n.args[0])
        else:
            continue
        if base is not None:
            found.add(base)
    return found


def _order_statistic(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in _ORDER)
               or (isinstance(n, ast.Name) and n.id in _ORDER) for n in walk(node))


def _negated_in(nodes, threshold: ast.AST) -> bool:
    """Whether the scope also uses the threshold negated (``x < -bound``, ``clamp(x, -t, t)``):
    a symmetric clip of signed values, which compares them with the magnitude on purpose."""
    text = ast.unparse(threshold)
    return any(isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)
               and ast.unparse(n.operand) == text for n in nodes)


def signed_magnitude_comparisons(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, comparison, tensor)``: a tensor compared as it is (signed) with a threshold
    made from an order statistic of its absolute values (``thresh = p.abs().kthvalue(k)``,
    then ``p > thresh``), in one function (or at module level), the threshold inline or
    assigned to a name first."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes.append(tree)
    for scope in scopes:
        body = scope.body if isinstance(scope, ast.Module) else [scope]
        thresholds: dict[str, set[str]] = {}
        nodes = [n for stmt in body for n in walk(stmt)]
        if isinstance(scope, ast.Module):  # module level: not inside a function
            inner = {id(n) for f in scopes if f is not tree for n in walk(f)}
            nodes = [n for n in nodes if id(n) not in inner]
        for n in nodes:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                    and _order_statistic(n.value):
                bases = _magnitudes_of(n.value)
                if bases:
                    thresholds[n.targets[0].id] = bases
        for n in nodes:
            if not (isinstance(n, ast.Compare) and len(n.ops) == 1
                    and isinstance(n.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE))):
                continue
            left, right = n.left, n.comparators[0]
            # the signed side: greater than the threshold (`p > t`, `t < p`), or below it (`p < t`)
            for signed, threshold in ((left, right), (right, left)):
                base = _base(signed)
                if base is None:
                    continue
                if isinstance(threshold, ast.Name):
                    bases = thresholds.get(threshold.id, set())
                elif _order_statistic(threshold):
                    bases = _magnitudes_of(threshold)
                else:
                    continue
                if base in bases and not _negated_in(nodes, threshold):
                    found.append((n.lineno, ast.unparse(n), base))
                    break
    return sorted(set(found))


class MagnitudeThresholdSigned(Rule):
    """
    ## What it does
    Finds a magnitude threshold applied to signed values: a threshold made from an order
    statistic of a tensor's absolute values (`thresh = w.abs().kthvalue(k).values`,
    `torch.quantile(w.abs(), 0.8)`, `w.abs().flatten().sort()[0][k]`) compared with the tensor
    itself, not its absolute value (`mask = w > thresh`) — magnitude pruning's mask, a
    sparsifier's keep set, a clipping of outliers. Read from the source of the files a
    backward ran from.

    ## Why is this bad?
    The threshold is a magnitude: comparing the signed weights with it keeps only the large
    positive weights and removes every large negative one, the most important half of the
    weights the pruning meant to keep. The mask still has about the intended density, so
    nothing looks wrong; the pruned model is much worse than magnitude pruning should leave
    it.

    ## Example
    ```python
    thresh = w.detach().abs().flatten().kthvalue(k).values
    mask = (w.detach() > thresh).float()
    ```

    ## Use instead
    ```python
    thresh = w.detach().abs().flatten().kthvalue(k).values
    mask = (w.detach().abs() > thresh).float()
    ```

    ## Stays silent on
    The absolute values compared (`w.abs() > thresh`, `torch.abs(w) >= t`); a threshold made
    from the signed values themselves (`w.kthvalue(k)`: a signed cut on purpose); a threshold
    of another tensor's magnitudes (gradients, scores); a symmetric clip that also uses the
    threshold negated (`torch.where(x > t, t, x)` beside `x < -t`); comparisons in files no
    backward ran from.
    """

    code = "GD367"
    slug = "magnitude-threshold-signed"
    severity = Severity.WARNING
    summary = ("a threshold made from a tensor's absolute values is compared with the signed "
               "tensor: large negative values are dropped")
    fix = "compare the absolute values: (w.abs() > thresh)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, base in signed_magnitude_comparisons(tree):
                fixed = _with_abs(text, base)
                yield self.finding(
                    f"`{text}` compares `{base}` as it is with a threshold made from its "
                    f"absolute values: every large negative value falls on the wrong side, so "
                    f"the mask keeps only large positive values and drops the large negative "
                    f"ones it was meant to keep",
                    Location(path, line), evidence={"tensor": base},
                    fix=(f"compare the absolute values: `{fixed}`" if fixed else
                         f"compare the absolute values: `{base}.abs()`"))


def _with_abs(text: str, base: str) -> str | None:
    """The comparison with ``.abs()`` put on its signed side."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Compare):
        return None
    for attr in ("left",):
        side = getattr(node, attr)
        if _base(side) == base:
            node.left = ast.Call(func=ast.Attribute(value=side, attr="abs", ctx=ast.Load()),
                                 args=[], keywords=[])
            return ast.unparse(node)
    if _base(node.comparators[0]) == base:
        side = node.comparators[0]
        node.comparators[0] = ast.Call(func=ast.Attribute(value=side, attr="abs", ctx=ast.Load()),
                                       args=[], keywords=[])
        return ast.unparse(node)
    return None
