from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


# methods that keep a tensor's values (only its shape or dtype changes)
_SHAPE_ONLY = {"view", "reshape", "t", "transpose", "unsqueeze", "squeeze", "flatten", "permute",
               "expand", "expand_as", "view_as", "reshape_as", "to", "float", "contiguous"}


def _detached_attribute(node: ast.AST) -> str | None:
    """``self.v`` of ``self.v.data`` or ``self.v.detach()`` (an attribute of ``self``; through
    shape-only methods: ``self.v.data.view(-1, 1)``), else None."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in _SHAPE_ONLY:
        node = node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "data":
        inner = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "detach" and not node.args:
        inner = node.func.value
    else:
        return None
    if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) \
            and inner.value.id == "self":
        return ast.unparse(inner)
    return None


def _factors(node: ast.AST) -> list[ast.AST]:
    """The operands of a chain of products and quotients (through negations)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        return _factors(node.left) + _factors(node.right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _factors(node.operand)
    return [node]


def _reads_with_grad(node: ast.AST, attribute: str, assigned: dict | None = None) -> bool:
    """Whether ``attribute`` (``self.v``) is read in ``node`` other than through ``.data`` or
    ``.detach()``, directly or through a local name the function assigned from such a read
    (``norm = self.v.norm(dim=1)``)."""
    if assigned:
        for n in walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) \
                    and any(_reads_with_grad(value, attribute) for value in assigned.get(n.id, ())):
                return True
    cut = {id(n.value) if isinstance(n, ast.Attribute) else id(n.func.value)
           for n in walk(node)
           if ((isinstance(n, ast.Attribute) and n.attr == "data")
               or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr == "detach"))
           and _detached_attribute(n) is not None}
    return any(isinstance(n, ast.Attribute) and ast.unparse(n) == attribute and id(n) not in cut
               for n in walk(node))


def _under_no_grad(function: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in walk(function):
        if isinstance(node, ast.With) and any("no_grad" in ast.unparse(item.context_expr)
                                              or "inference_mode" in ast.unparse(item.context_expr)
                                              for item in node.items):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def detached_factors(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, statement, attribute)``: in a ``forward``, a product or quotient one of whose
    factors reads a module attribute through ``.data``/``.detach()`` while another factor reads
    the same attribute with its gradient (``self.g * self.v.data / self.v.norm(dim=1)``)."""
    found = []
    for function in walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.name != "forward":
            continue
        quiet = _under_no_grad(function)
        assigned: dict[str, list] = {}
        for stmt in walk(function):
            if isinstance(stmt, ast.Assign) and stmt.lineno not in quiet:
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(stmt.value)
        seen: set[int] = set()
        for node in walk(function):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div))) \
                    or node.lineno in quiet or node.lineno in seen:
                continue
            factors = _factors(node)
            for i, factor in enumerate(factors):
                attribute = _detached_attribute(factor)
                if attribute is None:
                    continue
                if any(_reads_with_grad(other, attribute, assigned)
                       for j, other in enumerate(factors) if j != i):
                    statement = next((s for s in walk(function) if isinstance(s, ast.stmt)
                                      and not isinstance(s, (ast.FunctionDef, ast.With, ast.If,
                                                             ast.For, ast.While, ast.Try))
                                      and s.lineno <= node.lineno <= (s.end_lineno or s.lineno)),
                                     None)
                    text = ast.unparse(statement) if statement is not None else ast.unparse(node)
                    found.append((node.lineno, text, attribute))
                    seen.add(node.lineno)
                    break
    return sorted(set(found))


class WeightFactorDetached(Rule):
    """
    ## What it does
    Finds a reparametrised weight written by hand whose gradient flows through only part of
    it: in a module's `forward`, a product or quotient one of whose factors reads a module
    attribute through `.data` or `.detach()` while another factor reads the same attribute
    with its gradient — weight normalisation as `self.g * self.v.data / self.v.norm(dim=1,
    keepdim=True)`, a scaled weight `self.w.detach() * self.scale / self.w.abs().max()`. The
    attribute must be one of the model's trained parameters. Read from the source of the files
    a backward ran from.

    ## Why is this bad?
    The factor read through `.data` is a constant to autograd, so the parameter's gradient is
    only the part that flows through the other factor (its norm, its maximum): for weight
    normalisation that gradient is parallel to `v` and only rescales it, so the direction of
    the weights — what the layer computes — never learns what the loss asks. Training runs,
    the loss falls a little through the gains and biases, and stalls far above where it
    should.

    ## Example
    ```python
    def forward(self, x):
        w = self.g * self.v.data / self.v.norm(dim=1, keepdim=True)
        return F.linear(x, w, self.b)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        w = self.g * self.v / self.v.norm(dim=1, keepdim=True)
        return F.linear(x, w, self.b)
    ```

    ## Stays silent on
    A straight-through estimator (`w + (q - w).detach()`: the detached part is a difference
    added to the weight, not a factor); a statement under `torch.no_grad()` (an in-place
    constraint or an EMA update inside `forward`); a detached factor of another tensor than the
    one read with gradient (a teacher's weights, a frozen buffer); attributes that are not
    parameters of the model the run trained; modules defined in files no backward ran from.
    """

    code = "GD366"
    slug = "weight-factor-detached"
    severity = Severity.WARNING
    summary = ("a hand-written reparametrised weight reads a parameter through .data/.detach() "
               "in one factor and with its gradient in another: it trains only through the other")
    fix = "read the parameter itself in every factor (drop the .data / .detach())"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        leaves = {str(name).split(" ")[0].rsplit(".", 1)[-1]
                  for name in (a.param_name(pid) for pid in a.params) if name}
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, attribute in detached_factors(tree):
                name = attribute.split(".", 1)[1]
                if name not in leaves:
                    continue
                cut = ".data" if f"{attribute}.data" in text else ".detach()"
                fixed = text.replace(f"{attribute}.data", attribute).replace(
                    f"{attribute}.detach()", attribute)
                yield self.finding(
                    f"`{text}` reads `{attribute}` through `{cut}` in one factor and with its "
                    f"gradient in another: autograd treats the `{cut}` factor as a constant, so "
                    f"`{attribute}` is trained only through the other factor (for a weight "
                    f"normalisation, its norm: a gradient that only rescales it), and the "
                    f"weights' direction never learns",
                    Location(path, line), evidence={"attribute": attribute, "cut": cut},
                    fix=f"read `{attribute}` itself: `{fixed}`")
