"""LoRA scalings written upside down, read from the script's source: a quotient whose numerator
names the adapter's rank and whose denominator names its alpha (``r / alpha``,
``self.r / self.lora_alpha``, ``math.sqrt(r) / alpha``), where LoRA scales the low-rank update by
``alpha / r`` (or rsLoRA's ``alpha / sqrt(r)``)."""

from __future__ import annotations

import ast
import re

from .source import _parse, walk

_RANK = re.compile(r"^(r|rank|lora_r|lora_rank|lora_dim|adapter_rank|rank_r|lora_rank_r)$")
_ALPHA = re.compile(r"^(alpha|lora_alpha|adapter_alpha|alpha_lora)$")
_WRAPPERS = frozenset({"sqrt", "float", "int"})


def _role(node: ast.AST) -> str | None:
    """'rank' or 'alpha' when the expression names one (through sqrt/float/int and ** 0.5)."""
    if isinstance(node, ast.Call) and len(node.args) == 1:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in _WRAPPERS:
            return _role(node.args[0])
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _role(node.left)
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    if name is None:
        return None
    if _RANK.match(name):
        return "rank"
    if _ALPHA.match(name):
        return "alpha"
    return None


def _factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _defaults(tree: ast.AST) -> dict[str, float]:
    """Numbers bound to a name once by the file: a function parameter's default or a module-level
    or ``self.`` assignment of a literal (the last one read wins only when all agree)."""
    seen: dict[str, set] = {}
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = node.args.args[len(node.args.args) - len(node.args.defaults):]
            pairs = list(zip(params, node.args.defaults)) + [
                (a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            for a, d in pairs:
                if isinstance(d, ast.Constant) and isinstance(d.value, (int, float)) and not isinstance(d.value, bool):
                    seen.setdefault(a.arg, set()).add(float(d.value))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name and isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, float)) \
                    and not isinstance(node.value.value, bool):
                seen.setdefault(name, set()).add(float(node.value.value))
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def _bare(node: ast.AST) -> str | None:
    while isinstance(node, ast.Call) and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        node = node.left
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def inverted_lora_scalings(path: str) -> list[tuple[int, str, str, str, float | None, float | None]]:
    """(line, the quotient's text, the rank's text, the alpha's text, rank, alpha) for each
    quotient of the file whose numerator's factors name the rank and not the alpha and whose
    denominator's name the alpha and not the rank, and which nothing divides by (``h / (r /
    alpha)`` scales by ``alpha / r``). The rank's and alpha's values are read where
    the file binds their names to one number; a pair bound to equal numbers (a factor of 1) is
    left out. A file that names no LoRA (`lora` in its text) is read only where the quotient is
    assigned to a name of a scaling."""
    tree = _parse(path)
    if tree is None:
        return []
    try:
        text = ast.unparse(tree)
    except Exception:  # pragma: no cover - a tree ast cannot print
        return []
    names_lora = "lora" in text.lower()
    scaling_targets: set[int] = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                if "scal" in name.lower():
                    scaling_targets.add(id(node.value))
    file_values = _defaults(tree)
    owner: dict[int, ast.AST] = {}  # each node's innermost enclosing class
    for cls in walk(tree):
        if isinstance(cls, ast.ClassDef):
            for sub in walk(cls):
                if id(sub) not in owner or sub is not cls:
                    owner[id(sub)] = cls
    class_values: dict[int, dict[str, float]] = {}
    # quotients that are themselves divided by (``h / (r / alpha)``, ``1 / (r / alpha)``): the
    # update is scaled by their reciprocal, ``alpha / r``
    divisors = {id(f) for node in walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                for f in _factors(node.right)}
    out = []
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
            continue
        if id(node) in divisors:
            continue
        if not names_lora and id(node) not in scaling_targets:
            continue
        top = [_role(f) for f in _factors(node.left)]
        bottom = [_role(f) for f in _factors(node.right)]
        if "rank" not in top or "alpha" in top or "alpha" not in bottom or "rank" in bottom:
            continue
        rank_node = _factors(node.left)[top.index("rank")]
        alpha_node = _factors(node.right)[bottom.index("alpha")]
        cls = owner.get(id(node))
        values = file_values
        if cls is not None:  # the class's own defaults first: two adapters may bind other numbers
            if id(cls) not in class_values:
                class_values[id(cls)] = _defaults(cls)
            values = {**file_values, **class_values[id(cls)]}
        rank = values.get(_bare(rank_node) or "")
        alpha = values.get(_bare(alpha_node) or "")
        if rank is not None and alpha is not None and rank == alpha:
            continue
        rank_text, alpha_text = ast.unparse(rank_node), ast.unparse(alpha_node)
        out.append((node.lineno, f"{rank_text} / {alpha_text}", rank_text, alpha_text, rank, alpha))
    return sorted(set(out))
