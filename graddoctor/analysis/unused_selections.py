"""The script's per-sample selections that nothing applies, read from its source: small-loss
indices (co-teaching's ``argsort(loss)[:k]``), confidence or loss-threshold masks, computed
inside the training loop from per-sample losses or probabilities and never read again."""

from __future__ import annotations

import ast

from .source import _parse, walk

# calls that pick samples: indices or orders
_PICKING = frozenset({"argsort", "topk", "sort", "nonzero", "argwhere", "kthvalue", "multinomial"})
# comparisons that keep the samples on one side of a threshold
_THRESHOLDS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_THRESHOLD_CALLS = frozenset({"lt", "le", "gt", "ge", "less", "greater", "less_equal",
                              "greater_equal"})
# an outermost call that makes a number for logging, not a selection
_SUMMARIES = frozenset({"mean", "sum", "item", "count_nonzero", "any", "all", "tolist", "numel"})
_PROBABILITY_CALLS = frozenset({"softmax", "sigmoid", "log_softmax"})
_REDUCTIONS = frozenset({"mean", "sum"})
_SKIP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _body_nodes(loop: ast.AST):
    """The nodes of a loop's body, nested function and class bodies left out."""
    stack = list(loop.body) + list(getattr(loop, "orelse", []))
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _SKIP):
                stack.append(child)


def _unreduced_loss_names(tree: ast.AST) -> set[str]:
    """Names assigned a per-sample loss: a call given ``reduction="none"``, or a criterion built
    with it (``crit = nn.CrossEntropyLoss(reduction="none")``; ``l = crit(out, y)``)."""
    def unreduced(call: ast.AST) -> bool:
        return isinstance(call, ast.Call) and any(
            k.arg == "reduction" and isinstance(k.value, ast.Constant) and k.value.value == "none"
            for k in call.keywords)

    criteria = {t.id for n in walk(tree) if isinstance(n, ast.Assign) and unreduced(n.value)
                and isinstance(n.value.func, ast.Attribute) and n.value.func.attr[:1].isupper()
                for t in n.targets if isinstance(t, ast.Name)}
    names: set[str] = set()
    for n in walk(tree):
        if not isinstance(n, ast.Assign):
            continue
        if any(unreduced(c) or (isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                and c.func.id in criteria) for c in walk(n.value)):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    return names


def _probability_names(tree: ast.AST) -> set[str]:
    """Names assigned a softmax or sigmoid, and the names unpacked from their ``max``
    (``conf, pseudo = probs.max(1)``)."""
    names = {t.id for n in walk(tree) if isinstance(n, ast.Assign)
             and any(_called(c) in _PROBABILITY_CALLS for c in walk(n.value))
             for t in n.targets if isinstance(t, ast.Name)}
    for n in walk(tree):
        if isinstance(n, ast.Assign) and any(isinstance(m, ast.Name) and m.id in names
                                             for m in walk(n.value)) \
                and any(_called(c) in ("max", "amax") for c in walk(n.value)):
            for t in n.targets:
                for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(e, ast.Name):
                        names.add(e.id)
    return names


def _selects(value: ast.AST) -> bool:
    """Whether an assigned value picks samples: an index or order call, or a comparison with a
    threshold, not summarised into a number."""
    if _called(value) in _SUMMARIES:
        return False
    for node in walk(value):
        if _called(node) in _PICKING or _called(node) in _THRESHOLD_CALLS:
            return True
        if isinstance(node, ast.Compare) and all(isinstance(op, _THRESHOLDS) for op in node.ops):
            return True
    return False


def unused_selections(path: str) -> list[dict]:
    """Per selection that nothing reads: ``{"line", "text", "name", "source", "picks" (indices,
    not a mask), "use_line", "use_text", "use_loss"}``, ``use_*`` the one statement of the loop that reduces a per-sample loss whole
    (``l1.mean()``) where the selection was meant to apply, when there is exactly one such
    statement, else None. Only selections made in a loop that calls ``.backward()``."""
    tree = _parse(path)
    if tree is None:
        return []
    losses = _unreduced_loss_names(tree)
    sources = losses | _probability_names(tree)
    if not sources:
        return []
    loaded = {n.id for n in walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    found, seen = [], set()
    for loop in walk(tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        body = list(_body_nodes(loop))
        if not any(_called(n) == "backward" for n in body):
            continue
        reduced = {}
        for s in body:
            if not isinstance(s, (ast.Assign, ast.AugAssign)):
                continue
            for n in walk(s.value):
                if _called(n) in _REDUCTIONS and isinstance(n.func, ast.Attribute) \
                        and isinstance(n.func.value, ast.Name) and n.func.value.id in losses:
                    reduced[s.lineno] = (ast.unparse(s), n.func.value.id)
        for s in body:
            if not isinstance(s, ast.Assign) or len(s.targets) != 1 or s.lineno in seen:
                continue
            target = s.targets[0]
            names = [e for e in (target.elts if isinstance(target, ast.Tuple) else [target])
                     if isinstance(e, ast.Name) and e.id != "_"]
            if not names or not isinstance(target, (ast.Name, ast.Tuple)):
                continue
            read = [m.id for m in walk(s.value) if isinstance(m, ast.Name) and m.id in sources]
            if not read or not _selects(s.value):
                continue
            dead = [e.id for e in names if e.id not in loaded]
            if len(dead) != len(names):
                continue
            seen.add(s.lineno)
            use = next(iter(reduced.items())) if len(reduced) == 1 else None
            picks = any(_called(n) in _PICKING for n in walk(s.value))
            found.append({"line": s.lineno, "text": ast.unparse(s), "name": dead[0],
                          "source": read[0], "picks": picks,
                          "use_line": use[0] if use else None,
                          "use_text": use[1][0] if use else None,
                          "use_loss": use[1][1] if use else None})
    return sorted(found, key=lambda f: f["line"])
