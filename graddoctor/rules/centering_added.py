from __future__ import annotations

import ast
import re

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_SOFTMAX = ("softmax", "log_softmax")
_CENTER = re.compile(r"(^|_)(center|centre|centers|centres)($|_)", re.I)


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_center(node: ast.AST) -> bool:
    name = _last_name(node)
    return name is not None and bool(_CENTER.search(name))


def _softmax_input(call: ast.Call) -> ast.AST | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in _SOFTMAX:
        return None
    if call.args:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id in ("F", "torch", "functional", "nn"):
            return call.args[0]
        if isinstance(func, ast.Name):
            return call.args[0]
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                and func.value.id in ("F", "torch", "functional")):
        return func.value  # `x.softmax(dim=-1)`
    return call.args[0] if call.args else None


def _added_center(node: ast.AST, aliases: dict, depth: int = 0) -> ast.AST | None:
    """The ``a + center`` inside a softmax's input, through divisions by a temperature and
    through one name the scope binds once."""
    if depth > 2:
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if _is_center(node.left) != _is_center(node.right):
            return node
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
        for side in (node.left, node.right):
            found = _added_center(side, aliases, depth)
            if found is not None:
                return found
    if isinstance(node, ast.Name) and aliases.get(node.id) is not None:
        return _added_center(aliases[node.id], aliases, depth + 1)
    return None


def _running(tree: ast.AST) -> set[str]:
    """The center names the file updates as a running value: an augmented assignment, an
    assignment whose value reads the name itself (``self.center = self.center * m + ...``), or
    an in-place method called on it (``self.center.mul_(m).add_(...)``, ``center.data.copy_``).
    A name only ever initialised (a registered buffer, a constant window) is a fixed prior."""
    names: set[str] = set()
    for node in walk(tree):
        if isinstance(node, ast.AugAssign):
            name = _last_name(node.target)
            if name is not None:
                names.add(name)
        elif isinstance(node, ast.Assign):
            read = {_last_name(n) for n in walk(node.value)}
            names.update(name for target in node.targets
                         if (name := _last_name(target)) is not None and name in read)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.endswith("_") and not node.func.attr.startswith("_"):
            owner = node.func.value
            while isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute):
                owner = owner.func.value  # ``center.mul_(m).add_(...)``
            if isinstance(owner, ast.Attribute) and owner.attr == "data":
                owner = owner.value
            name = _last_name(owner)
            if name is not None:
                names.add(name)
    return {name for name in names if _CENTER.search(name)}


def centers_added(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``[(line, the sum, the center)]`` for each softmax (or log-softmax) whose logits are a
    running center added to the outputs (``softmax((t + self.center) / temp)``): centering
    subtracts it. A center the file never updates is a fixed offset (a prior), not judged."""
    found = []
    running = _running(tree)
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        bound: dict[str, list] = {}
        for node in scope_walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound.setdefault(node.targets[0].id, []).append(node.value)
        aliases = {k: v[0] for k, v in bound.items() if len(v) == 1}
        for node in scope_walk(scope):
            if not isinstance(node, ast.Call):
                continue
            logits = _softmax_input(node)
            if logits is None:
                continue
            added = _added_center(logits, aliases)
            if added is None:
                continue
            center = added.left if _is_center(added.left) else added.right
            if _last_name(center) not in running:
                continue  # a fixed offset named for a center (a window's prior): no running mean
            found.append((added.lineno, ast.unparse(added), ast.unparse(center)))
    return sorted(set(found))


class CenteringAdded(Rule):
    """
    ## What it does
    Finds a softmax (or log-softmax) over outputs that have a running center *added* to them
    (`softmax((teacher_output + self.center) / temp)`): DINO-style self-distillation centers the
    teacher's outputs by subtracting the running mean of its batches. Read from the script's
    source, in the files whose backwards ran; it points at the sum.

    ## Why is this bad?
    Centering keeps one output dimension from dominating the teacher's targets: the dimensions
    the teacher favours on average are pulled down before the sharpening softmax. Adding the
    center does the opposite: the favoured dimension is pushed up each step, the center follows
    it, and the teacher's targets collapse onto one dimension for every input. The student then
    learns a constant, the loss goes to 0, and the features carry nothing. Nothing fails.

    ## Example
    ```python
    teacher_out = F.softmax((teacher_output + self.center) / self.teacher_temp, dim=-1)
    ```

    ## Use instead
    ```python
    teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1)
    ```

    ## Stays silent on
    A subtracted center; sums with a name that does not say center (a bias, a prior's log);
    a center the file never updates as a running value (a fixed log-prior around each query's
    centre position registered once: no running mean of the outputs); centers added outside a
    softmax's input (coordinates, box centers).
    """

    code = "GD381"
    slug = "centering-added"
    severity = Severity.WARNING
    summary = ("a running center is added to the logits before the softmax instead of subtracted: "
               "the targets collapse onto the dimension they favour")
    fix = "subtract the center: softmax((output - center) / temperature)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, center in centers_added(tree):
                yield self.finding(
                    f"`{text}` adds the center `{center}` to the outputs a softmax sharpens: "
                    f"centering subtracts the running mean of the outputs, so that no dimension "
                    f"dominates; added, it pushes the favoured dimension up at every step and the "
                    f"targets collapse onto it",
                    Location(path, line), evidence={"sum": text, "center": center},
                    fix=f"subtract the center: `{text.replace(' + ', ' - ', 1)}`"
                    if text.count(" + ") == 1 and not text.startswith(center) else self.fix)
