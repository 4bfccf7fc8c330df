from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_DRAWS = ("bernoulli", "bernoulli_", "rand", "rand_like", "binomial")


def _random_mask(node: ast.AST) -> bool:
    """A binary random draw: ``torch.bernoulli(...)`` (or ``bernoulli_``), or a uniform draw
    compared with a probability (``torch.rand(h) < keep``), maybe scaled (``/ (1 - p)``) or
    cast (``.float()``)."""
    for sub in walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("bernoulli", "bernoulli_", "binomial"):
                return True
        if isinstance(sub, ast.Compare) and len(sub.ops) == 1 \
                and isinstance(sub.ops[0], (ast.Lt, ast.Gt, ast.LtE, ast.GtE)):
            for side in (sub.left, *sub.comparators):
                if isinstance(side, ast.Call):
                    func = side.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name in ("rand", "rand_like"):
                        return True
    return False


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "self":
        return node.attr
    return None


def _masks_made_at_construction(init: ast.FunctionDef) -> dict[str, int]:
    """``{attribute: line}`` of the binary random masks ``__init__`` keeps on ``self``."""
    found = {}
    for node in walk(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and (name := _self_attr(node.targets[0])) and _random_mask(node.value):
            found[name] = node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "register_buffer" and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and _random_mask(node.args[1]):
            found[node.args[0].value] = node.lineno
    return found


def _weight_like(node: ast.AST) -> bool:
    """A parameter's value (``self.weight``, ``self.fc.weight``): a mask there prunes, on
    purpose, the same connections at every step."""
    text = ast.unparse(node)
    return text.endswith((".weight", ".bias")) or text in ("weight", "bias")


def _training_guarded(method: ast.FunctionDef) -> list[ast.AST]:
    """The statements of ``method`` that run only in training (``if self.training:``)."""
    inside = []
    for node in walk(method):
        if isinstance(node, ast.If) and "self.training" in ast.unparse(node.test) \
                and "not self.training" not in ast.unparse(node.test):
            inside.extend(node.body)
        elif isinstance(node, ast.IfExp) and "self.training" in ast.unparse(node.test) \
                and "not self.training" not in ast.unparse(node.test):
            inside.append(node.body)
    return inside


def _applied(method: ast.FunctionDef, name: str) -> list[ast.AST]:
    """The products of an activation with ``self.<name>`` in ``method`` (``h * self.mask``,
    ``h.mul(self.mask)``, ``torch.mul(h, self.mask)``), a parameter's value excluded."""
    uses = []
    for node in walk(method):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for mine, other in ((node.left, node.right), (node.right, node.left)):
                if _self_attr(mine) == name and not _weight_like(other):
                    uses.append(node)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) \
                and _self_attr(node.value) == name and not _weight_like(node.target):
            uses.append(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("mul", "mul_") and node.args \
                and _self_attr(node.args[0]) == name and not _weight_like(node.func.value):
            uses.append(node)
    return uses


def _redrawn(tree: ast.AST, init: ast.FunctionDef, name: str) -> bool:
    """Whether anything but ``__init__`` sets ``<obj>.<name>`` again, or draws into it in place
    (``self.mask.bernoulli_(keep)``)."""
    inside_init = {id(n) for n in walk(init)}
    for node in walk(tree):
        if id(node) in inside_init:
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == name for t in targets):
                return True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.endswith("_") and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == name and node.func.attr != "mul_":
            return True
    return False


def masks_drawn_once(tree: ast.AST) -> list[dict]:
    """Each module whose ``__init__`` draws a binary random mask onto ``self`` that its other
    methods multiply an activation by in training only (``if self.training:``): a dropout
    mask drawn once, the same units dropped at every step."""
    found = []
    for cls in walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        init = methods.get("__init__")
        if init is None:
            continue
        for name, line in _masks_made_at_construction(init).items():
            if _redrawn(tree, init, name):
                continue  # a resample() called per step, the loop's own draw
            for method in methods.values():
                if method is init:
                    continue
                guarded = {id(n) for stmt in _training_guarded(method) for n in walk(stmt)}
                uses = [u for u in _applied(method, name) if id(u) in guarded]
                if uses:
                    found.append({"cls": cls.name, "mask": name, "drawn": line,
                                  "applied": uses[0].lineno, "method": method.name})
                    break
    return found


def _inverted_scale(node: ast.AST) -> bool:
    """A random mask scaled as inverted dropout scales it (``bernoulli(...) * 2``, ``(rand(h) >
    p).float() / (1 - p)``): the draw is a product or quotient of the mask by something other
    than a 0/1 value."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)) and (
        _random_mask(node.left) or _random_mask(node.right)) and not (
        isinstance(node.op, ast.Mult) and _random_mask(node.left) and _random_mask(node.right))


def _loop_masks(body: list) -> list[dict]:
    """A dropout mask drawn once before a loop of the same scope (``drop = torch.bernoulli(
    torch.full((1, h), 0.5)) * 2`` at the top of a script or a train function) that the loop
    multiplies an activation by and never draws again."""
    found = []
    drawn: dict = {}  # name -> line of a scaled random mask drawn at this level
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if _inverted_scale(stmt.value):
                drawn[name] = stmt.lineno
            else:
                drawn.pop(name, None)
        if not isinstance(stmt, (ast.For, ast.While)):
            continue
        for name, line in list(drawn.items()):
            assigned = any(isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == name
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
                for n in walk(stmt))
            if assigned:
                continue
            uses = [n for n in walk(stmt) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                    and any(isinstance(side, ast.Name) and side.id == name and not _weight_like(other)
                            for side, other in ((n.left, n.right), (n.right, n.left)))]
            if uses:
                found.append({"cls": None, "mask": name, "drawn": line,
                              "applied": uses[0].lineno, "method": None})
                del drawn[name]
    return found


def _assigns(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
        isinstance(t, ast.Name) and t.id == name
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])) for n in walk(node))


def _global_masks(module: ast.Module) -> list[dict]:
    """A dropout mask drawn once at the top of a script, outside any loop, that a function
    multiplies an activation by (``h = h * mask`` in the ``forward`` the loop calls), and that
    nothing assigns again."""
    found = []
    drawn = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) and _inverted_scale(stmt.value):
            drawn[stmt.targets[0].id] = stmt.lineno
    for name, line in drawn.items():
        if sum(_assigns(stmt, name) for stmt in module.body) > 1:
            continue  # drawn again at the top level (in the loop)
        for func in walk(module):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or _assigns(func, name):
                continue
            uses = [n for n in walk(func) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                    and any(isinstance(side, ast.Name) and side.id == name and not _weight_like(other)
                            for side, other in ((n.left, n.right), (n.right, n.left)))]
            if uses:
                found.append({"cls": None, "mask": name, "drawn": line,
                              "applied": uses[0].lineno, "method": func.name})
                break
    return found


def loop_masks_drawn_once(tree: ast.AST) -> list[dict]:
    """``_loop_masks`` of the module's body and of each function's, and ``_global_masks``."""
    found = _loop_masks(tree.body) if isinstance(tree, ast.Module) else []
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.extend(_loop_masks(node.body))
    if isinstance(tree, ast.Module):
        seen = {hit["drawn"] for hit in found}
        found.extend(hit for hit in _global_masks(tree) if hit["drawn"] not in seen)
    return found


class DropoutMaskDrawnOnce(Rule):
    """
    ## What it does
    Finds a module that draws a binary random mask once, in its `__init__`
    (`self.mask = torch.bernoulli(...)`, `register_buffer("mask", torch.rand(h) < keep)`), and
    multiplies an activation by it in training only (`if self.training: h = h * self.mask`),
    with nothing that draws it again; and the same in a script or a training function: a mask
    scaled as inverted dropout scales it (`torch.bernoulli(torch.full((1, h), 0.5)) * 2`,
    `(torch.rand(h) > p).float() / (1 - p)`) drawn before the loop that multiplies an
    activation by it at every step, or drawn at the top of a script and multiplied in by a
    function the loop calls (`h = h * mask` in a hand-written `forward`). It reads the source
    of the files a backward ran from.

    ## Why is this bad?
    Dropout works because each step drops other units: no unit can rely on another being
    there. A mask drawn once drops the same units at every step: the network trains as a fixed
    smaller one, the dropped units never learn, and at evaluation (no mask) they switch on
    untrained, with the surviving activations rescaled by 1 / (1 - p) in training only.

    ## Example
    ```python
    def __init__(self):
        ...
        self.register_buffer("mask", torch.bernoulli(torch.full((h,), 1 - p)) / (1 - p))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.training:
            h = h * self.mask
        return self.fc2(h)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = F.dropout(h, self.p, self.training)  # a new mask at every call
        return self.fc2(h)
    ```

    ## Stays silent on
    A mask drawn in `forward` (or redrawn by a method the loop calls); a mask that multiplies
    a weight (a pruning mask keeps the same connections on purpose); a mask applied in
    evaluation too (a fixed sub-network by design, Masksembles); random projections and random
    features (`x @ self.B`); a 0/1 mask drawn once before the loop and not scaled (an
    inpainting mask of Deep Image Prior, a fixed set of observed entries: data, not dropout).
    """

    code = "GD325"
    slug = "dropout-mask-drawn-once"
    severity = Severity.WARNING
    summary = ("a dropout mask is drawn once in __init__ and applied at every training step: "
               "the same units are dropped every time")
    fix = "draw the mask in forward at every call (`F.dropout(h, p, self.training)`)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for found in loop_masks_drawn_once(tree):
                mask = found["mask"]
                where = (f"{found['method']} multiplies an activation by it at every call"
                         if found["method"] else "the loop multiplies an activation by it at every step")
                yield self.finding(
                    f"`{mask}`, a dropout mask scaled by the kept share, is drawn once before the "
                    f"training loop, and {where} (line {found['applied']}): the same units are "
                    f"dropped every time, so they never train and the rest learn to do without "
                    f"them",
                    Location(path, found["drawn"]),
                    evidence={"mask": mask, "applied_at": found["applied"]},
                    fix=f"draw `{mask}` inside the loop at every step, or use "
                        f"`F.dropout(h, p, training=True)` where it is applied")
            for found in masks_drawn_once(tree):
                cls, mask = found["cls"], found["mask"]
                yield self.finding(
                    f"{cls} draws its mask `self.{mask}` once, when it is built, and "
                    f"{found['method']} multiplies by it at every training step (line "
                    f"{found['applied']}): the same units are dropped at every step, so they "
                    f"never train and the rest learn to do without them; at evaluation the "
                    f"untrained units switch on",
                    Location(path, found["drawn"]),
                    evidence={"module": cls, "mask": mask, "applied_at": found["applied"]},
                    fix=f"draw the mask in {found['method']} at every call: "
                        f"`F.dropout(h, p, self.training)` in place of `h * self.{mask}`")
