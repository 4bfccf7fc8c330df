from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# a coefficient that multiplies an input, an output or a loss: preconditioning (c_in, c_skip,
# c_out), a loss weighting, an attention or latent scale
_SCALE_NAME = re.compile(r"^(c_(in|out|skip|noise)|(\w+_)?(weight|weights|weighting|coef|coeff|"
                         r"coefficient|scale|scaling|scaling_factor|lambda|lam))$")


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _body_statements(scope: ast.AST):
    """The statements of ``scope``, not entering nested functions or classes."""
    stack = list(getattr(scope, "body", []))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(stmt, field, []) or [])


def _computes(value: ast.AST) -> bool:
    """Arithmetic over a name (not a constant, not a plain alias or call of nothing)."""
    return isinstance(value, (ast.BinOp, ast.UnaryOp, ast.Call)) and bool(_loads(value)) and not (
        isinstance(value, ast.Call) and not any(isinstance(n, ast.BinOp) for n in walk(value)))


def _canon(node: ast.AST) -> str:
    """A text of ``node`` with the operands of + and * in a fixed order."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        parts = []

        def flat(n):
            if isinstance(n, ast.BinOp) and type(n.op) is type(node.op):
                flat(n.left)
                flat(n.right)
            else:
                parts.append(_canon(n))
        flat(node)
        return "(" + (" + " if isinstance(node.op, ast.Add) else " * ").join(sorted(parts)) + ")"
    if isinstance(node, ast.BinOp):
        return f"({_canon(node.left)} {type(node.op).__name__} {_canon(node.right)})"
    if isinstance(node, ast.Call):
        return f"{_canon(node.func)}({', '.join(_canon(a) for a in node.args)})"
    if isinstance(node, ast.Attribute):
        return f"{_canon(node.value)}.{node.attr}"
    if isinstance(node, ast.UnaryOp):
        return f"{type(node.op).__name__}{_canon(node.operand)}"
    return ast.unparse(node)


def _inlined(value: ast.AST, stmts, own: ast.stmt) -> bool:
    """The coefficient's value (or the denominator of ``1 / d``) written out in another
    statement: the scale is applied inline and the name is only left over."""
    cores = {_canon(value)}
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div) and isinstance(value.left, ast.Constant):
        cores.add(_canon(value.right))
    skip = set()
    for s in stmts:
        # another coefficient made of the same pieces (c_out beside c_in) applies nothing
        if s is own or (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                        and _SCALE_NAME.match(s.targets[0].id.lower())):
            skip.update(id(n) for n in walk(s))
    for s in stmts:
        if isinstance(s, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
            continue  # their own statements are in ``stmts``; their headers hold no product
        for n in walk(s):
            if id(n) not in skip and isinstance(n, (ast.BinOp, ast.Call)) and _canon(n) in cores:
                return True
    return False


def _callee(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _inverse_sqrt(value: ast.AST) -> bool:
    """``d ** -0.5``, ``1 / math.sqrt(d)``, ``1.0 / d ** 0.5``, ``torch.rsqrt(d)``."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Pow):
        exp = value.right
        return isinstance(exp, ast.UnaryOp) and isinstance(exp.op, ast.USub) and isinstance(
            exp.operand, ast.Constant) and exp.operand.value == 0.5
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div) and isinstance(value.left, ast.Constant) \
            and value.left.value in (1, 1.0):
        den = value.right
        return _callee(den) == "sqrt" or (isinstance(den, ast.BinOp) and isinstance(den.op, ast.Pow)
                                          and isinstance(den.right, ast.Constant) and den.right.value == 0.5)
    return _callee(value) == "rsqrt"


def _default_scaled_attention(stmts) -> bool:
    """Whether the function calls ``scaled_dot_product_attention`` without ``scale=``: the
    kernel divides the scores by sqrt(d) on its own."""
    calls = [n for s in stmts for n in walk(s)
             if isinstance(n, ast.Call) and _callee(n) == "scaled_dot_product_attention"]
    return bool(calls) and all(not any(k.arg == "scale" for k in c.keywords) for c in calls)


def unapplied_scales(tree: ast.AST) -> list[tuple[int, str, str, list[str]]]:
    """``(line, name, text, siblings)`` of a coefficient (named like one) assigned by arithmetic
    in a function that computes a loss or an output, and read nowhere in that function; the
    coefficients beside it that are read (``siblings``)."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        stmts = list(_body_statements(scope))
        if not any(isinstance(s, ast.Return) and s.value is not None for s in stmts) and not any(
                isinstance(n, ast.Attribute) and n.attr == "backward" for s in stmts for n in walk(s)):
            continue
        if any(isinstance(s, (ast.Global, ast.Nonlocal)) for s in stmts):
            continue
        read = _loads(scope)
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("locals", "vars", "eval")
               for n in walk(scope)):
            continue
        assigned = {}
        for s in stmts:
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                assigned.setdefault(s.targets[0].id, []).append(s)
        for name, binds in assigned.items():
            if name in read or not _SCALE_NAME.match(name.lower()) or name.startswith("_"):
                continue
            if not all(_computes(b.value) for b in binds):
                continue
            if any(_inlined(b.value, stmts, b) for b in binds):
                continue
            if "scal" in name.lower() and all(_inverse_sqrt(b.value) for b in binds) and _default_scaled_attention(stmts):
                continue  # scaled_dot_product_attention applies 1/sqrt(d) itself
            siblings = sorted(n for n in assigned if n != name and n in read and _SCALE_NAME.match(n.lower()))
            first = binds[0]
            found.append((first.lineno, name, ast.unparse(first.value), siblings))
    return sorted(found)


class ScaleNeverApplied(Rule):
    """
    ## What it does
    Finds a coefficient that a function computes and never uses: a preconditioning factor
    (`c_in`, `c_skip`, `c_out`, `c_noise`), a loss weighting (`weight`, `mse_loss_weights`,
    `snr_weight`), a scale (`scale`, `scaling_factor`, `lam`). It reads the source of the files a
    backward ran from: in a function that returns a value or calls `backward()`, a name of that
    kind assigned by arithmetic on other values (every binding) and read nowhere in the
    function.

    ## Why is this bad?
    The coefficient was computed to be applied: the network's input is fed unscaled (EDM's
    `c_in` missing: inputs of every noise level at their raw size), the loss is left unweighted
    (min-SNR or EDM's `lambda(sigma)` computed, then `loss.mean()` of the plain errors), an
    attention score is left unscaled. Nothing fails; the run trains a different objective from
    the one written down.

    ## Example
    ```python
    c_in = 1 / (sigma_data ** 2 + sigma ** 2).sqrt()
    c_noise = sigma.log() / 4
    F_x = self.model(x, c_noise)
    ```

    ## Use instead
    ```python
    F_x = self.model(c_in * x, c_noise)
    ```

    ## Stays silent on
    A coefficient read anywhere in its function (a closure, a log line, a return); one whose
    value is written out where it applies (`x / (sigma ** 2 + sigma_data ** 2).sqrt()` beside an
    unused `c_in = 1 / (sigma_data ** 2 + sigma ** 2).sqrt()`); a name bound
    to a constant or a plain alias; a function that neither returns nor calls `backward()`;
    names that say no coefficient (`acc`, `batch_size`) and names starting with `_`; a scale of
    `1 / sqrt(d)` beside `F.scaled_dot_product_attention` called without `scale=` (the kernel
    applies that scale itself).
    """

    code = "GD400"
    slug = "scale-never-applied"
    severity = Severity.WARNING
    summary = ("a coefficient (a preconditioning factor, a loss weight, a scale) is computed and "
               "never used: the input, output or loss it was made for goes unscaled")
    fix = "apply the coefficient where it was meant to go, or delete it"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, text, siblings in unapplied_scales(tree):
                beside = (f" while `{'`, `'.join(siblings[:3])}` beside it are applied"
                          if siblings else "")
                yield self.finding(
                    f"`{name} = {text}` is computed and never used{beside}: the input, output or "
                    f"loss it was made for goes unscaled, so the run trains another objective "
                    f"than the one written",
                    Location(path, line), evidence={"name": name, "siblings": siblings},
                    fix=f"apply `{name}` where it was meant to go (the input, the output or the "
                        f"per-sample loss it scales), or delete it")
