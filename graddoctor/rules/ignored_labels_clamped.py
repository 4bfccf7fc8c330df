from __future__ import annotations

import ast

from ..analysis.source import scope_walk as _own_nodes
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

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


_REGRESSION_FUNCTIONS = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"})
_REGRESSION_MODULES = frozenset({"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"})
# a mask named for the samples without a label
_MISSING_NAME = ("missing", "unlabel", "unknown", "no_label", "nolabel", "unannotated", "absent")


def _base_name(node: ast.AST) -> str | None:
    """The name under subscripts, attributes and shape-only methods (``y[i].long()`` -> ``y``)."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _SHAPE_ONLY:
            node = node.func.value
        elif isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        else:
            break
    return node.id if isinstance(node, ast.Name) and node.id not in ("torch", "np", "numpy") else None


def _negative(node: ast.AST) -> bool:
    """A constant below 0 (``-1``, ``-100``) or 0 itself compared with ``<``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        return node.operand.value > 0
    return False


def _sentinel_mask(mask: ast.AST, labels: ast.AST, masks: dict) -> bool:
    """Whether ``mask`` marks the labels' own missing-label sentinel: a comparison of the labels
    with a negative number (``y == -1``, ``y < 0``, ``y.eq(-100)``, ``y.lt(0)``), a name bound
    to one, or a name that says so (``missing``, ``unlabelled``)."""
    name = _base_name(labels)
    if isinstance(mask, ast.Name):
        if any(word in mask.id.lower() for word in _MISSING_NAME):
            return True
        bound = masks.get(mask.id)
        return bound is not None and _sentinel_mask(bound, labels, {})
    if isinstance(mask, ast.Compare) and len(mask.ops) == 1 and _base_name(mask.left) == name:
        op, right = mask.ops[0], mask.comparators[0]
        if isinstance(op, (ast.Eq, ast.Lt, ast.LtE)) and _negative(right):
            return True
        return isinstance(op, ast.Lt) and _is_zero(right)
    if isinstance(mask, ast.Call) and isinstance(mask.func, ast.Attribute) \
            and _base_name(mask.func.value) == name and len(mask.args) == 1:
        attr, value = mask.func.attr, mask.args[0]
        return (attr in ("eq", "lt", "le") and _negative(value)) or (attr == "lt" and _is_zero(value))
    return False


def _nan_mask(mask: ast.AST, labels: ast.AST, masks: dict) -> bool:
    """``torch.isnan(y)`` / ``y.isnan()`` of the labels, or a name bound to it."""
    name = _base_name(labels)
    if isinstance(mask, ast.Name) and mask.id in masks:
        return _nan_mask(masks[mask.id], labels, {})
    if not isinstance(mask, ast.Call) or not isinstance(mask.func, ast.Attribute) \
            or mask.func.attr != "isnan":
        return False
    owner = mask.func.value
    if isinstance(owner, ast.Name) and owner.id in ("torch", "np", "numpy"):
        return bool(mask.args) and _base_name(mask.args[0]) == name
    return _base_name(owner) == name


def _zero_like(node: ast.AST | None) -> bool:
    """0, or ``torch.zeros_like(...)``."""
    if _is_zero(node):
        return True
    return isinstance(node, ast.Call) and _callee_name(node.func) == "zeros_like"


def _filled_labels(node: ast.AST, masks: dict, nan: bool) -> ast.AST | None:
    """The labels whose missing entries are set to 0: ``y.masked_fill(m, 0)``, ``torch.where(m,
    0, y)`` with ``m`` the labels' negative sentinel (``nan``: ``torch.isnan(y)``), and, with
    ``nan``, ``torch.nan_to_num(y)`` / ``y.nan_to_num(0.0)`` (NaN to 0, the default)."""
    if not isinstance(node, ast.Call):
        return None
    marks = _nan_mask if nan else _sentinel_mask
    name = _callee_name(node.func)
    owner = node.func.value if isinstance(node.func, ast.Attribute) else None
    is_module = isinstance(owner, ast.Name) and owner.id in ("torch", "np", "numpy")
    if name == "masked_fill" and owner is not None and not is_module and len(node.args) == 2:
        labels = owner
        if _base_name(labels) and _is_zero(node.args[1]) and marks(node.args[0], labels, masks):
            return labels
    elif name == "where" and is_module and len(node.args) == 3:
        mask, filled, labels = node.args
        if _base_name(labels) and _zero_like(filled) and marks(mask, labels, masks):
            return labels
    elif nan and name == "nan_to_num":
        labels = node.args[0] if is_module and node.args else owner if not is_module else None
        rest = node.args[1:] if is_module else node.args
        value = _keyword(node, "nan") or (rest[0] if rest else None)
        if labels is not None and _base_name(labels) and (value is None or _is_zero(value)):
            return labels
    return None


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
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def clamped_label_losses(tree: ast.AST) -> list[dict]:
    """Each classification loss (``F.cross_entropy``/``F.nll_loss`` or a ``CrossEntropyLoss``/
    ``NLLLoss`` module the file builds) whose target is its labels clamped from below at 0,
    directly or through one assignment in the same scope, with a reduction that averages or
    sums every row (not ``reduction="none"``, which leaves the masking to the script)."""
    modules: dict[str, bool] = {}  # name or attribute bound to a loss module -> reduces rows
    regression: dict[str, bool] = {}  # the same for a regression loss module
    ignoring: set[str] = set()  # loss modules built with an ignore_index
    for node in walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _callee_name(node.value.func) in _LOSS_MODULES | _REGRESSION_MODULES:
            red = _keyword(node.value, "reduction")
            reduces = not (isinstance(red, ast.Constant) and red.value == "none")
            into = modules if _callee_name(node.value.func) in _LOSS_MODULES else regression
            for target in node.targets:
                name = _callee_name(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if name:
                    into[name] = into.get(name, True) and reduces
                    if _keyword(node.value, "ignore_index") is not None:
                        ignoring.add(name)
    masks: set[str] = set()
    bound: dict[str, ast.AST] = {}  # a name bound once to a mask (a comparison, isnan, a call)
    counts: dict[str, int] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Compare):
            masks.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            counts[node.targets[0].id] = counts.get(node.targets[0].id, 0) + 1
            bound[node.targets[0].id] = node.value
    bound = {k: v for k, v in bound.items() if counts[k] == 1}
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
            nan = name in _REGRESSION_FUNCTIONS or name in regression
            if name in _LOSS_FUNCTIONS or name in _REGRESSION_FUNCTIONS:
                red = _keyword(call, "reduction")
                if isinstance(red, ast.Constant) and red.value == "none":
                    continue
                target = call.args[1] if len(call.args) > 1 else _keyword(call, "target")
                ignores = _keyword(call, "ignore_index") is not None
            elif (name in modules and modules[name]) or (name in regression and regression[name]):
                target = call.args[1] if len(call.args) > 1 else None
                ignores = name in ignoring
            else:
                continue
            if target is None or call.lineno in seen:
                continue
            at, expr = call.lineno, target
            if isinstance(target, ast.Name) and target.id in assigned:
                before = [(ln, v) for ln, v in assigned[target.id] if ln <= call.lineno]
                if before:
                    at, expr = before[-1]
            how = "clamp"
            labels = None if nan else _clamped_labels(expr)
            if labels is None and not (ignores and not nan):
                # a fill of 0 a loss with an ignore_index may be skipping on purpose (the pad
                # id 0 ignored): only without one
                labels = _filled_labels(expr, bound, nan)
                how = "nan" if nan else "fill"
            if labels is None or _masked_subscript(labels, masks):
                continue
            if nan:
                given = call.args[0] if call.args else _keyword(call, "input")
                text = _text(given) if given is not None else ""
                # the prediction zeroed at the same entries: their residual is 0 (a mean
                # over every entry then, but nothing trained toward 0)
                if "isnan" in text or "nan_to_num" in text or any(
                        isinstance(n, ast.Name) and n.id in bound and _nan_mask(n, labels, bound)
                        for n in walk(given) if given is not None):
                    continue
            seen.add(call.lineno)
            found.append({"line": at, "loss_line": call.lineno, "loss": name,
                          "clamp": _text(expr), "labels": _text(labels), "how": how})
    return sorted(found, key=lambda h: h["line"])


class IgnoredLabelsClamped(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a classification loss
    (`F.cross_entropy`, `F.nll_loss`, or a `CrossEntropyLoss`/`NLLLoss` the script builds)
    whose target is the labels clamped from below at 0 (`y.clamp(min=0)`, `y.clamp(0, C - 1)`,
    `torch.clamp(y, min=0)`, `y.clip(0)`) or whose missing labels are set to 0
    (`y.masked_fill(missing, 0)`, `torch.where(y < 0, 0, y)`, the mask a comparison of the labels
    with a negative sentinel or named for missing labels), directly or through one assignment,
    with a reduction over every row (the default mean, or sum). The same in a regression loss
    (`F.mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss` or their modules): NaN targets
    (unmeasured values) set to 0 (`torch.nan_to_num(y)`, `y.masked_fill(torch.isnan(y), 0)`).
    It points at the clamp or the fill.

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
    (y >= 0).sum()`); missing labels filled with -100 (the default ignore_index) or with 0 for
    a loss given an `ignore_index` (a pad id 0 ignored); a fill whose mask is not the labels'
    sentinel (`labels[iou < 0.4] = 0`: background by design); a regression whose prediction is
    zeroed at the same entries; labels picked by a mask first (`y[y >= 0].clamp(min=0)`); a clamp of
    computed values that bins them into classes (`(x * 10).long().clamp(0, 9)`); an upper
    clamp only (`y.clamp(max=C - 1)`); targets of regression losses.
    """

    code = "GD285"
    slug = "ignored-labels-clamped"
    severity = Severity.WARNING
    summary = ("a loss's missing labels are clamped or set to 0: the negative (missing or "
               "ignored) labels become class 0, NaN regression targets become 0, and they are "
               "trained as such")
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
                yield self._finding(path, hit)

    def _finding(self, path, hit):
        labels, how = hit["labels"], hit.get("how", "clamp")
        at = Location(path, hit["line"])
        evidence = {"loss_line": hit["loss_line"], "labels": labels, "clamp": hit["clamp"], "how": how}
        if how == "nan":
            return self.finding(
                f"`{hit['clamp']}` sets the missing (NaN) entries of `{labels}` to 0, and the "
                f"{hit['loss']} at line {hit['loss_line']}, reduced over every entry, trains the "
                f"prediction toward 0 wherever no value was measured: those entries are fake "
                f"targets, pulling the model's outputs toward 0",
                at, evidence=evidence,
                fix=(f"leave the missing entries out of the loss: `mask = ~torch.isnan({labels})`, "
                     f"then `{hit['loss']}(pred[mask], {labels}[mask])` (or reduction=\"none\" "
                     f"and the mean over the mask)"))
        verb = "clamps the labels" if how == "clamp" else "sets the missing labels"
        return self.finding(
            f"`{hit['clamp']}` {verb} of the {hit['loss']} at line "
            f"{hit['loss_line']} to 0: every negative label (a sample this task has no "
            f"label for, -1, or an ignored -100) becomes class 0, and the loss, reduced "
            f"over every row, trains those samples as class 0 — the head learns labels "
            f"nobody gave and over-predicts class 0",
            at, evidence=evidence,
            fix=(f"pass `{labels}` {'unclamped' if how == 'clamp' else 'as it is'} with the "
                 f"loss's `ignore_index` set to the missing-label value (`ignore_index=-1`; "
                 f"or fill the missing entries with -100, the default ignore_index), or compute "
                 f"it with reduction=\"none\" and average over the rows where `{labels} >= 0`"))
