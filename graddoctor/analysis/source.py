"""What the user's source says around an event's line, for the few bugs no runtime event can
show: a method named without its call (``optimizer.zero_grad`` with no parentheses) runs nothing,
so the trace holds no trace of it. Read-only, cached, and silent on any failure (a file that is
gone, not Python, or a location that is not a file): the rules then fall back to the trace."""

from __future__ import annotations

import ast
import linecache
import os
from functools import lru_cache


class ScriptSource:
    """The user's files as the rules read them. A trace's paths are shown paths, relative to
    where the check started (``base_dir``), not to the working directory of the moment (a
    script may change it, and an in-process check of ``train.py`` from another folder used to
    read the file of the last one); each method takes such a path and reads the absolute one."""

    def __init__(self, base_dir: str | None = None):
        self.base_dir = base_dir

    def full(self, path: str) -> str:
        if os.path.isabs(path) or path.startswith("<"):
            return path
        return os.path.normpath(os.path.join(self.base_dir or os.getcwd(), path))

    def bare_method_lines(self, path: str, line: int, method: str, outer: bool = False):
        return bare_method_lines(self.full(path), line, method, outer)

    def assigned_object(self, path: str, line: int, attribute: str) -> str | None:
        return assigned_object(self.full(path), line, attribute)

    def inside_loop(self, path: str, line: int) -> bool | None:
        return inside_loop(self.full(path), line)

    def innermost_loop(self, path: str, line: int) -> tuple[int, int] | None:
        return innermost_loop(self.full(path), line)

    def lr_assignment_lines(self, path: str) -> list[int]:
        return lr_assignment_lines(self.full(path))

    def called_object(self, path: str, line: int, method: str) -> str | None:
        return called_object(self.full(path), line, method)

    def call_argument(self, path: str, line: int, function: str, position: int, keyword: str) -> str | None:
        return call_argument(self.full(path), line, function, position, keyword)

    def cuts_gradient_near(self, path: str, line: int) -> bool | None:
        return cuts_gradient_near(self.full(path), line)

    def tail_flush(self, path: str, line: int) -> str | None:
        return tail_flush(self.full(path), line)

    def method_called_on_assigned(self, path: str, line: int, method: str) -> bool | None:
        return method_called_on_assigned(self.full(path), line, method)

    def line_text(self, path: str, line: int) -> str:
        """The text of that line ("" when it cannot be read)."""
        try:
            return linecache.getline(self.full(path), line)
        except Exception:
            return ""


@lru_cache(maxsize=64)
def _tree(text: str) -> ast.AST | None:
    try:
        return ast.parse(text)
    except Exception:
        return None


def _parse(path: str) -> ast.AST | None:
    # keyed by the text, not the name: a relative name (or a name of the same length) may stand
    # for another file by now, as in two checks of ``train.py`` from two directories
    try:
        linecache.checkcache(path)  # keeps the text that ran (run/target.py), drops edited files
        lines = linecache.getlines(path)
    except Exception:
        return None
    return _tree("".join(lines)) if lines else None


def bare_method_lines(path: str, line: int, method: str, outer: bool = False) -> list[tuple[int, str]]:
    """The lines, inside the innermost loop that holds ``line``, of expression statements that
    name ``<something>.<method>`` without calling it (``optimizer.zero_grad``): they do nothing.
    Each as ``(line, its source text)``.
    ``outer``: search the outermost loop that holds ``line`` instead (a per-epoch call such as
    ``model.train()`` sits in the epoch loop, around the batch loop). Empty when the source
    cannot be read or ``line`` is in no loop."""
    tree = _parse(path)
    if tree is None:
        return []
    loop = None
    for node in ast.walk(tree):
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (loop is None or (node.lineno < loop.lineno if outer else node.lineno >= loop.lineno))):
            loop = node
    if loop is None:
        return []
    return sorted((node.lineno, ast.unparse(node.value)) for node in ast.walk(loop)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == method)


def assigned_object(path: str, line: int, attribute: str) -> str | None:
    """The source text of the object whose ``attribute`` the statement at ``line`` assigns
    (``opt`` in ``opt.lr = 1e-3``), so that a fix can name the script's own variable; None when
    the source cannot be read or holds no such assignment there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno == line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == attribute:
                    return ast.unparse(target.value)
    return None


def inside_loop(path: str, line: int) -> bool | None:
    """Does a ``for``/``while`` loop of the function (or module) whose body holds ``line`` hold
    it too? Loops of an enclosing function around a nested one do not count. None when the
    source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope: ast.AST = tree
    for node in ast.walk(tree):  # the innermost function holding the line
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (scope is tree or node.lineno >= scope.lineno)):
            scope = node
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # another scope
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor))
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def innermost_loop(path: str, line: int) -> tuple[int, int] | None:
    """``(first, last)`` line of the innermost ``for``/``while`` loop of ``path`` that holds
    ``line``, or None (no loop, or the file cannot be read)."""
    tree = _parse(path)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best[0]:
                best = (node.lineno, node.end_lineno or node.lineno)
    return best


@lru_cache(maxsize=16)
def _lr_lines(text: str) -> tuple[int, ...]:
    try:
        tree = ast.parse(text)
    except Exception:
        return ()
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "lr"):
                found.append(node.lineno)
    return tuple(sorted(set(found)))


def lr_assignment_lines(path: str) -> list[int]:
    """The lines of ``<something>["lr"] = ...`` (or ``*=``, ...) in the file: where a script
    writes a param group's learning rate itself. Empty when the source cannot be read.
    Keyed by the text (not the name: a relative name may stand for another file by now)."""
    try:
        linecache.checkcache(path)
        lines = linecache.getlines(path)
        return list(_lr_lines("".join(lines))) if lines else []
    except Exception:
        return []


def called_object(path: str, line: int, method: str) -> str | None:
    """The source text of the object whose ``method`` a call on ``line`` calls (``opt`` in
    ``opt.step()``, ``scaler`` in ``scaler.scale(loss).backward()``), so that a fix can name the
    script's own variables; None when the source cannot be read or holds no such call there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return ast.unparse(node.func.value)
    return None


def call_argument(path: str, line: int, function: str, position: int, keyword: str) -> str | None:
    """The source text of an argument of a call of ``function`` (a plain or dotted name ending
    so: ``clip_grad_norm_`` matches ``torch.nn.utils.clip_grad_norm_``) on ``line``, given at
    ``position`` or as ``keyword=``: ``args.clip`` in ``clip_grad_norm_(params, args.clip)``.
    None when the source cannot be read or shows no such call and argument there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name != function:
            continue
        for kw in node.keywords:
            if kw.arg == keyword:
                return ast.unparse(kw.value)
        if len(node.args) > position and not any(isinstance(a, ast.Starred) for a in node.args[:position + 1]):
            return ast.unparse(node.args[position])
    return None


_CUTS = ("detach", "detach_", "data")


def cuts_gradient_near(path: str, line: int) -> bool | None:
    """Does the code around ``line`` cut a tensor from its graph (``.detach()``, ``.detach_()``,
    ``.data``)? Around: the innermost function holding it, else (module level) the innermost loop,
    else its statement. None when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope: ast.AST | None = None
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (scope is None or node.lineno >= scope.lineno)):
            scope = node
    if scope is None:
        holding = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)
                   and node.lineno <= line <= (node.end_lineno or node.lineno)]
        loops = [node for node in holding if isinstance(node, (ast.For, ast.While, ast.AsyncFor))]
        inner = loops or holding
        scope = max(inner, key=lambda node: node.lineno) if inner else None
    if scope is None:
        return None
    for node in ast.walk(scope):
        if isinstance(node, ast.Attribute) and node.attr in _CUTS:
            return True
    return False


def _has_modulo(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(node))


def _disjuncts(test: ast.AST) -> list[ast.AST]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return [d for value in test.values for d in _disjuncts(value)]
    return [test]


def tail_flush(path: str, line: int) -> str | None:
    """The source text of a second way into an accumulation step: in the test of an ``if``
    whose body holds ``line``, an ``or`` that joins a window test with a ``%`` (``(i + 1) % k
    == 0``) to one without (``i + 1 == num_batches``, ``i == len(loader) - 1``, ``is_last``),
    which flushes the epoch's tail at a count of the script's own. None when the source cannot
    be read or shows no such test."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and node.body
                and node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno)):
            continue
        parts = _disjuncts(node.test)
        if len(parts) > 1 and any(_has_modulo(d) for d in parts):
            plain = [d for d in parts if not _has_modulo(d)]
            if plain:
                return ast.unparse(plain[0])
    return None


def method_called_on_assigned(path: str, line: int, method: str) -> bool | None:
    """Does the file call ``<target>.<method>(...)`` anywhere, for the object the statement at
    ``line`` assigns (``swa_scheduler`` in ``swa_scheduler = SWALR(...)``), under that name or
    another one it is handed on as? The object is followed through the file by name: an
    assignment whose value mentions it (``self.scheduler = kwargs["scheduler"]``), a keyword
    argument it is passed as (``SimCLR(scheduler=scheduler)``). None when the source cannot be
    read or the statement assigns no plain target."""
    tree = _parse(path)
    if tree is None:
        return None
    target = None
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], (ast.Name, ast.Attribute)):
                target = targets[0]
                break
    if target is None:
        return None
    names = {_last_name(target)}
    nodes = list(ast.walk(tree))
    grew = True
    while grew:  # the names the object is handed on as, until no new one appears
        grew = False
        for node in nodes:
            found: list[str] = []
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _mentions(node.value, names):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found = [n for t in targets if (n := _last_name(t)) is not None]
            elif isinstance(node, ast.Call):
                found = [k.arg for k in node.keywords if k.arg and _mentions(k.value, names)]
            for name in found:
                if name not in names:
                    names.add(name)
                    grew = True
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == method and _last_name(node.func.value) in names
               for node in nodes)


def _last_name(node: ast.AST) -> str | None:
    """``scheduler`` for ``scheduler``, ``self.scheduler`` and ``trainer.cfg.scheduler``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mentions(value: ast.AST, names: set) -> bool:
    """Does the expression use one of ``names``: as a name, an attribute, or a string key
    (``kwargs["scheduler"]``)?"""
    for node in ast.walk(value):
        if (isinstance(node, ast.Name) and node.id in names
                or isinstance(node, ast.Attribute) and node.attr in names
                or isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names):
            return True
    return False
