from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

# methods that keep what a tensor holds (a device move, a cast, a reshape)
_SAME_VALUES = {"to", "float", "double", "cuda", "cpu", "view", "reshape", "unsqueeze", "squeeze",
                "contiguous", "clone", "detach", "flatten", "requires_grad_"}
# helpers named for a standardisation: `normalize(x)`, `scaler.transform(x)`
_SCALING_WORDS = ("normali", "standardi", "scale", "transform", "whiten")


def _strip(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in _SAME_VALUES:
        node = node.func.value
    return node


def _data_base(node: ast.AST) -> str | None:
    """``u`` of ``u``, ``u[idx]``, ``u[462:]``; ``batch['x']`` of ``batch['x'][i]``: the array a
    raw input is read from (row selections stripped, string keys kept)."""
    node = _strip(node)
    while isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            break
        node = node.value
    if isinstance(node, ast.Name) or (isinstance(node, ast.Subscript)
                                      and isinstance(node.value, ast.Name)):
        return ast.unparse(node)
    return None


def _scaled_base(node: ast.AST, models: frozenset | set = frozenset()) -> str | None:
    """The array of ``(u[idx] - m) / s``, ``(u - m) / (s + eps)``, ``normalize(u[idx])``,
    ``scaler.transform(u)``; None for anything else, a network built in the file included
    (a style-transfer ``transformer(content)``: a model's output, not a standardisation)."""
    node = _strip(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left = _strip(node.left)
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Sub):
            return _data_base(left.left)
        return None
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in models and any(word in name.lower() for word in _SCALING_WORDS):
            return _data_base(node.args[0])
    return None


_SPLIT = re.compile(r"(_(train|tr|trn|val|valid|validation|test|te|tst|eval)$)|(^(train|val|valid|test|eval)_)")


def _family(base: str) -> str:
    """The array a split's name was cut from: ``x_train`` and ``x_test`` are both ``x``."""
    return _SPLIT.sub("", base) or base


def _scaling_mentioned(node: ast.AST, models: set[str]) -> bool:
    """Whether a value reads statistics, a scaling helper or a model's output (not plain data)."""
    for n in walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if name in models or any(w in name.lower() for w in _SCALING_WORDS + ("mean", "std", "mu", "sigma")):
            return True
    return False


def _model_names(tree: ast.AST) -> set[str]:
    """Names assigned a constructed module (``model = DeepONet()``, ``net = nn.Sequential(...)``)."""
    names = set()
    for n in walk(tree):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            value = _strip(n.value)
            if isinstance(value, ast.Call):
                func = value.func
                cls = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if cls[:1].isupper():
                    names.add(n.targets[0].id)
    return names


def _scopes(tree: ast.AST):
    functions = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = {id(n) for f in functions for n in walk(f) if n is not f}
    for scope in functions + [tree]:
        yield [n for n in walk(scope) if id(n) not in inner or scope is not tree]


def _resolve(nodes, name: str, line: int):
    """The value and line of the latest plain assignment to ``name`` before ``line`` in the scope."""
    best = None
    for n in nodes:
        if isinstance(n, ast.Assign) and n.lineno < line and len(n.targets) == 1 \
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name:
            if best is None or n.lineno > best.lineno:
                best = n
    return (best.value, best.lineno) if best is not None else (None, None)


def _standardised_before(nodes, name: str, line: int) -> bool:
    """Whether the latest plain assignment to ``name`` before ``line`` in the scope standardises
    an array (``x_train = (x_train - mu) / sd``): the name then holds standardised values."""
    value, _ = _resolve(nodes, name, line)
    return value is not None and _scaled_base(value) is not None


def inconsistent_input_scaling(tree: ast.AST) -> list[tuple[int, str, str, str, int]]:
    """``(line, raw text, model, array, scaled_line)``: a model called on an array's values as
    they are while another call of the same model gets that array standardised (``(u - mean) /
    std``, ``normalize(u)``); ``line`` is the statement that feeds the raw values (the
    assignment of the name passed, or the call)."""
    models = _model_names(tree)
    if not models:
        return []
    raw: dict[tuple[str, str], tuple[int, str]] = {}
    scaled: dict[tuple[str, str], int] = {}
    for nodes in _scopes(tree):
        for n in nodes:
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in models
                    and n.args):
                continue
            arg, at = n.args[0], n.lineno
            value = _strip(arg)
            base = None
            if isinstance(value, ast.Name):
                resolved, line = _resolve(nodes, value.id, n.lineno)
                if resolved is not None:
                    if isinstance(_strip(resolved), ast.Call) and _scaled_base(resolved, models) is None \
                            and not _scaling_mentioned(resolved, models):
                        base = value.id  # data made by a call (a draw, a load): raw, by its name
                    else:
                        value, at = resolved, line
            scaled_base = _scaled_base(value, models)
            if scaled_base is not None:
                scaled.setdefault((n.func.id, _family(scaled_base)), n.lineno)
                continue
            base = base or _data_base(value)
            if base is not None and _standardised_before(nodes, base, n.lineno):
                continue  # the array was rebound to its standardised values (``x = (x - m) / s``)
            if base is not None:
                raw.setdefault((n.func.id, _family(base)), (at, ast.unparse(value), base))
    found = []
    for (model, family), (line, text, base) in raw.items():
        if (model, family) in scaled:
            found.append((line, text, model, base, scaled[(model, family)]))
    return sorted(found)


class InputScalingInconsistent(Rule):
    """
    ## What it does
    Finds a model called on an array's raw values in one place and on the same array
    standardised by dataset statistics in another (the same array, or splits of one named
    alike: `x_train` and `x_test`): `model(u[idx])` in the training loop and
    `model((u[test] - u_mean) / u_std)` at evaluation (or the other way round), `net(x)` beside
    `net(normalize(x))`. The raw input is the name passed or the statement that assigned it.
    Read from the source of the files a backward ran from.

    ## Why is this bad?
    A network only works on inputs distributed like the ones it was trained on. Fed raw
    physical fields (kelvin, pascal) in training and standardised ones at evaluation, it is
    evaluated on inputs it never saw: the reported error is that of another model, often near
    chance; trained on standardised inputs and run on raw ones, its predictions are garbage
    while the training loss looked fine. Nothing fails: both calls have the right shapes.

    ## Example
    ```python
    u_in = u[idx]                                    # training batch, raw
    loss = ((model(u_in, y) - G[idx]) ** 2).mean()
    ...
    pred = model((u[test] - u_mean) / u_std, y)     # evaluation, standardised
    ```

    ## Use instead
    ```python
    u_in = (u[idx] - u_mean) / u_std
    loss = ((model(u_in, y) - G[idx]) ** 2).mean()
    ...
    pred = model((u[test] - u_mean) / u_std, y)
    ```

    ## Stays silent on
    Every call of the model standardising the array (or none doing so); calls on different
    arrays; a name assigned something else (a sum with noise, another model's output, a model
    of the file whose name reads like a scaling helper: a style-transfer `transformer(content)`); an
    array rebound to its standardised values before the call (`x_train = (x_train - mu) / sd`,
    then `model(x_train[idx])`); a model
    that standardises inside its `forward`; models not built in the file; files no backward
    ran from.
    """

    code = "GD394"
    slug = "input-scaling-inconsistent"
    severity = Severity.WARNING
    summary = ("a model is called on an array's raw values in one place and on the same array "
               "standardised by dataset statistics in another: one of the two sees inputs it "
               "was not trained on")
    fix = "standardise the array the same way at every call of the model"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, model, base, scaled in inconsistent_input_scaling(tree):
                yield self.finding(
                    f"`{model}` gets `{text}` here, the raw values of `{base}`, while at line "
                    f"{scaled} it gets the same data standardised by dataset statistics: one of the "
                    f"two calls feeds the model inputs on a scale it was not trained on, so its "
                    f"predictions (or the error reported for them) are those of another input "
                    f"distribution",
                    Location(path, line),
                    related=(Related(Location(path, scaled), "the call with standardised inputs"),),
                    evidence={"model": model, "array": base, "scaled_line": scaled},
                    fix=(f"standardise `{base}` here as at line {scaled} (with the same mean and "
                         f"scale), or at neither call"))
