"""Where a model's last operation is written: the line to change when a loss is handed the
wrong kind of score (a softmax before ``cross_entropy``, a sigmoid before
``BCEWithLogitsLoss``, a ReLU on logits or on a regression output, a ``log_softmax`` over the
batch).

The trace says which operation made the loss's input (its autograd node), not where it was
written; the loss call is where it shows. When the operation is the model's own last one, that
line is in the model: the final element of an ``nn.Sequential(...)`` or the ``return`` of a
``forward`` (``return self.softmax(x)``, ``return F.log_softmax(x, dim=0)``, or the assignment
of the name it returns). This module reads the script's source for such places; a rule points at
one only when the file holds exactly one (two models ending in the same operation, or none:
the loss call stays the place shown).
"""

from __future__ import annotations

import ast
from ..analysis.source import walk

# an operation kind -> (the names of its function forms, the names of its module classes)
_FORMS = {
    "softmax": ({"softmax"}, {"Softmax"}),
    "sigmoid": ({"sigmoid"}, {"Sigmoid"}),
    "relu": ({"relu", "relu_"}, {"ReLU"}),
    "tanh": ({"tanh"}, {"Tanh"}),
    "softplus": ({"softplus"}, {"Softplus"}),
    "log_softmax": ({"log_softmax"}, {"LogSoftmax"}),
}


def _name(func: ast.AST) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _dim_is_zero(call: ast.Call, method: bool) -> bool:
    """Whether the call normalises over dim 0: ``dim=0`` or the dim as its first positional
    argument (a method's, ``x.log_softmax(0)``; a module's, ``nn.LogSoftmax(0)``) or second (a
    function's, ``F.log_softmax(x, 0)``)."""
    for k in call.keywords:
        if k.arg == "dim":
            return isinstance(k.value, ast.Constant) and k.value.value in (0, None)
    at = 0 if method else 1
    if len(call.args) > at:
        arg = call.args[at]
        return isinstance(arg, ast.Constant) and arg.value in (0, None)
    return True  # no dim: torch picks dim 0 for a 0-, 1- or 3-D input (with a warning)


def _implicit_dim(call: ast.Call) -> bool:
    """Whether a module's constructor call is given no dim (``nn.LogSoftmax()``)."""
    return not call.args and not any(k.arg == "dim" for k in call.keywords)


def _module_classes(tree: ast.AST) -> dict[str, dict[str, ast.Call]]:
    """class name -> {attribute: the constructor call} of ``self.<attr> = nn.X(...)``."""
    out: dict[str, dict[str, ast.Call]] = {}
    for cls in walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        attrs = out.setdefault(cls.name, {})
        for node in walk(cls):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        attrs[target.attr] = node.value
    return out


def _is_op(call: ast.AST, kind: str, attrs: dict[str, ast.Call], zero_dim: bool) -> bool:
    """Whether ``call`` applies the operation: its function form (``F.softmax(x)``,
    ``torch.softmax(x)``, ``x.softmax(1)``), a module built in place (``nn.Softmax(1)(x)``) or a
    module attribute (``self.softmax(x)``) built as one."""
    if not isinstance(call, ast.Call):
        return False
    functions, modules = _FORMS[kind]
    func = call.func
    name = _name(func)
    built = _built_module(call, attrs)
    if built is not None:  # self.<attr>(x): what the attribute was built as, whatever its name
        return _name(built.func) in modules and (not zero_dim or _dim_is_zero(built, True))
    if name in functions:
        method = isinstance(func, ast.Attribute) and not (
            isinstance(func.value, ast.Name) and func.value.id in ("F", "torch", "functional", "nn"))
        method = method and not (isinstance(func.value, ast.Attribute)
                                 and func.value.attr in ("functional",))
        return not zero_dim or _dim_is_zero(call, method)
    if isinstance(func, ast.Call) and _name(func.func) in modules:
        return not zero_dim or _dim_is_zero(func, True)
    return False


def _built_module(call: ast.AST, attrs: dict[str, ast.Call]) -> ast.Call | None:
    """The constructor call of the ``self.<attr>`` module ``call`` applies, or None."""
    func = getattr(call, "func", None)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return attrs.get(func.attr)
    return None


def _forward_ends(cls: ast.ClassDef, kind: str, attrs, zero_dim: bool) -> list[int]:
    methods = {fn.name: fn for fn in cls.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines = []
    todo, seen = ["forward"], set()
    while todo:
        name = todo.pop()
        fn = methods.get(name)
        if fn is None or name in seen:
            continue
        seen.add(name)
        assigned: dict[str, ast.AST] = {}
        for stmt in fn.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                assigned[stmt.targets[0].id] = stmt.value
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                value = stmt.value
                if name == "forward" and isinstance(value, ast.Tuple) and value.elts:
                    value = value.elts[0]  # a VAE's (recon, mu, logvar): the output comes first
                if isinstance(value, ast.Name) and value.id in assigned:
                    value = assigned[value.id]
                if name == "forward" and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                        and isinstance(value.func.value, ast.Name) and value.func.value.id == "self" \
                        and value.func.attr in methods:
                    todo.append(value.func.attr)  # forward returns self.decode(z): its end is decode's
                    continue
                if _is_op(value, kind, attrs, zero_dim):
                    built = _built_module(value, attrs)
                    # a module built without its dim: the constructor is where the dim goes
                    lines.append(built.lineno if zero_dim and built is not None
                                 and _implicit_dim(built) else value.lineno)
    return lines


def _sequential_ends(tree: ast.AST, kind: str, zero_dim: bool) -> list[int]:
    modules = _FORMS[kind][1]
    lines = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "Sequential" and node.args \
                and not any(isinstance(a, ast.Starred) for a in node.args):
            last = node.args[-1]
            if isinstance(last, ast.Call) and _name(last.func) in modules \
                    and (not zero_dim or _dim_is_zero(last, True)):
                lines.append(last.lineno)
    return lines


def model_end_line(tree: ast.AST | None, kind: str, zero_dim: bool = False) -> int | None:
    """The one line of the script that applies ``kind`` (a key of ``_FORMS``) as a model's
    last operation (over dim 0 only, with ``zero_dim``), or None when the file holds none or
    more than one."""
    if tree is None or kind not in _FORMS:
        return None
    try:
        attrs_of = _module_classes(tree)
        lines = set(_sequential_ends(tree, kind, zero_dim))
        for cls in walk(tree):
            if isinstance(cls, ast.ClassDef):
                lines.update(_forward_ends(cls, kind, attrs_of.get(cls.name, {}), zero_dim))
    except RecursionError:
        return None
    return next(iter(lines)) if len(lines) == 1 else None
