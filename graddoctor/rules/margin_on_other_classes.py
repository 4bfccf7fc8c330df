from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# names that carry a margin-softmax margin (ArcFace's m, cos_m/sin_m, the th/mm fallback)
_MARGIN_NAMES = frozenset({"m", "margin", "cos_m", "sin_m", "mm", "m1", "m2", "m3", "m_arc", "m_cos"})


def _names(node: ast.AST) -> set[str]:
    """Identifiers an expression reads: names and attribute names."""
    out = set()
    for n in walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _has_margin(names: set[str]) -> bool:
    return any(n in _MARGIN_NAMES or "margin" in n.lower() for n in names)


class _Function:
    """One function's assignments, to follow a name one or two steps back to what made it."""

    def __init__(self, function):
        self.assigned: dict[str, list[ast.AST]] = {}
        for n in walk(function):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(n.value)

    def reads(self, node: ast.AST, depth: int = 2) -> set[str]:
        """The identifiers an expression reads, through the assignments of the names in it."""
        names = _names(node)
        if depth:
            for name in list(names):
                for value in self.assigned.get(name, ()):
                    names |= self.reads(value, depth - 1)
        return names

    def is_one_hot(self, node: ast.AST) -> bool:
        """A one-hot of the labels: ``one_hot`` itself, a name assigned ``F.one_hot(...)`` or a
        ``scatter``/``scatter_`` of ones, or either converted (``.bool()``, ``.float()``)."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
                and node.func.attr in ("bool", "float", "byte", "half", "type_as", "to"):
            node = node.func.value
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            node = node.left
        if not isinstance(node, ast.Name):
            return False
        if "one_hot" in node.id.lower() or "onehot" in node.id.lower():
            return True
        for value in self.assigned.get(node.id, ()):
            text = ast.unparse(value)
            if "one_hot(" in text or ".scatter_(1" in text or ".scatter(1" in text:
                return True
        return False

    def complement_of_one_hot(self, node: ast.AST) -> bool:
        """``1 - one_hot``, ``1.0 - one_hot``, ``~one_hot``, ``one_hot.logical_not()``."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
                and isinstance(node.left, ast.Constant) and node.left.value == 1:
            return self.is_one_hot(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)):
            return self.is_one_hot(node.operand)
        if isinstance(node, ast.Name):  # a name assigned the complement
            return any(self.complement_of_one_hot(v) for v in self.assigned.get(node.id, ()))
        return False


def _product(node: ast.AST):
    """``(a, b)`` of ``a * b``, else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return node.left, node.right
    return None


def margin_on_other_classes(function) -> list[tuple[int, str]]:
    """``(line, text)`` of each statement of ``function`` that puts a margin-softmax margin on
    the classes other than the label's: ``one_hot * cosine + (1 - one_hot) * phi`` where only
    ``phi`` reads a margin, ``cosine - (1 - one_hot) * m``, or ``torch.where(one_hot, cosine,
    phi)``."""
    fn = _Function(function)
    found = []
    for node in walk(function):
        # one_hot * plain + (1 - one_hot) * margined, terms and factors in any order
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = _product(node.left), _product(node.right)
            if left and right:
                for target, other in ((left, right), (right, left)):
                    for i in (0, 1):
                        if not fn.is_one_hot(target[i]):
                            continue
                        kept = target[1 - i]
                        for j in (0, 1):
                            if fn.complement_of_one_hot(other[j]):
                                moved = other[1 - j]
                                if _has_margin(fn.reads(moved)) and not _has_margin(fn.reads(kept)):
                                    found.append(node)
        # cosine - (1 - one_hot) * m
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            product = _product(node.right)
            if product:
                for i in (0, 1):
                    if fn.complement_of_one_hot(product[i]) and _has_margin(_names(product[1 - i])):
                        found.append(node)
        # torch.where(one_hot, plain, margined)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "where" \
                and len(node.args) == 3 and fn.is_one_hot(node.args[0]):
            if _has_margin(fn.reads(node.args[2])) and not _has_margin(fn.reads(node.args[1])):
                found.append(node)
    lines = []
    for node in found:
        line = node.lineno
        if all(line != seen for seen, _ in lines):
            lines.append((line, ast.unparse(node)))
    return sorted(lines)


class MarginOnOtherClasses(Rule):
    """
    ## What it does
    Finds a margin-softmax head (ArcFace, CosFace, SphereFace) that applies its margin to the
    classes other than the label's: the one-hot of the labels selects the plain cosine and its
    complement the margined one (`one_hot * cosine + (1 - one_hot) * phi`), the margin is
    subtracted under the complement (`cosine - (1 - one_hot) * m`), or `torch.where(one_hot,
    cosine, phi)` picks them the wrong way round. Read from the script's source, in the files
    whose backwards ran: the margined side reads a margin (`m`, `margin`, `cos_m`/`sin_m`, `mm`)
    through its assignments, the other side does not.

    ## Why is this bad?
    The margin exists to make the label's class harder to win: its logit is lowered
    (cos(theta + m), cos - m) so that the features must be closer to their class centre than
    plain softmax asks. Put on every other class instead, it makes the competitors easier to
    beat, the opposite pressure: the loss goes down faster and the embeddings come out less
    compact and less separable than with no margin at all (verification accuracy drops).

    ## Example
    ```python
    one_hot = torch.zeros_like(cosine).scatter_(1, label.view(-1, 1), 1)
    output = (1.0 - one_hot) * phi + one_hot * cosine
    ```

    ## Use instead
    ```python
    one_hot = torch.zeros_like(cosine).scatter_(1, label.view(-1, 1), 1)
    output = one_hot * phi + (1.0 - one_hot) * cosine
    ```

    ## Stays silent on
    The margin on the label's class, in any order of the terms; CosFace's `s * (cosine -
    one_hot * m)`; circle loss, whose positive and negative logits both read a margin; a
    CurricularFace-style reweighting of hard negatives (no margin name on that side).
    """

    code = "GD364"
    slug = "margin-on-other-classes"
    severity = Severity.WARNING
    summary = ("a margin-softmax head puts its margin on the classes other than the label's: the "
               "one-hot mask is inverted")
    fix = "apply the margin where the one-hot of the label is 1: one_hot * phi + (1 - one_hot) * cosine"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for function in walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for line, text in margin_on_other_classes(function):
                    yield self.finding(
                        f"`{text}` puts the margin on every class but the label's: the one-hot "
                        f"of the labels selects the plain cosine and its complement the margined "
                        f"value, so the competing classes are made easier to beat instead of the "
                        f"label's class harder, and the embeddings get less compact than without "
                        f"a margin",
                        Location(path, line),
                        evidence={"statement": text},
                    )
