"""The script's ramp-up functions, read from its source and evaluated along their counter: a
function named for a ramp-up (``sigmoid_rampup``, ``linear_rampup``, ``warmup_factor``) whose
value falls as its counter runs from 0 to the ramp's length.

The function's body is evaluated by a small interpreter of its own (numbers only: assignments,
``if``/``return``, arithmetic, comparisons, ``min``/``max``/``abs``/``float``, ``exp``/``clip``/
``cos``/``sqrt``/``log`` of ``math``, ``numpy`` or ``torch``, ``pi``): nothing of the script
runs. A body that reads anything else (a global, an attribute, another call) is not judged."""

from __future__ import annotations

import ast
import math
import re

from .source import _parse
from .source import walk

_RAMP_UP = re.compile(r"ramp_?up|warm_?up", re.I)
_NOT_UP = re.compile(r"down|decay|anneal|cool", re.I)
_COUNTER = re.compile(r"^(current|cur|step|steps|global_step|it|iter|iteration|epoch|t|x|"
                      r"progress|i|n|count|num_updates|curr_\w+|current_\w+|\w*_step|\w*_epoch)$", re.I)
_LENGTH = re.compile(r"length|len|rampup|ramp|warmup|total|max|steps|epochs|period|duration|^T$|^L$|end",
                     re.I)
_LENGTH_VALUE = 100.0
_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


class _Unknown(Exception):
    pass


_FUNCTIONS = {"exp": math.exp, "cos": math.cos, "sin": math.sin, "sqrt": math.sqrt, "log": math.log,
              "tanh": math.tanh, "floor": math.floor, "ceil": math.ceil}
_MODULES = {"math", "np", "numpy", "torch"}


def _call(node: ast.Call, env: dict) -> float:
    args = [_value(a, env) for a in node.args]
    if node.keywords:
        raise _Unknown
    f = node.func
    if isinstance(f, ast.Name):
        if f.id in ("float", "int", "abs") and len(args) == 1:
            return {"float": float, "int": int, "abs": abs}[f.id](args[0])
        if f.id in ("min", "max") and len(args) >= 2:
            return (min if f.id == "min" else max)(args)
        raise _Unknown
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in _MODULES:
        if f.attr in _FUNCTIONS and len(args) == 1:
            return float(_FUNCTIONS[f.attr](args[0]))
        if f.attr in ("clip", "clamp") and len(args) == 3:
            return float(min(max(args[0], args[1]), args[2]))
        if f.attr in ("minimum", "maximum") and len(args) == 2:
            return float(min(args) if f.attr == "minimum" else max(args))
    raise _Unknown


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b,
           ast.Mod: lambda a, b: a % b}
_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}


def _value(node: ast.AST, env: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unknown
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _MODULES \
            and node.attr in ("pi", "e"):
        return math.pi if node.attr == "pi" else math.e
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return float(_BINARY[type(node.op)](_value(node.left, env), _value(node.right, env)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        v = _value(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else (v if isinstance(node.op, ast.UAdd) else not v)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left, right = _value(node.left, env), _value(node.comparators[0], env)
        if left is None or right is None:
            return (left is right) == isinstance(node.ops[0], ast.Eq)
        return _COMPARE[type(node.ops[0])](left, right)
    if isinstance(node, ast.BoolOp):
        values = [_value(v, env) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.IfExp):
        return _value(node.body if _value(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Call):
        return _call(node, env)
    raise _Unknown


class _Return(Exception):
    def __init__(self, value):
        self.value = value


def _run(body: list, env: dict) -> None:
    for statement in body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            env[statement.targets[0].id] = _value(statement.value, env)
        elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name) \
                and type(statement.op) in _BINARY:
            env[statement.target.id] = float(_BINARY[type(statement.op)](
                _value(statement.target, env), _value(statement.value, env)))
        elif isinstance(statement, ast.If):
            _run(statement.body if _value(statement.test, env) else statement.orelse, env)
        elif isinstance(statement, ast.Return) and statement.value is not None:
            raise _Return(_value(statement.value, env))
        else:
            raise _Unknown


def _evaluate(function: ast.FunctionDef, env: dict) -> float | None:
    try:
        _run(function.body, dict(env))
    except _Return as done:
        return float(done.value) if isinstance(done.value, (int, float)) else None
    except (_Unknown, ArithmeticError, ValueError, TypeError, OverflowError):
        return None
    return None


def _roles(function: ast.FunctionDef) -> tuple[str, str, dict] | None:
    """The counter's and the length's parameters, and the others' defaults."""
    args = function.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        return None
    params = [a.arg for a in args.posonlyargs + args.args]
    if params and params[0] in ("self", "cls"):
        return None
    defaults = dict(zip(params[len(params) - len(args.defaults):], args.defaults))
    counters = [p for p in params if _COUNTER.match(p)]
    lengths = [p for p in params if p not in counters and _LENGTH.search(p)]
    counter = counters[0] if counters else (params[0] if params else None)
    length = lengths[0] if lengths else next((p for p in params if p != counter and p not in defaults), None)
    if counter is None or length is None or counter == length:
        return None
    env = {}
    for p in params:
        if p in (counter, length):
            continue
        if p not in defaults:
            return None
        try:
            env[p] = _value(defaults[p], {})
        except _Unknown:
            return None
    return counter, length, env


def _phase_line(function: ast.FunctionDef, counter: str, length: str) -> int:
    """The statement that turns the counter into the ramp's phase (``current / rampup_length``
    in an assignment or a return), else the function's ``def``."""
    for statement in walk(function):
        if not isinstance(statement, (ast.Assign, ast.Return)) or statement.value is None:
            continue
        for node in walk(statement.value):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                left = {n.id for n in walk(node.left) if isinstance(n, ast.Name)}
                right = {n.id for n in walk(node.right) if isinstance(n, ast.Name)}
                if counter in left and length in right:
                    return statement.lineno
    return function.lineno


def falling_ramps(path: str) -> list[tuple[int, str, list[float], int, str, str]]:
    """``(line to change, function name, its values along the ramp, def line, counter, length)``
    for each function
    of the file named for a ramp-up whose value falls from the counter's start to the ramp's
    end, and that the file calls."""
    tree = _parse(path)
    if tree is None:
        return []
    called = {n.func.id for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    found = []
    for function in walk(tree):
        if not isinstance(function, ast.FunctionDef) or not _RAMP_UP.search(function.name) \
                or _NOT_UP.search(function.name) or function.name not in called:
            continue
        roles = _roles(function)
        if roles is None:
            continue
        counter, length, env = roles
        values = []
        for share in _POINTS:
            value = _evaluate(function, {**env, counter: share * _LENGTH_VALUE, length: _LENGTH_VALUE})
            if value is None or not math.isfinite(value):
                break
            values.append(value)
        if len(values) != len(_POINTS):
            continue
        first, last = values[0], values[-1]
        scale = max(abs(first), abs(last))
        if scale == 0 or first - last < 0.5 * scale \
                or any(b > a + 1e-9 * scale for a, b in zip(values, values[1:])):
            continue
        found.append((_phase_line(function, counter, length), function.name,
                      [round(v, 4) for v in values], function.lineno, counter, length))
    return found
