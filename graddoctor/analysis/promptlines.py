"""Where a script writes the loss's ignore_index into its labels: the statement that makes an
inverted prompt mask (``prompt-mask-inverted``), read from the script's text with ``ast``."""

from __future__ import annotations

import ast

# words of statements that mask the padding, not the prompt or the response
_PADDING_WORDS = ("pad", "attn", "attention")
# words of statements that decide which part of an example is trained on
_PART_WORDS = ("prompt", "response", "answer", "instruction", "completion", "question", "query",
               "reply", "assistant", "user", "context", "inst", "resp")


def _is_value(node: ast.AST, ignore: int, names: set) -> bool:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value == ignore
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) is int:
        return -node.operand.value == ignore
    return isinstance(node, ast.Name) and node.id in names


def _constant_names(tree: ast.AST, ignore: int) -> set:
    """Module-level names bound to the ignore value (``IGNORE_INDEX = -100``)."""
    names = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and _is_value(node.value, ignore, set()):
            names.add(node.targets[0].id)
    return names


def _writes_ignore(stmt: ast.stmt, ignore: int, names: set) -> bool:
    """Whether a statement writes the ignore value into labels: ``x[m] = -100``,
    ``masked_fill(m, -100)``, ``torch.where(m, x, -100)`` (or ``full_like(x, -100)``),
    ``fill_(-100)``, ``[-100] * n``."""
    if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Subscript) for t in stmt.targets) \
            and _is_value(stmt.value, ignore, names):
        return True
    value = getattr(stmt, "value", None)
    if value is None:
        return False
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("masked_fill", "masked_fill_", "fill_", "where", "full_like", "full") \
                    and any(_is_value(arg, ignore, names) for arg in node.args):
                return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.List) and any(_is_value(e, ignore, names) for e in side.elts):
                    return True
    return False


def _words(text: str, words) -> bool:
    lowered = text.lower()
    return any(w in lowered for w in words)


def mask_line(path: str, ignore: int) -> tuple[int, str] | None:
    """``(line, text)`` of the statement of ``path`` that writes the ignore value into the
    labels by prompt and response: among the statements writing it, those that do not mask
    the padding; the one naming a part of the example (prompt, response, ...) when one alone
    does, else the only one; None when that does not single one out."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    names = _constant_names(tree, ignore)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)) \
                and _writes_ignore(node, ignore, names):
            text = ast.unparse(node).strip()
            if not _words(text, _PADDING_WORDS):
                found.append((node.lineno, text))
    found = sorted(set(found))
    parts = [f for f in found if _words(f[1], _PART_WORDS)]
    if len(parts) == 1:
        return parts[0]
    return found[0] if len(found) == 1 else None


def padding_mask_line(path: str, ignore: int) -> tuple[int, str] | None:
    """``(line, text)`` of the one statement of ``path`` that writes the ignore value into the
    labels, when it is the padding's mask (it names the padding or the attention mask); None
    when the script writes the ignore value in several statements or in none of that kind."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    names = _constant_names(tree, ignore)
    found = sorted({(node.lineno, ast.unparse(node).strip()) for node in ast.walk(tree)
                    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return))
                    and _writes_ignore(node, ignore, names)})
    if len(found) == 1 and _words(found[0][1], _PADDING_WORDS):
        return found[0]
    return None
