from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# calls that return their input's values rearranged: a distance stays a distance through them
_RESHAPES = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t",
             "contiguous", "float", "double", "clone", "detach", "cpu", "numpy"}


def _callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return None


def _broadcast(node: ast.AST) -> bool:
    """An operand given a new axis (``a[:, None]``, ``a.unsqueeze(1)``): one side of a pairwise
    difference between two sets."""
    return any((isinstance(sub, ast.Constant) and sub.value is None)
               or _callee(sub) in ("unsqueeze", "expand", "repeat") for sub in walk(node))


def _difference(node: ast.AST) -> bool:
    """``a[:, None] - b[None]``: a pairwise difference between two sets (through reshapes and
    ``abs``); a difference of two aligned tensors (a per-sample error) is no pairwise distance."""
    while _callee(node) in _RESHAPES | {"abs"} and isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and _callee(node) != "abs":
            node = node.func.value
        elif node.args:
            node = node.args[0]
        elif isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return False
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _broadcast(node)


def _squared(node: ast.AST) -> ast.AST | None:
    """The base of ``x ** 2``, ``x.pow(2)``, ``torch.pow(x, 2)``, ``x.square()``, ``x * x``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
            and isinstance(node.right, ast.Constant) and node.right.value == 2:
        return node.left
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
            and ast.dump(node.left) == ast.dump(node.right):
        return node.left
    name = _callee(node)
    if name == "square":
        return node.func.value if isinstance(node.func, ast.Attribute) and not node.args else \
            (node.args[0] if node.args else None)
    if name == "pow":
        args = node.args
        if isinstance(node.func, ast.Attribute) and len(args) == 1 and not (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            return node.func.value if isinstance(args[0], ast.Constant) and args[0].value == 2 else None
        if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value == 2:
            return args[0]
    return None


def _sum_of_squares(node: ast.AST) -> ast.AST | None:
    """The squared base of ``sum(x ** 2)`` in its spellings (``.sum(dim)``, ``torch.sum(...)``)."""
    if _callee(node) != "sum" or not isinstance(node, ast.Call):
        return None
    func = node.func
    inner = node.args[0] if isinstance(func, ast.Name) or (
        isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch") \
        else func.value
    if inner is None:
        return None
    return _squared(inner)


def _has_cross_term(node: ast.AST) -> bool:
    """A ``2 * a @ b.t()`` (``torch.matmul``/``mm``/``einsum``) inside ``node``."""
    for sub in walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            return True
        if _callee(sub) in ("matmul", "mm", "bmm", "einsum"):
            return True
    return False


def is_distance(node: ast.AST, names: set[str]) -> bool:
    """Whether the expression's values are distances (larger = farther): ``torch.cdist``,
    ``F.pairwise_distance``, a norm of a difference, a sum of squared differences, the expanded
    ``|a|^2 + |b|^2 - 2 a.b`` (also through ``torch.addmm(..., alpha=-2)``), their square roots
    and reshapes, or a name assigned one of those (``names``)."""
    if isinstance(node, ast.Name):
        return node.id in names
    name = _callee(node)
    if name in ("cdist", "pairwise_distance"):
        return True
    if name in _RESHAPES | {"sqrt", "clamp", "clamp_min", "clamp_"} and isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and not (
                isinstance(node.func.value, ast.Name) and node.func.value.id in ("torch", "F")):
            return is_distance(node.func.value, names)
        return bool(node.args) and is_distance(node.args[0], names)
    if name in ("norm", "vector_norm") and isinstance(node, ast.Call):
        target = node.args[0] if node.args and (isinstance(node.func, ast.Attribute) and isinstance(
            node.func.value, (ast.Name, ast.Attribute)) and ast.unparse(node.func.value) in (
            "torch", "torch.linalg", "LA")) else (node.func.value if isinstance(node.func, ast.Attribute) else None)
        return target is not None and _difference(target)
    if name == "addmm" and isinstance(node, ast.Call):
        return any(kw.arg == "alpha" and isinstance(kw.value, (ast.UnaryOp, ast.Constant))
                   and ast.unparse(kw.value).replace(" ", "") in ("-2", "-2.0") for kw in node.keywords)
    base = _sum_of_squares(node)
    if base is not None:
        return _difference(base)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Add)):
        terms = _signed_terms(node)
        # |a|^2 + |b|^2 - 2 a.b in any order of its terms: a squared norm added, the cross term
        # (twice a product) subtracted
        squares = any(sign > 0 and any(_sum_of_squares(sub) is not None for sub in walk(term))
                      for sign, term in terms)
        cross = any(sign < 0 and _has_cross_term(term)
                    and any(isinstance(s, ast.Constant) and s.value == 2 for s in walk(term))
                    for sign, term in terms)
        return squares and cross
    return False


def _signed_terms(node: ast.AST, sign: int = 1) -> list[tuple[int, ast.AST]]:
    """The additive terms of a sum of differences with their signs: ``a - b + c`` ->
    ``[(1, a), (-1, b), (1, c)]`` (a negation flips its operand's sign, ``2 * a @ b`` times a
    negative literal counts as subtracted)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        right = -sign if isinstance(node.op, ast.Sub) else sign
        return _signed_terms(node.left, sign) + _signed_terms(node.right, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _signed_terms(node.operand, -sign)
    factors, negative = [node], False
    while factors:
        factor = factors.pop()
        if isinstance(factor, ast.BinOp) and isinstance(factor.op, (ast.Mult, ast.MatMult, ast.Div)):
            factors += [factor.left, factor.right]
        elif isinstance(factor, ast.UnaryOp) and isinstance(factor.op, ast.USub) \
                and isinstance(factor.operand, ast.Constant):
            negative = not negative
    return [(-sign if negative else sign, node)]


def _indices_taken(call: ast.Call, parents: dict) -> bool:
    """Whether ``max(d, dim)``'s positions are used: ``[1]``, ``.indices``, ``_, i = ...``."""
    parent = parents.get(id(call))
    if isinstance(parent, ast.Subscript) and isinstance(parent.slice, ast.Constant):
        return parent.slice.value == 1
    if isinstance(parent, ast.Attribute):
        return parent.attr == "indices"
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 \
            and isinstance(parent.targets[0], ast.Tuple) and len(parent.targets[0].elts) == 2:
        second = parent.targets[0].elts[1]
        return not (isinstance(second, ast.Name) and second.id.startswith("_"))
    return False


def _scope(tree: ast.AST):
    """Each function (and the module) with the statements that belong to it, nested functions left out."""
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        body = []
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            body.append(node)
            stack.extend(ast.iter_child_nodes(node))
        yield body


def argmax_sites(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``[(line, the argmax call's text, the distance's text)]``: positions of the largest of
    distances: ``argmax(d)``, ``d.argmax(...)``, ``torch.max(d, dim)`` (its indices),
    ``d.max(dim)[1]`` / ``.indices``."""
    sites = []
    for body in _scope(tree):
        names: set[str] = set()
        for node in sorted((n for n in body if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if is_distance(node.value, names):
                    names.add(node.targets[0].id)
                else:
                    names.discard(node.targets[0].id)
        assigned = {}
        parents = {id(child): node for node in body for child in ast.iter_child_nodes(node)}
        for node in body:
            if isinstance(node, ast.Assign):
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    assigned[line] = " ".join(ast.unparse(t) for t in node.targets)
        for node in body:
            name = _callee(node)
            if name not in ("argmax", "max") or not isinstance(node, ast.Call):
                continue
            func = node.func
            torch_call = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id in ("torch", "np", "numpy")
            operand = (node.args[0] if node.args else None) if torch_call or isinstance(func, ast.Name) \
                else func.value
            if operand is None or not is_distance(operand, names):
                continue
            if name == "max" and not _indices_taken(node, parents):
                continue  # the largest distances' values (a margin, a radius), not their positions
            rest = node.args[1:] if torch_call or isinstance(func, ast.Name) else node.args
            if not rest and not any(kw.arg in ("dim", "axis") for kw in node.keywords):
                continue  # no dim: the largest distance's value or one position overall, no nearest per row
            if assigned.get(node.lineno) and any(word in assigned[node.lineno].lower()
                                                 for word in ("far", "hard", "worst", "max", "neg")):
                continue  # farthest point sampling, a hardest example: the largest is meant
            sites.append((node.lineno, ast.unparse(node), ast.unparse(operand)))
    return sorted(set(sites))


class ArgmaxOfDistances(Rule):
    """
    ## What it does
    Finds the nearest neighbour taken as the position of the *largest* distance: `argmax` (or
    `max(dim)`'s indices) of a tensor of distances — `torch.cdist`, `F.pairwise_distance`, a norm
    of a difference, a sum of squared differences, the expanded `|z|² + |e|² - 2 z·e` of a
    VQ-VAE's quantiser (its terms in any order, `-2 * z @ e.t()` added; also through `torch.addmm(..., alpha=-2)`), or a name assigned one of
    those in the same function. Read from the script's source once a backward ran.

    ## Why is this bad?
    A distance is smallest for the nearest entry: `argmax` picks the farthest one. A VQ-VAE then
    quantises every encoder output to the code farthest from it, and its codebook and
    commitment losses pull the codes and the encoder toward the worst match; a prototype or
    k-means assignment, a nearest-neighbour label or a hard negative is the opposite of the one
    meant. The shapes are right and training runs: the reconstruction stays poor.

    ## Example
    ```python
    distances = (z.pow(2).sum(1, keepdim=True) + codebook.weight.pow(2).sum(1)
                 - 2 * z @ codebook.weight.t())
    indices = torch.argmax(distances, dim=1)
    ```

    ## Use instead
    ```python
    indices = torch.argmin(distances, dim=1)
    ```

    ## Stays silent on
    `argmin` of distances; `argmax` of negated distances (`-d`, `(-d).softmax(...)`,
    `2 z·e - |z|² - |e|²`), of
    similarities (dot products, cosine similarity, `z @ e.t()` without the squared norms), of a
    `softmax(-d)`; `max(d)`/`argmax(d)` without a dim (the largest distance's value, a radius);
    per-sample errors (`(pred - y).pow(2).sum(1)`: a difference of aligned tensors, no pairwise
    distance); a result named for the farthest or hardest entry (`farthest = torch.max(d, -1)[1]`
    of farthest point sampling, a hard negative).
    Not seen: distances computed in another module than the script's, or built through a helper
    function whose result is then `argmax`ed.
    """

    code = "GD319"
    slug = "argmax-of-distances"
    severity = Severity.WARNING
    summary = ("the nearest neighbour (a VQ-VAE's code, a prototype, a cluster) is taken with argmax "
               "of distances: it picks the farthest one")
    fix = "take argmin of the distances (or argmax of their negation)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, call, operand in argmax_sites(tree):
                fixed = call.replace("argmax", "argmin", 1) if "argmax" in call else \
                    call.replace(".max(", ".min(", 1)
                yield self.finding(
                    f"`{call}` takes the position of the largest of `{operand}`, which are "
                    f"distances: it picks the farthest entry, not the nearest (a VQ-VAE's code, "
                    f"a prototype, a cluster), and every loss built on the choice pulls toward "
                    f"the worst match",
                    Location(path, line), evidence={"call": call, "distances": operand},
                    fix=f"`{fixed}`: the nearest entry has the smallest distance")
