from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

_NOISE = ("randn_like", "randn")
# calls that compare a prediction with a target
_LOSS_WORDS = ("loss", "mse", "criterion", "l1", "huber")
# operations around a difference that make it an error to minimise
_ERRORS = ("pow", "square", "abs", "norm")


def _text(node: ast.AST) -> str:
    return ast.unparse(node).replace(" ", "")


def _callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _terms(node: ast.AST, sign: int = 1) -> list[tuple[int, ast.AST]]:
    """The additive terms of a sum with their signs: ``a - b + c`` -> ``[(1, a), (-1, b), (1, c)]``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        right = -sign if isinstance(node.op, ast.Sub) else sign
        return _terms(node.left, sign) + _terms(node.right, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _terms(node.operand, -sign)
    return [(sign, node)]


def _factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _one_minus(node: ast.AST) -> ast.AST | None:
    """``T`` of ``1 - T``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
            and isinstance(node.left, ast.Constant) and node.left.value in (1, 1.0):
        return node.right
    return None


def interpolation(value: ast.AST) -> tuple[str, str, str] | None:
    """``(start, end, time)`` of a straight path between two tensors: ``(1 - t) * a + t * b``
    (its terms and factors in any order), ``a + t * (b - a)``, ``torch.lerp(a, b, t)`` (and
    ``torch.lerp(b, a, 1 - t)``, the same path): the path is at ``a`` at time 0 and at ``b`` at
    time 1, so its velocity is ``b - a``."""
    if _callee(value) == "lerp" and isinstance(value, ast.Call):
        args = list(value.args) if isinstance(value.func, ast.Attribute) and isinstance(
            value.func.value, ast.Name) and value.func.value.id == "torch" else \
            ([value.func.value] + list(value.args) if isinstance(value.func, ast.Attribute) else [])
        if len(args) == 3:
            time = _one_minus(args[2])
            if time is not None:  # lerp(a, b, 1 - t): at b when t is 0, at a when t is 1
                return _text(args[1]), _text(args[0]), _text(time)
            return _text(args[0]), _text(args[1]), _text(args[2])
        return None
    terms = _terms(value)
    if len(terms) != 2 or any(sign < 0 for sign, _ in terms):
        return None
    (_, first), (_, second) = terms
    for left, right in ((first, second), (second, first)):
        lf, rf = _factors(left), _factors(right)
        if len(lf) != 2 or len(rf) != 2:
            continue
        for i, factor in enumerate(lf):
            time = _one_minus(factor)
            if time is None:
                continue
            start = lf[1 - i]
            for j, other in enumerate(rf):
                if _text(other) == _text(time):
                    return _text(start), _text(rf[1 - j]), _text(time)
    # a + t * (b - a)
    for left, right in ((first, second), (second, first)):
        rf = _factors(right)
        if len(rf) != 2:
            continue
        for j, factor in enumerate(rf):
            if isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Sub) \
                    and _text(factor.right) == _text(left):
                return _text(left), _text(factor.left), _text(rf[1 - j])
    return None


def _parents(scope: ast.AST) -> dict[int, ast.AST]:
    parents = {}
    for node in [scope, *scope_walk(scope)]:
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return parents


def _compared(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` is a target a loss compares a prediction with: an argument of a call
    named for a loss (``F.mse_loss(v, target)``, ``criterion(...)``), or a side of a difference
    that is squared or taken the absolute value of."""
    child, parent = node, parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.stmt):
        name = _callee(parent)
        if name and any(word in name.lower() for word in _LOSS_WORDS):
            return True
        if name in _ERRORS and isinstance(child, ast.BinOp) and isinstance(child.op, ast.Sub):
            return True
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Pow) \
                and isinstance(child, ast.BinOp) and isinstance(child.op, ast.Sub):
            return True
        child, parent = parent, parents.get(id(parent))
    return False


def _read_as_target(scope: ast.AST, name: str, after: int, parents) -> ast.AST | None:
    """The first read of ``name`` after line ``after`` that a loss compares with."""
    for node in sorted((n for n in scope_walk(scope) if isinstance(n, ast.Name) and n.id == name
                        and isinstance(n.ctx, ast.Load) and n.lineno > after), key=lambda n: n.lineno):
        if _compared(node, parents):
            return node
    return None


def _integrates_backwards(tree: ast.AST) -> bool:
    """Whether the file steps a state against a network's output (``x = x - dt * model(x, t)``,
    ``x -= ...``): a sampler that integrates the negated velocity, which a reversed target fits."""
    for node in walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) \
                and any(isinstance(n, ast.Call) for n in walk(node.value)):
            return True
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Sub) \
                and _text(node.value.left) == _text(node.targets[0]) \
                and any(isinstance(n, ast.Call) for n in walk(node.value.right)):
            return True
    return False


def _scopes(tree: ast.AST):
    return [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def reversed_velocities(tree: ast.AST) -> list[dict]:
    """Flow-matching targets that are the negated velocity of the path the script builds:
    ``x_t = (1 - t) * x0 + t * x1`` with ``x0 - x1`` as the target of a loss."""
    if _integrates_backwards(tree):
        return []
    found = []
    for scope in _scopes(tree):
        parents = _parents(scope)
        paths = []
        for node in scope_walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                made = interpolation(node.value)
                if made is not None:
                    paths.append((node, made))
        forward = {(start, end) for _, (start, end, _) in paths}
        for assign, (start, end, time) in paths:
            if (end, start) in forward:
                continue  # both directions built: a target of either fits one of them
            for node in scope_walk(scope):
                if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
                        and node.lineno >= assign.lineno and _text(node.left) == start
                        and _text(node.right) == end):
                    continue
                parent = parents.get(id(node))
                target = None
                if isinstance(parent, ast.Assign) and len(parent.targets) == 1 \
                        and isinstance(parent.targets[0], ast.Name):
                    if _read_as_target(scope, parent.targets[0].id, parent.lineno, parents) is not None:
                        target = parent
                elif _compared(node, parents):
                    target = node
                if target is not None:
                    found.append({"line": node.lineno, "path_line": assign.lineno,
                                  "target": ast.unparse(node), "path": ast.unparse(assign),
                                  "velocity": f"{ast.unparse(node.right)} - {ast.unparse(node.left)}",
                                  "time": time})
    by_line = {}
    for site in found:
        by_line.setdefault(site["line"], site)  # one target read against two paths: once
    return [by_line[line] for line in sorted(by_line)]


def _noise_names(scope: ast.AST) -> set[str]:
    return {node.targets[0].id for node in scope_walk(scope)
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and _callee(node.value) in _NOISE}


def _divided(node: ast.AST, names: set[str]) -> tuple[str, ast.AST] | None:
    """``(noise, scale)`` of ``noise / scale`` (``-noise / sigma``, ``noise / sigma ** 2``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left = node.left.operand if isinstance(node.left, ast.UnaryOp) else node.left
        if isinstance(left, ast.Name) and left.id in names:
            return left.id, node.right
    return None


def unscaled_noise(tree: ast.AST) -> list[dict]:
    """Score-matching corruptions that add their noise unscaled (``x + noise``) while the
    target divides the same noise by a noise level (``-noise / sigma``): the target is the
    score of a perturbation of that level, the data was perturbed at level 1."""
    found = []
    for scope in _scopes(tree):
        names = _noise_names(scope)
        if not names:
            continue
        parents = _parents(scope)
        corruptions = {}
        for node in scope_walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                terms = _terms(node.value)
                if len(terms) == 2 and all(sign > 0 for sign, _ in terms):
                    bare = [t for _, t in terms if isinstance(t, ast.Name) and t.id in names]
                    if len(bare) == 1 and not any(isinstance(t, ast.Name) and t.id in names
                                                  for _, t in terms if t is not bare[0]):
                        corruptions[bare[0].id] = node
        for node in scope_walk(scope):
            made = _divided(node, names)
            if made is None or made[0] not in corruptions:
                continue
            noise, scale = made
            corruption = corruptions[noise]
            if node.lineno < corruption.lineno:
                continue
            parent = parents.get(id(node))
            while isinstance(parent, (ast.UnaryOp, ast.BinOp)):
                parent = parents.get(id(parent))
            target = None
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1 \
                    and isinstance(parent.targets[0], ast.Name):
                if _read_as_target(scope, parent.targets[0].id, parent.lineno, parents) is not None:
                    target = parent
            elif _compared(node, parents):
                target = node
            if target is None:
                continue
            scale_text = ast.unparse(scale)
            base = scale.left if isinstance(scale, ast.BinOp) and isinstance(scale.op, ast.Pow) else scale
            found.append({"line": corruption.lineno, "target_line": node.lineno,
                          "corruption": ast.unparse(corruption), "target": ast.unparse(node),
                          "noise": noise, "scale": scale_text, "level": ast.unparse(base),
                          "clean": next(ast.unparse(t) for _, t in _terms(corruption.value)
                                        if not (isinstance(t, ast.Name) and t.id == noise))})
    return found


class TargetMismatchesCorruption(Rule):
    """
    ## What it does
    Reads the training step of a flow-matching or score-matching model in the script's source
    and checks that the regression target is the one its corruption implies:

    * a straight path between two tensors, `x_t = (1 - t) * x0 + t * x1` (its terms in any
      order, `x0 + t * (x1 - x0)`, `torch.lerp(x0, x1, t)`), whose loss target is `x0 - x1`:
      the negated velocity. The path's velocity is `d x_t / dt = x1 - x0`;
    * a noise `torch.randn_like(x)` added unscaled (`x_noisy = x + noise`) while the target
      divides that noise by a noise level (`-noise / sigma`, `-noise / sigma ** 2`): the score
      of a perturbation at that level, while the data was perturbed at level 1.

    Reported at the line to change: the target for the velocity, the corruption for the noise.
    Read from the script's source once a backward ran.

    ## Why is this bad?
    The network learns exactly the target it is given. A reversed velocity sends a sampler that
    integrates from `x0` to `x1` away from the data (the samples drift off, farther at every
    step); a score target at level `sigma` for data perturbed at level 1 teaches every noise
    level the wrong magnitude, and annealed Langevin sampling lands off the data. The loss falls
    as usual: the target is consistent from step to step, only not the one meant.

    ## Example
    ```python
    t = torch.rand(x1.shape[0], 1)
    x_t = (1 - t) * x0 + t * x1
    loss = F.mse_loss(model(x_t, t), x0 - x1)
    ```

    ## Use instead
    ```python
    loss = F.mse_loss(model(x_t, t), x1 - x0)
    ```

    ## Stays silent on
    The velocity `x1 - x0` of `(1 - t) * x0 + t * x1`, and the reversed time convention written
    consistently (`x_t = t * x0 + (1 - t) * x1` with target `x0 - x1`); a file whose sampler
    steps against the network's output (`x = x - dt * model(x, t)`, `x -= ...`), which a negated
    velocity fits; noise scaled where it is added (`x + sigma * noise`, `sqrt(1 - a) * noise`);
    an epsilon-prediction target (the noise itself, not divided by a level); differences used
    for anything but a loss's target.
    Not seen: corruptions and targets built in another module or through a helper function's
    return value.
    """

    code = "GD383"
    slug = "target-mismatches-corruption"
    severity = Severity.WARNING
    summary = ("a flow- or score-matching target disagrees with the corruption the script applies: "
               "the negated velocity of its interpolation, or a noise level the noise was never "
               "scaled by")
    fix = ("make the target the derivative of the path (`x1 - x0` for `(1 - t) * x0 + t * x1`), "
           "and scale the noise by the level the target divides it by")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for site in reversed_velocities(tree):
                yield self.finding(
                    f"`{site['target']}` is the target of a path built as `{site['path']}`, "
                    f"which is at its second end at `{site['time']}` = 1: its velocity is "
                    f"`{site['velocity']}`, so the network learns the negated velocity, and a "
                    f"sampler integrating it toward the data walks away from the data",
                    Location(path, site["line"]),
                    related=(Related(Location(path, site["path_line"]), "the interpolation"),),
                    evidence={"target": site["target"], "path": site["path"],
                              "velocity": site["velocity"]},
                    fix=f"`{site['velocity']}`: the derivative of the path with respect to "
                        f"`{site['time']}`")
            for site in unscaled_noise(tree):
                fixed = f"{site['clean']} + {site['level']} * {site['noise']}"
                yield self.finding(
                    f"`{site['corruption']}` adds `{site['noise']}` unscaled, but the target "
                    f"`{site['target']}` is the score of a perturbation of level "
                    f"`{site['level']}`: the data is perturbed at level 1 at every step and the "
                    f"network is taught a score of the wrong magnitude at each noise level",
                    Location(path, site["line"]),
                    related=(Related(Location(path, site["target_line"]), "the target"),),
                    evidence={"corruption": site["corruption"], "target": site["target"],
                              "level": site["level"]},
                    fix=f"`{fixed}`: perturb at the level the target assumes")
