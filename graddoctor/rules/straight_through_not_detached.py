from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def cancelling_sum(node: ast.AST) -> tuple[str, str] | None:
    """``(the whole expression, the cancelled operand)`` for ``x + (y - x)``, ``(y - x) + x``
    (``y - x + x``) and ``x - (x - y)`` in the script's text; else None."""
    if not isinstance(node, ast.BinOp):
        return None
    left, right = node.left, node.right
    if isinstance(node.op, ast.Add):
        for kept, diff in ((left, right), (right, left)):
            if isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub) and _same(diff.right, kept):
                return ast.unparse(node), ast.unparse(kept)
    elif isinstance(node.op, ast.Sub) and isinstance(right, ast.BinOp) \
            and isinstance(right.op, ast.Sub) and _same(right.left, left):
        return ast.unparse(node), ast.unparse(left)
    return None


class StraightThroughNotDetached(Rule):
    """
    ## What it does
    Finds a straight-through estimator written without its `.detach()`: the loss's graph sums a
    tensor with a difference that subtracts the same tensor again (`z + (z_q - z)`,
    `y_hard - y_soft + y_soft`, `x - (x - q)`), so the tensor's gradient along that sum is
    exactly zero. Read from the graphs of the first 3 backwards; it points at the line of the
    script that writes the sum (else at the backward).

    ## Why is this bad?
    A straight-through estimator passes the quantised (hard, rounded, binarised) value forward
    and the continuous one's gradient backward: `z + (z_q - z).detach()`. Without the detach,
    `z + (z_q - z)` is `z_q` in value and in gradient: `z` is added once and subtracted once,
    and its two gradients cancel. The VQ-VAE's encoder, the hard Gumbel-softmax's logits, the
    quantisation-aware or binary network's full-precision weights get nothing through the
    estimator: they learn only from the other terms that reach them (a commitment loss, a KL),
    or not at all. Nothing fails.

    ## Example
    ```python
    z_q = codebook(indices)
    z_q = z + (z_q - z)
    ```

    ## Use instead
    ```python
    z_q = codebook(indices)
    z_q = z + (z_q - z).detach()
    ```

    ## Stays silent on
    The detached forms (`z + (z_q - z).detach()`, `y_hard - y_soft.detach() + y_soft`,
    `F.gumbel_softmax(hard=True)`); an interpolation (`x + (y - x) * t`, `torch.lerp`); a
    difference of another tensor (`x + (f(x) - x.mean())`); the zero-valued `x - x.detach()`
    (DiCE's magic box); sums that are never backpropagated (inference code).
    """

    code = "GD181"
    slug = "straight-through-not-detached"
    severity = Severity.WARNING
    summary = ("a straight-through estimator without .detach(): x + (q - x) is q in value and "
               "in gradient, so x's two gradients cancel and nothing flows back through it")
    fix = "detach the difference: x + (q - x).detach()"

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("straight_through_cancelled", ()):
            if event.loc is None:
                continue
            sites = self._sites(a, event.loc.path)
            kept = ", ".join(sorted(set(event.get("kept") or ())))
            if not sites:
                if (event.loc.path, event.loc.line) in told:
                    continue
                told.add((event.loc.path, event.loc.line))
                yield self.finding(
                    f"the loss backpropagated here sums a tensor with a difference that subtracts "
                    f"it again (x + (q - x); the cancelled node: {kept}): its gradient along that "
                    f"sum is exactly zero, a straight-through estimator without .detach()",
                    event.loc, evidence={"forms": list(event.get("forms") or ())})
                continue
            for line, text, operand in sites:
                if (event.loc.path, line) in told:
                    continue
                told.add((event.loc.path, line))
                yield self.finding(
                    f"`{text}` equals the quantised value in its forward and in its gradient: "
                    f"`{operand}` is added once and subtracted once, so its two gradients "
                    f"cancel exactly and nothing flows back to it through this straight-through "
                    f"estimator (the loss at the backward on line {event.loc.line} reaches this "
                    f"sum)",
                    Location(event.loc.path, line),
                    related=[Related(event.loc, "the backward whose graph holds the sum")],
                    fix=f"detach the difference, so that only `{operand}`'s gradient flows: "
                        f"{self._fixed(text, operand)}",
                    evidence={"expression": text, "cancelled": operand})

    @staticmethod
    def _fixed(text: str, operand: str) -> str:
        try:
            node = ast.parse(text, mode="eval").body
        except SyntaxError:
            return f"{operand} + (... - {operand}).detach()"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for kept, diff in ((node.left, node.right), (node.right, node.left)):
                if isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub) \
                        and ast.unparse(diff.right) == operand:
                    return f"{ast.unparse(kept)} + ({ast.unparse(diff)}).detach()"
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.BinOp):
            return f"{operand} - ({ast.unparse(node.right)}).detach()"
        return f"{operand} + (... - {operand}).detach()"

    @staticmethod
    def _sites(a, path: str) -> list[tuple[int, str, str]]:
        tree = a.source.tree(path)
        if tree is None:
            return []
        sites = []

        def gradless(node) -> bool:
            items = [i.context_expr for i in node.items] if isinstance(node, (ast.With, ast.AsyncWith)) \
                else node.decorator_list if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            return any(("no_grad" in (text := ast.unparse(item)) or "inference_mode" in text)
                       for item in items)

        def visit(node) -> None:
            if gradless(node):
                return  # never backpropagated: inference code may write the sum as it likes
            hit = cancelling_sum(node)
            if hit is not None:
                sites.append((node.lineno, hit[0], hit[1]))
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(tree)
        return sorted(sites)
