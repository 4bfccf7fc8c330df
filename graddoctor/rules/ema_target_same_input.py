from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_UPDATES = ("mul_", "add_", "lerp_", "copy_", "sub_")
# a forward that draws its own noise makes two calls on one input differ: left out
_STOCHASTIC = ("dropout", "Dropout", "randn", "rand(", "rand_like", "normal_", "bernoulli", "DropPath", "drop_path")


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def averaged_copies(tree: ast.AST) -> set[tuple[str, str]]:
    """``(copy, original)`` texts of averaged copies: ``t = AveragedModel(s)``, and the loops
    ``for pt, p in zip(t.parameters(), s.parameters())`` that move ``pt`` in place."""
    pairs = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            func = _text(node.value.func)
            call = node.value
            # copy.deepcopy(net).requires_grad_(False), .eval(), .to(device)
            while isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call):
                call = call.func.value
            func = _text(call.func)
            # a plain deepcopy is a frozen reference (a KL anchor, twin critics) until a loop
            # below moves it towards the network
            if func.rsplit(".", 1)[-1] == "AveragedModel" and call.args:
                pairs.add((_text(node.targets[0]), _text(call.args[0])))
                # its averaged network, called directly (`ema.module(x, t)`)
                pairs.add((f"{_text(node.targets[0])}.module", _text(call.args[0])))
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and _text(node.iter.func) == "zip" \
                and len(node.iter.args) == 2 and isinstance(node.target, ast.Tuple) \
                and len(node.target.elts) == 2:
            owners = []
            for arg in node.iter.args:
                if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) \
                        and arg.func.attr == "parameters":
                    owners.append(_text(arg.func.value))
            if len(owners) != 2:
                continue
            names = [_text(e) for e in node.target.elts]
            moved = set()
            for sub in walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                        and sub.func.attr in _UPDATES:
                    base = sub.func.value
                    while isinstance(base, ast.Attribute) and base.attr == "data":
                        base = base.value
                    moved.add(_text(base))
            for i in (0, 1):
                if names[i] in moved and names[1 - i] not in moved:
                    pairs.add((owners[i], owners[1 - i]))
    return pairs


def _statement_of(scope: ast.AST) -> dict[int, ast.stmt]:
    """Each node's innermost enclosing statement in ``scope`` (by id)."""
    out = {}
    for stmt in scope_walk(scope):
        if isinstance(stmt, ast.stmt):
            for sub in walk(stmt):
                out[id(sub)] = stmt  # inner statements are walked later and overwrite
    return out


def _bound_name(stmt: ast.stmt, call: ast.Call) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _reads(stmt: ast.AST) -> set[str]:
    return {n.id for n in walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _assigned_between(scope: ast.AST, names: set[str], lo: int, hi: int) -> bool:
    for node in scope_walk(scope):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For)) and lo < node.lineno < hi:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if {n.id for n in walk(t) if isinstance(n, ast.Name)} & names:
                    return True
    return False


def _no_grad_lines(scope: ast.AST) -> list[tuple[int, int]]:
    """The line spans of the scope's ``with torch.no_grad()`` / ``inference_mode()`` blocks."""
    return [(n.lineno, n.end_lineno or n.lineno) for n in scope_walk(scope)
            if isinstance(n, ast.With) and any(
                w in _text(item.context_expr) for item in n.items for w in ("no_grad", "inference_mode"))]


def _trains(stmt: ast.stmt, quiet: list[tuple[int, int]]) -> bool:
    """A statement that can be a loss: outside every no_grad block, and not read out as a
    number (``.item()``: a logged gap between the network and its average)."""
    if any(lo <= stmt.lineno <= hi for lo, hi in quiet):
        return False
    return not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr in ("item", "tolist") for n in walk(stmt))


def same_input_pairs(tree: ast.AST, text: str) -> list[tuple[int, int, str, str, str]]:
    """``(online line, copy line, online call, copy call, copy)`` of two calls in one scope that
    give a network and its averaged copy the same arguments, two or more besides the network
    (``s(x, t)`` and ``t(x, t)``, or one helper ``f(s, x, t)`` and ``f(t, x, t)``), arguments
    free of calls and not rebound between, whose results meet in one statement."""
    if any(w in text for w in ("Dropout", "DropPath")):
        return []
    # a network's forward or the helper that calls it drawing noise makes two calls differ
    drawing = {n.name for n in walk(tree) if isinstance(n, ast.FunctionDef)
               and any(w in _text(n) for w in _STOCHASTIC)}
    if any(isinstance(n, ast.FunctionDef) and n.name == "forward" and n.name in drawing for n in walk(tree)):
        return []
    pairs = averaged_copies(tree)
    if not pairs:
        return []
    found = []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        calls = [n for n in scope_walk(scope) if isinstance(n, ast.Call) and n.args]
        if len(calls) < 2:
            continue
        stmt_of = None
        for copy, original in pairs:
            for online in calls:
                for other in calls:
                    if other is online or other.lineno < online.lineno - 30 or other.lineno > online.lineno + 30:
                        continue
                    args_o = [_text(x) for x in online.args] + [f"{k.arg}={_text(k.value)}" for k in online.keywords]
                    args_c = [_text(x) for x in other.args] + [f"{k.arg}={_text(k.value)}" for k in other.keywords]
                    fo, fc = _text(online.func), _text(other.func)
                    rest = None
                    if fo == original and fc == copy and args_o == args_c:
                        rest = online.args + [k.value for k in online.keywords]
                    elif fo == fc and len(args_o) == len(args_c):
                        diff = [i for i, (x, y) in enumerate(zip(args_o, args_c)) if x != y]
                        if len(diff) == 1 and args_o[diff[0]] == original and args_c[diff[0]] == copy:
                            rest = [x for i, x in enumerate(online.args) if i != diff[0]] \
                                + [k.value for k in online.keywords]
                    # a network conditioned on a noise level or a time besides its input: the
                    # method defines the copy's target at another point of the trajectory
                    if rest is None or len(rest) < 2 or fo in drawing:
                        continue
                    if any(isinstance(n, ast.Call) for r in rest for n in walk(r)):
                        continue
                    names = {n.id for r in rest for n in walk(r) if isinstance(n, ast.Name)}
                    lo, hi = sorted((online.lineno, other.lineno))
                    if _assigned_between(scope, names, lo, hi):
                        continue
                    if stmt_of is None:
                        stmt_of = _statement_of(scope)
                    s_on, s_co = stmt_of.get(id(online)), stmt_of.get(id(other))
                    if s_on is None or s_co is None:
                        continue
                    quiet = _no_grad_lines(scope)
                    met = s_on is s_co and _trains(s_on, quiet)
                    if s_on is not s_co:
                        n_on, n_co = _bound_name(s_on, online), _bound_name(s_co, other)
                        if n_on and n_co:
                            met = any(isinstance(st, ast.stmt) and st.lineno > hi
                                      and {n_on, n_co} <= _reads(st)
                                      and not isinstance(st, (ast.For, ast.While, ast.If, ast.With))
                                      and _trains(st, quiet)
                                      for st in scope_walk(scope))
                    if met:
                        found.append((online.lineno, other.lineno, _text(online), _text(other), copy))
    return sorted(set(found))


class EmaTargetSameInput(Rule):
    """
    ## What it does
    Finds a loss that compares a network conditioned on a noise level or a time with its
    averaged copy (the EMA target of a consistency model, of a consistency distillation)
    evaluated on the very same arguments. It reads the source of the files a backward ran
    from: a copy made by `AveragedModel(model)` (called as itself or as its `.module`) or moved in place towards the network by a loop
    over `zip(copy.parameters(), model.parameters())`; two calls in one scope, `model(x, t)` and
    `copy(x, t)` or one helper `f(model, x, t)` and `f(copy, x, t)`, whose other arguments (two
    or more) are the same text, call nothing and are not rebound between the two; and the two
    results meeting in one statement (the loss).

    ## Why is this bad?
    Given the same point, the network and its average differ only by how far the weights have
    moved from their average. The loss is then a pull of the weights back towards their own
    past, not a training signal: consistency training needs the online network at the next,
    noisier point of the trajectory (t_{n+1}) and the target at t_n; a mean teacher or a
    momentum encoder needs another augmentation or noise on each side. The loss is small from
    the first step and the model does not learn what the method teaches.

    ## Example
    ```python
    pred = consistency_fn(model, x + t_n * z, t_n)
    with torch.no_grad():
        target = consistency_fn(ema_model, x + t_n * z, t_n)
    loss = ((pred - target) ** 2).mean()
    ```

    ## Use instead
    ```python
    pred = consistency_fn(model, x + t_n1 * z, t_n1)
    with torch.no_grad():
        target = consistency_fn(ema_model, x + t_n * z, t_n)
    ```

    ## Stays silent on
    The two networks given different points, views or noise levels; a teacher that is not an
    averaged copy of the student (distillation from a pretrained model, a frozen `deepcopy` kept
    as a KL reference or an anchor); a copy evaluated on the same input only for logging (the
    results never meet); arguments that draw (`augment(x)`) or are rebound between the calls;
    a network given one argument (a mean teacher on one batch, whose noise may come from inside
    the network, is left out); a file whose networks use dropout or draw noise of their own,
    which makes the two outputs differ on one input.
    """

    code = "GD398"
    slug = "ema-target-same-input"
    severity = Severity.WARNING
    summary = ("a loss compares a network with its averaged copy (EMA target, mean teacher) on the "
               "same arguments: it only measures how far the weights moved")
    fix = ("give the online network and its averaged copy different inputs, as the method says "
           "(the adjacent noise levels of a consistency model, two views or noises for a teacher)")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, copy_line, online, copied, copy in same_input_pairs(tree, a.source.full(path)):
                yield self.finding(
                    f"`{online}` and `{copied}` give the network and its averaged copy "
                    f"`{copy}` the same arguments, and the loss compares the two: it measures only "
                    f"how far the weights have moved from their average, so the model is pulled "
                    f"towards its own past instead of learning the target the method prescribes",
                    Location(path, line),
                    related=(Related(Location(path, copy_line), f"the averaged copy `{copy}` on the same arguments"),),
                    evidence={"copy": copy, "online": online, "target": copied},
                    fix="give the online network the input the method prescribes (the next, noisier "
                        "point t_{n+1} of a consistency model's trajectory, another view or noise)"
                        " and keep the copy's")
