"""Distillation losses whose temperature divides one side only, read from the script's source:
a KL divergence or soft cross-entropy between a ``log_softmax`` of one set of logits and a
``softmax`` of another, where one side's logits are divided by a temperature above 1 and the
other side's by nothing."""

from __future__ import annotations

import ast

from .source import _parse, walk

_LOG_PROBS = frozenset({"log_softmax"})
_PROBS = frozenset({"softmax", "log_softmax"})
_DIVIDES = frozenset({"div", "true_divide", "divide"})


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            return f.id
    return None


def _logits(call: ast.Call) -> ast.AST | None:
    """The logits a (log_)softmax call normalises: its first argument, or the tensor the method
    is called on (``x.softmax(1)``)."""
    f = call.func
    if isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id in ("F", "torch", "nn")) \
            and not isinstance(f.value, ast.Attribute):
        return f.value
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) \
            and f.value.attr not in ("functional",) and not (isinstance(f.value.value, ast.Name) and f.value.value.id in ("torch", "nn")):
        return f.value
    return call.args[0] if call.args else None


def _assignments(tree: ast.AST) -> dict[str, list[ast.AST]]:
    """Each simple name's assigned values, tuples unpacked, and function parameters' defaults."""
    out: dict[str, list[ast.AST]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node.value)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    for t, v in zip(target.elts, node.value.elts):
                        if isinstance(t, ast.Name):
                            out.setdefault(t.id, []).append(v)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for a, d in zip(args, node.args.defaults):
                out.setdefault(a.arg, []).append(d)
            for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults):
                if d is not None:
                    out.setdefault(a.arg, []).append(d)
    return out


def _divisor(expr: ast.AST, values: dict[str, list[ast.AST]]) -> ast.AST | None:
    """The divisor of ``logits / T`` or ``logits.div(T)`` (through one assignment of a name),
    else None."""
    for _ in range(2):
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
            return expr.right
        if isinstance(expr, ast.Call) and _called(expr) in _DIVIDES:
            # ``logits.div(T)``, ``torch.div(logits, T)``, ``torch.true_divide(logits, T)``
            f = expr.func
            method = isinstance(f, ast.Attribute) and not (
                isinstance(f.value, ast.Name) and f.value.id == "torch")
            rest = expr.args if method else expr.args[1:]
            if len(rest) == 1 and not expr.keywords:
                return rest[0]
            return None
        if isinstance(expr, ast.Name) and len(values.get(expr.id, ())) == 1:
            expr = values[expr.id][0]
            continue
        return None
    return None


def _number(expr: ast.AST, values: dict[str, list[ast.AST]]) -> float | None:
    """The value of a literal, or of a name or ``self.T`` attribute assigned one literal."""
    for _ in range(3):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, (int, float)) \
                and not isinstance(expr.value, bool):
            return float(expr.value)
        name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else None
        if name is None or len({ast.dump(v) for v in values.get(name, ())}) != 1:
            return None
        expr = values[name][0]
    return None


def _resolved(expr: ast.AST, values: dict[str, list[ast.AST]]) -> ast.AST:
    """A name's one assigned value (``soft_targets = F.softmax(t / T, 1)``), else ``expr``."""
    if isinstance(expr, ast.Name) and len(values.get(expr.id, ())) == 1:
        return values[expr.id][0]
    return expr


def _pair(node: ast.AST, values: dict[str, list[ast.AST]]) -> tuple[ast.Call, ast.Call] | None:
    """The (log-probabilities, target probabilities) of a KL or soft cross-entropy: a call whose
    first two arguments are a ``log_softmax`` and a ``softmax`` (``F.kl_div``, ``nn.KLDivLoss``,
    a criterion), or a product of a ``softmax`` and a ``log_softmax``."""
    if isinstance(node, ast.Call) and len(node.args) >= 2 and _called(node) not in _PROBS:
        a, b = _resolved(node.args[0], values), _resolved(node.args[1], values)
        if _called(a) in _LOG_PROBS and _called(b) in _PROBS:
            return a, b
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        a, b = _resolved(node.left, values), _resolved(node.right, values)
        if _called(a) == "softmax" and _called(b) == "log_softmax":
            return b, a
        if _called(b) == "softmax" and _called(a) == "log_softmax":
            return a, b
    return None


_DISTILLATION_NAMES = frozenset({"t", "temperature", "kd_t", "kd_temp", "kd_temperature",
                                 "distill_t", "distill_temp", "distill_temperature",
                                 "distillation_temperature"})


def _distillation_temperature_name(expr: ast.AST) -> bool:
    """Whether an unresolved divisor is named as a distillation temperature (``args.T``,
    ``cfg.kd_temperature``), not as a sharpening one (``uda_softmax_temp``)."""
    name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else None
    return name is not None and name.lower() in _DISTILLATION_NAMES


def one_sided_temperatures(path: str) -> list[tuple[int, str, str, str, str, float | None]]:
    """``(line, side, scaled, unscaled, divisor, value)`` of each distillation loss whose
    temperature divides one side's logits only: ``side`` is ``"student"`` when the log-softmax's
    logits are left undivided (the usual slip) or ``"teacher"`` when the target's are; ``scaled``
    and ``unscaled`` the two logits' text; ``value`` the temperature where the source binds it to
    a number. A target sharpened by a temperature below 1 (UDA, DINO's teacher) is left out, and
    so is a temperature of unknown value on the target side unless it is named as a
    distillation temperature (``args.T``, ``kd_temperature``); [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    values = _assignments(tree)
    found = []
    for node in walk(tree):
        pair = _pair(node, values)
        if pair is None:
            continue
        log_probs, probs = pair
        student, teacher = _logits(log_probs), _logits(probs)
        if student is None or teacher is None:
            continue
        ds, dt = _divisor(student, values), _divisor(teacher, values)
        if (ds is None) == (dt is None):
            continue
        divisor = ds if ds is not None else dt
        value = _number(divisor, values)
        if value is not None and value <= 1.0:
            continue
        if dt is not None and value is None and not _distillation_temperature_name(divisor):
            continue
        side = "student" if ds is None else "teacher"
        scaled, unscaled = (teacher, student) if side == "student" else (student, teacher)
        found.append((node.lineno, side, ast.unparse(scaled), ast.unparse(unscaled),
                      ast.unparse(divisor), value))
    return sorted(set(found))
