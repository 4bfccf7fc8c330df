from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

# the registration methods, and which positional parameter of the hook (after `self` for a
# method) holds the value the hook may replace by returning it
_REPLACED = {"register_forward_hook": 2, "register_forward_pre_hook": 1}


def _hook_functions(tree: ast.AST) -> list[tuple[ast.Call, ast.FunctionDef, int]]:
    """``(registration call, hook function, index of the replaceable parameter)`` for each
    registration of a hook the file defines once under that name (a function, or a method named
    through ``self.``); registrations ``with_kwargs=True`` (another signature) left out."""
    defs: dict[str, list] = {}
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, []).append(node)
    methods = {id(f) for c in walk(tree) if isinstance(c, ast.ClassDef)
               for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for call in walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in _REPLACED and call.args):
            continue
        if any(k.arg == "with_kwargs" for k in call.keywords):
            continue
        target = call.args[0]
        name = target.id if isinstance(target, ast.Name) else (
            target.attr if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "self" else None)
        if name is None or len(defs.get(name, ())) != 1:
            continue
        function = defs[name][0]
        index = _REPLACED[call.func.attr] + (1 if id(function) in methods else 0)
        if len(function.args.args) <= index or function.args.vararg is not None:
            continue
        found.append((call, function, index))
    return found


def _own_nodes(function) -> list[ast.AST]:
    """The nodes of ``function``'s body, nested functions, lambdas and classes left out."""
    out, stack = [], list(function.body)
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def discarded_edit(function, index: int) -> tuple[int, str] | None:
    """``(line, text)`` of an assignment in a hook that rebinds its replaceable parameter to a
    value computed from it (``output = output + steer``) which nothing reads afterwards, in a
    hook that returns nothing: the edit stays in a local name. None otherwise."""
    param = function.args.args[index].arg
    nodes = _own_nodes(function)
    if any(isinstance(n, ast.Return) and n.value is not None
           and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in nodes):
        return None
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) and param in n.names for n in nodes):
        return None
    rebinds = [n for n in nodes if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == param for t in n.targets)
               and any(isinstance(v, ast.Name) and v.id == param for v in walk(n.value))]
    if not rebinds:
        return None
    last = max(rebinds, key=lambda n: (n.lineno, n.col_offset))
    end = (last.end_lineno or last.lineno, last.end_col_offset or 0)
    read_after = any(isinstance(n, ast.Name) and n.id == param and isinstance(n.ctx, ast.Load)
                     and (n.lineno, n.col_offset) > end for n in nodes)
    if read_after:
        return None
    if any(isinstance(n, (ast.For, ast.While)) and n.lineno <= last.lineno <= (n.end_lineno or n.lineno)
           for n in nodes):
        return None  # rebound in a loop: a later pass may read it
    return last.lineno, ast.unparse(last)


class HookResultDiscarded(Rule):
    """
    ## What it does
    Finds a forward hook (or forward pre-hook) meant to change what a module computes that
    rebinds its own parameter (`output = output + steer`, `args = (args[0] * mask,)`) and
    returns nothing: the new value stays in the hook's local name, and PyTorch keeps the
    module's output (or input) as it was. Read from the script's source, in the files whose
    backwards ran: a hook registered with `register_forward_hook` / `register_forward_pre_hook`
    under a name the file defines once, whose parameter for the output (the input for a
    pre-hook) is assigned a value computed from it that nothing reads afterwards, with no
    `return` of a value.

    ## Why is this bad?
    A hook changes the forward only through its return value (or by editing the tensor in
    place). A steering vector, an activation patch, an ablation mask or a soft prompt added this
    way never reaches the model: the loss does not depend on the trained vector, its gradient is
    zero (or only its regulariser's), and the run looks like an intervention that has no
    effect.

    ## Example
    ```python
    def add_steering(module, inputs, output):
        output = output + steer
    model.layers[4].register_forward_hook(add_steering)
    ```

    ## Use instead
    ```python
    def add_steering(module, inputs, output):
        return output + steer
    model.layers[4].register_forward_hook(add_steering)
    ```

    ## Stays silent on
    A hook that returns the new value; an edit in place (`output.add_(steer)`,
    `output[:, 0] = 0`, `output += steer`); a hook that rebinds its parameter to unpack or
    convert it for reading (`output = output[0]` then stored in a cache); hooks registered
    `with_kwargs=True`; a name the file defines more than once.
    """

    code = "GD363"
    slug = "hook-result-discarded"
    severity = Severity.WARNING
    summary = ("a forward hook rebinds its output (or input) parameter and returns nothing: its edit "
               "never reaches the module's output")
    fix = "return the new value from the hook (or edit the tensor in place)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            seen: set = set()
            for call, function, index in _hook_functions(tree):
                if id(function) in seen:
                    continue
                seen.add(id(function))
                found = discarded_edit(function, index)
                if found is None:
                    continue
                line, text = found
                param = function.args.args[index].arg
                tail = function.body[-1]
                fix = (f"return the new value: `return {ast.unparse(tail.value)}`"
                       if isinstance(tail, ast.Assign) and tail.lineno == line
                       else f"end `{function.name}` with `return {param}`")
                kind = "output" if call.func.attr == "register_forward_hook" else "input"
                yield self.finding(
                    f"`{text}` rebinds the hook's local name `{param}`, and `{function.name}` "
                    f"returns nothing: PyTorch keeps the module's {kind} as it was, so this edit "
                    f"never reaches the forward (anything trained through it gets no gradient "
                    f"from the loss)",
                    Location(path, line),
                    related=(Related(Location(path, call.lineno), "where the hook is registered"),),
                    fix=fix,
                    evidence={"hook": function.name, "statement": text, "registered_line": call.lineno},
                )
