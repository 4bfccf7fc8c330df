from __future__ import annotations

import ast

from ..analysis.source import scope_walk as _own_nodes
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_LOSS_FUNCTIONS = frozenset({"binary_cross_entropy_with_logits", "binary_cross_entropy"})
_LOSS_MODULES = frozenset({"BCEWithLogitsLoss", "BCELoss"})
_SQUASH = frozenset({"sigmoid"})
# methods that keep the values as they are (their shape or dtype only)
_KEEP = frozenset({"float", "double", "half", "to", "type_as", "long", "int", "squeeze", "view",
                   "reshape", "flatten", "unsqueeze", "view_as", "reshape_as", "contiguous", "detach"})


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles every parsed node
        return ""


def _callee(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


class _Scope:
    """The single-name assignments of one function (or the module's top level), tuple
    unpacking of a tuple of the same length included, by name and line."""

    def __init__(self, scope: ast.AST):
        self.assigned: dict[str, list[tuple[int, ast.AST]]] = {}
        self.calls: list[ast.Call] = []
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                if isinstance(target, ast.Name):
                    self.assigned.setdefault(target.id, []).append((node.lineno, value))
                elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                        and len(target.elts) == len(value.elts):
                    for t, v in zip(target.elts, value.elts):
                        if isinstance(t, ast.Name):
                            self.assigned.setdefault(t.id, []).append((node.lineno, v))
            elif isinstance(node, ast.Call):
                self.calls.append(node)

    def resolve(self, node: ast.AST, line: int) -> tuple[int | None, ast.AST]:
        """A name's value at its last assignment before ``line`` (once), with that line."""
        if isinstance(node, ast.Name) and node.id in self.assigned:
            before = [(ln, v) for ln, v in self.assigned[node.id] if ln <= line]
            if before:
                return before[-1]
        return None, node


def _strip(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in _KEEP:
        node = node.func.value
    return node


def _indexed(node: ast.AST) -> tuple[str, str] | None:
    """``(what, index)`` of ``S[a]`` or ``f(X[a])`` (``f`` and ``X`` as ``what``)."""
    node = _strip(node)
    if isinstance(node, ast.Subscript):
        return _text(node.value), _text(node.slice)
    if isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(_strip(node.args[0]), ast.Subscript):
        inner = _strip(node.args[0])
        return f"{_text(node.func)}({_text(inner.value)})", _text(inner.slice)
    return None


def _difference(scope: _Scope, node: ast.AST, line: int) -> tuple[str, str, str] | None:
    """``(scores, minuend index, subtrahend index)`` of a score difference ``S[a] - S[b]``
    (through ``sigmoid`` and one assignment per name)."""
    _, node = scope.resolve(_strip(node), line)
    node = _strip(node)
    if isinstance(node, ast.Call) and _callee(node.func) in _SQUASH:
        inner = node.args[0] if node.args else (node.func.value if isinstance(node.func, ast.Attribute) else None)
        if inner is None:
            return None
        return _difference(scope, inner, line)
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Sub):
        return None
    sides = [_indexed(scope.resolve(_strip(side), line)[1]) for side in (node.left, node.right)]
    if None in sides or sides[0][0] != sides[1][0] or sides[0][1] == sides[1][1]:
        return None
    return sides[0][0], sides[0][1], sides[1][1]


def _higher(node: ast.AST) -> tuple[str, set[str]] | None:
    """``(the index the target says ranks higher, both indices)`` of a 0/1 pair target
    ``Y[a] > Y[b]`` (``<``, ``>=``, ``<=``; ``Y[a] - Y[b] > 0``)."""
    node = _strip(node)
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return None
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(op, (ast.Gt, ast.GtE)):
        greater_left = True
    elif isinstance(op, (ast.Lt, ast.LtE)):
        greater_left = False
    else:
        return None
    if isinstance(right, ast.Constant) and right.value == 0 and isinstance(left, ast.BinOp) \
            and isinstance(left.op, ast.Sub):
        left, right = left.left, left.right  # Y[a] - Y[b] > 0: Y[a] > Y[b]
    a, b = _indexed(left), _indexed(right)
    if a is None or b is None or a[0] != b[0] or a[1] == b[1]:
        return None
    return (a[1] if greater_left else b[1]), {a[1], b[1]}


def reversed_pair_targets(tree: ast.AST) -> list[dict]:
    """Each binary cross-entropy (functional, or a ``BCEWithLogitsLoss``/``BCELoss`` module the
    file builds) whose input is a score difference ``s[i] - s[j]`` (its sigmoid for BCE) and
    whose target is a comparison of the same two indices' labels that calls ``j`` the higher:
    ``P(i ranks above j)`` trained toward ``y[j] > y[i]``."""
    modules: set[str] = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _callee(node.value.func) in _LOSS_MODULES:
            modules.update(n for t in node.targets
                           if (n := _callee(t) if isinstance(t, (ast.Name, ast.Attribute)) else None))
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found, seen = [], set()
    for scope_node in scopes:
        scope = _Scope(scope_node)
        for call in scope.calls:
            name = _callee(call.func)
            if name not in _LOSS_FUNCTIONS and name not in modules:
                continue
            given = call.args[0] if call.args else _keyword(call, "input")
            target = call.args[1] if len(call.args) > 1 else _keyword(call, "target")
            if given is None or target is None or call.lineno in seen:
                continue
            diff = _difference(scope, given, call.lineno)
            if diff is None:
                continue
            at, built = scope.resolve(_strip(target), call.lineno)
            higher = _higher(built)
            if higher is None or higher[1] != {diff[1], diff[2]} or higher[0] != diff[2]:
                continue
            seen.add(call.lineno)
            compare = _strip(built)
            fixed = ast.Compare(left=compare.comparators[0], ops=compare.ops,
                                comparators=[compare.left])  # the sides swapped, the op kept
            found.append({"line": at if at is not None else call.lineno, "loss_line": call.lineno,
                          "loss": name, "scores": diff[0], "first": diff[1], "second": diff[2],
                          "target": _text(compare), "fixed": _text(fixed)})
    return sorted(found, key=lambda h: h["line"])


class PairTargetReversed(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a pairwise ranking loss
    (RankNet): a binary cross-entropy (`F.binary_cross_entropy_with_logits`,
    `F.binary_cross_entropy`, or a `BCEWithLogitsLoss`/`BCELoss` the script builds) whose input
    is a score difference `s[i] - s[j]` (its `sigmoid` for the probability form; the scores of
    two indices of one tensor, or one model's outputs for two indexed inputs), and whose target
    compares the same two indices' labels the other way round: `(y[j] > y[i])`, `(y[i] <
    y[j])`. It follows one assignment per name (`p_ij = torch.sigmoid(s_i - s_j)`, `s_i, s_j =
    s[i], s[j]`) and points at the comparison.

    ## Why is this bad?
    `sigmoid(s[i] - s[j])` is the model's probability that `i` ranks above `j`; its target must
    be 1 when `i` is the more relevant (`y[i] > y[j]`). With the comparison reversed every pair
    is trained toward the opposite order: the loss falls as the model learns to rank the least
    relevant items first, and the ranking metrics get worse as training goes on.

    ## Example
    ```python
    loss = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[j] > y[i]).float())
    ```

    ## Use instead
    ```python
    loss = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[i] > y[j]).float())
    ```

    ## Stays silent on
    A target that calls the minuend's index the higher (`(y[i] > y[j])`, `(y[j] < y[i])`); a
    difference and a comparison over other indices; targets built elsewhere (a pairs table read
    from disk); `margin_ranking_loss` (a positive's score given second is
    `sampled-negatives-pushed-up`'s).
    """

    code = "GD377"
    slug = "pair-target-reversed"
    severity = Severity.WARNING
    summary = ("a pairwise ranking loss (RankNet) trains sigmoid(s[i] - s[j]) toward y[j] > y[i]: "
               "the pair target is reversed and the model learns the opposite order")
    fix = ("compare the labels in the order of the score difference: target (y[i] > y[j]) for "
           "input s[i] - s[j]")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in reversed_pair_targets(tree):
                s, i, j = hit["scores"], hit["first"], hit["second"]
                yield self.finding(
                    f"the {hit['loss']} at line {hit['loss_line']} is given the score difference "
                    f"{s}[{i}] - {s}[{j}] (the model's odds that `{i}` ranks above `{j}`) with the "
                    f"target `{hit['target']}`, which is 1 when `{j}` is the more relevant: every "
                    f"pair is trained toward the opposite order, so the model learns to rank the "
                    f"less relevant items first while its loss goes down",
                    Location(path, hit["line"]),
                    evidence={"loss_line": hit["loss_line"], "first": i, "second": j,
                              "target": hit["target"]},
                    fix=(f"swap the comparison so that it calls `{i}` (the minuend's index) the "
                         f"higher: `{hit['fixed']}`"))
