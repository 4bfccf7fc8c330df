from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule

_LOSS_FUNCTIONS = frozenset({"cross_entropy", "nll_loss"})
_LOSS_MODULES = frozenset({"CrossEntropyLoss", "NLLLoss"})
_CLAMPS = frozenset({"clamp", "clip", "clamp_min", "clamp_"})
# methods that keep the labels as they are (their shape or dtype only)
_SHAPE_ONLY = frozenset({"reshape", "view", "flatten", "long", "squeeze", "contiguous", "to",
                         "int", "view_as", "reshape_as"})


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles every parsed node
        return ""


def _callee_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_zero(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 0


def _clamped_labels(node: ast.AST) -> ast.AST | None:
    """The labels a lower clamp at 0 is applied to (``y.clamp(min=0)``, ``y.clamp(0, C - 1)``,
    ``torch.clamp(y, min=0)``, ``y.clamp_min(0)``, ``y.clip(0)``); None for anything else. Only
    labels as they are (a name, an attribute, a subscript of one): a clamp of arithmetic
    (``(x * 10).long().clamp(0, 9)``) bins a value into classes, which is no sentinel."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    attr = node.func.attr
    if attr not in _CLAMPS:
        return None
    owner = node.func.value
    args = list(node.args)
    if isinstance(owner, ast.Name) and owner.id in ("torch", "np", "numpy"):
        if not args:
            return None
        labels, args = args[0], args[1:]
    else:
        labels = owner
    low = _keyword(node, "min")
    if low is None and args:
        low = args[0]
    if not _is_zero(low):
        return None
    base = labels
    while True:
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) \
                and base.func.attr in _SHAPE_ONLY:
            base = base.func.value
        elif isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        else:
            break
    if not isinstance(base, ast.Name) or base.id in ("torch", "np", "numpy"):
        return None
    return labels


def _masked_subscript(labels: ast.AST, masks: set[str]) -> bool:
    """Whether the labels are picked by a mask of their own (``y[y >= 0]``, ``y[keep]`` with
    ``keep = y != -1``): the clamp is then a no-op kept for safety."""
    if not isinstance(labels, ast.Subscript):
        return False
    index = labels.slice
    if isinstance(index, ast.Compare):
        return True
    return isinstance(index, ast.Name) and index.id in masks


def _scopes(tree: ast.AST):
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` outside the functions and classes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def clamped_label_losses(tree: ast.AST) -> list[dict]:
    """Each classification loss (``F.cross_entropy``/``F.nll_loss`` or a ``CrossEntropyLoss``/
    ``NLLLoss`` module the file builds) whose target is its labels clamped from below at 0,
    directly or through one assignment in the same scope, with a reduction that averages or
    sums every row (not ``reduction="none"``, which leaves the masking to the script)."""
    modules: dict[str, bool] = {}  # name or attribute bound to a loss module -> reduces rows
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _callee_name(node.value.func) in _LOSS_MODULES:
            red = _keyword(node.value, "reduction")
            reduces = not (isinstance(red, ast.Constant) and red.value == "none")
            for target in node.targets:
                name = _callee_name(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if name:
                    modules[name] = modules.get(name, True) and reduces
    masks: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Compare):
            masks.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    seen: set[int] = set()
    for scope in _scopes(tree):
        assigned: dict[str, list[tuple[int, ast.AST]]] = {}
        calls = []
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
            elif isinstance(node, ast.Call):
                calls.append(node)
        for call in calls:
            name = _callee_name(call.func)
            if name in _LOSS_FUNCTIONS:
                red = _keyword(call, "reduction")
                if isinstance(red, ast.Constant) and red.value == "none":
                    continue
                target = call.args[1] if len(call.args) > 1 else _keyword(call, "target")
            elif name in modules and modules[name]:
                target = call.args[1] if len(call.args) > 1 else None
            else:
                continue
            if target is None or call.lineno in seen:
                continue
            at, expr = call.lineno, target
            if isinstance(target, ast.Name) and target.id in assigned:
                before = [(ln, v) for ln, v in assigned[target.id] if ln <= call.lineno]
                if before:
                    at, expr = before[-1]
            labels = _clamped_labels(expr)
            if labels is None or _masked_subscript(labels, masks):
                continue
            seen.add(call.lineno)
            found.append({"line": at, "loss_line": call.lineno, "loss": name,
                          "clamp": _text(expr), "labels": _text(labels)})
    return sorted(found, key=lambda h: h["line"])


class IgnoredLabelsClamped(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a classification loss
    (`F.cross_entropy`, `F.nll_loss`, or a `CrossEntropyLoss`/`NLLLoss` the script builds)
    whose target is the labels clamped from below at 0 (`y.clamp(min=0)`, `y.clamp(0, C - 1)`,
    `torch.clamp(y, min=0)`, `y.clip(0)`), directly or through one assignment, with a
    reduction over every row (the default mean, or sum). It points at the clamp.

    ## Why is this bad?
    Negative labels are how datasets mark a sample without a label for this task (`-1` for a
    missing annotation in multi-task data, `-100` for an ignored token or pixel). Clamping them
    to 0 so that the loss stops raising turns each of them into class 0, and the reduced loss
    then trains every unlabelled sample as a confident class-0 example: class 0 is
    over-predicted, the task head learns from labels nobody gave, and the loss looks fine.

    ## Example
    ```python
    loss_cls = F.cross_entropy(logits, y.clamp(min=0))
    ```

    ## Use instead
    ```python
    loss_cls = F.cross_entropy(logits, y, ignore_index=-1)
    ```

    ## Stays silent on
    `reduction="none"` (the script masks the rows itself, as in `(ce * (y >= 0)).sum() /
    (y >= 0).sum()`); labels picked by a mask first (`y[y >= 0].clamp(min=0)`); a clamp of
    computed values that bins them into classes (`(x * 10).long().clamp(0, 9)`); an upper
    clamp only (`y.clamp(max=C - 1)`); targets of regression losses.
    """

    code = "GD285"
    slug = "ignored-labels-clamped"
    severity = Severity.WARNING
    summary = ("a classification loss's labels are clamped at 0: the negative (missing or "
               "ignored) labels become class 0 and are trained as such")
    fix = ("keep the labels as they are and tell the loss to skip the negative ones "
           "(`ignore_index=-1`), or use reduction=\"none\" and average over the labelled rows")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in clamped_label_losses(tree):
                labels = hit["labels"]
                yield self.finding(
                    f"`{hit['clamp']}` clamps the labels of the {hit['loss']} at line "
                    f"{hit['loss_line']} at 0: every negative label (a sample this task has no "
                    f"label for, -1, or an ignored -100) becomes class 0, and the loss, reduced "
                    f"over every row, trains those samples as class 0 — the head learns labels "
                    f"nobody gave and over-predicts class 0",
                    Location(path, hit["line"]),
                    evidence={"loss_line": hit["loss_line"], "labels": labels, "clamp": hit["clamp"]},
                    fix=(f"pass `{labels}` unclamped with the loss's `ignore_index` set to the "
                         f"missing-label value (`ignore_index=-1`), or compute it with "
                         f"reduction=\"none\" and average over the rows where `{labels} >= 0`"))
