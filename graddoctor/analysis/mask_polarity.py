"""Padding masks filled both ways in one script, read from its source: one mask name given to
``masked_fill`` with a large negative value (``-inf``, ``-1e9``, ``finfo.min``: "leave these
positions out of the softmax, the max, the sort") as it is at one call and complemented
(``~mask``, ``mask == 0``, ``logical_not``) at another. Both cannot leave out the padding: one
of them leaves out the real positions instead."""

from __future__ import annotations

import ast
import linecache
import re

from .source import _parse, walk

_FILLS = frozenset({"masked_fill", "masked_fill_"})
# words of a mask name that say which positions it holds
_MASK_WORDS = frozenset({"mask", "masks", "valid", "pad", "padding", "len", "lens", "lengths", "ctx",
                         "context", "attn", "attention", "seq", "tok", "token", "tokens", "keep",
                         "real", "nonpad", "m", "mk"})
# masks of pairs or classes, whose complement is another set on purpose (positives, negatives)
_SET_WORDS = frozenset({"pos", "positive", "positives", "neg", "negative", "negatives", "same",
                        "diag", "eye", "self", "label", "labels", "class", "classes", "target",
                        "targets", "match", "matched", "causal", "future", "tril", "triu", "ignore"})
# words that say True marks the padding: the mask given as it is fills the padding
_PAD_TRUE = frozenset({"pad", "padding", "padded", "invalid", "blank"})


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[_\d]+", name.lower()) if p]


def _root(node: ast.AST) -> str | None:
    """``mask`` of ``mask``, ``mask.unsqueeze(1)``, ``mask[:, None]``, ``mask.bool()``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("unsqueeze", "bool", "view", "reshape", "expand", "expand_as",
                                       "to", "expand_dims", "type", "view_as", "repeat",
                                       "repeat_interleave", "transpose", "permute", "contiguous"):
            node = node.func.value
        else:
            return None


def _polarity(mask: ast.AST) -> tuple[str, bool] | None:
    """(name, complemented) of a fill's mask; None for anything else (a comparison made inline,
    a product of masks)."""
    if isinstance(mask, ast.UnaryOp) and isinstance(mask.op, (ast.Invert, ast.Not)):
        name = _root(mask.operand)
        return (name, True) if name else None
    if isinstance(mask, ast.Call) and isinstance(mask.func, ast.Attribute) \
            and mask.func.attr in ("logical_not", "logical_not_") :
        target = mask.args[0] if mask.args and isinstance(mask.func.value, ast.Name) \
            and mask.func.value.id == "torch" else mask.func.value
        name = _root(target)
        return (name, True) if name else None
    if isinstance(mask, ast.Compare) and len(mask.ops) == 1 and isinstance(mask.ops[0], ast.Eq) \
            and isinstance(mask.comparators[0], ast.Constant) and mask.comparators[0].value in (0, False):
        name = _root(mask.left)
        return (name, True) if name else None
    if isinstance(mask, ast.Call) and isinstance(mask.func, ast.Attribute) and mask.func.attr == "eq" \
            and mask.args and isinstance(mask.args[0], ast.Constant) and mask.args[0].value in (0, False):
        name = _root(mask.func.value)
        return (name, True) if name else None
    if isinstance(mask, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        name = _root(mask)
        return (name, False) if name else None
    return None


def _excluding(value: ast.AST) -> bool:
    """A fill that leaves positions out of a softmax or a max: -inf, a large negative number,
    ``torch.finfo(...).min``."""
    text = ast.unparse(value).replace(" ", "")
    if "finfo" in text and text.endswith(".min"):
        return True
    if re.fullmatch(r"-(float\(['\"]inf['\"]\)|math\.inf|torch\.inf|np\.inf|numpy\.inf|inf)", text):
        return True
    if re.fullmatch(r"float\(['\"]-inf['\"]\)", text):
        return True
    try:
        number = float(ast.literal_eval(value))
    except Exception:
        return False
    return number <= -1e3


def mixed_polarity_fills(path: str) -> list[dict]:
    """Per fill whose mask is the wrong way round: ``{"line", "text", "name", "complemented",
    "other_line", "other_text"}``; ``complemented`` says how this call gives the mask."""
    tree = _parse(path)
    if tree is None:
        return []
    text = "".join(linecache.getlines(path))

    def shown(node: ast.AST) -> str:
        try:
            segment = ast.get_source_segment(text, node)
        except Exception:
            segment = None
        return " ".join(segment.split()) if segment else ast.unparse(node)

    fills: dict[str, list[tuple[int, bool, str]]] = {}
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _FILLS):
            continue
        args = list(node.args)
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            args = args[1:]
        value = args[1] if len(args) > 1 else next((k.value for k in node.keywords if k.arg == "value"), None)
        mask = args[0] if args else next((k.value for k in node.keywords if k.arg == "mask"), None)
        if mask is None or value is None or not _excluding(value):
            continue
        found = _polarity(mask)
        if found is None:
            continue
        name, complemented = found
        parts = set(_parts(name))
        if not parts & _MASK_WORDS or parts & _SET_WORDS:
            continue
        fills.setdefault(name, []).append((node.lineno, complemented, shown(node)))
    out = []
    for name, calls in fills.items():
        if len({c for _, c, _ in calls}) != 2:
            continue
        # a mask True at the real positions is complemented to fill the padding, one True at the
        # padding (its name says so) is given as it is
        complement_fills_padding = not (set(_parts(name)) & _PAD_TRUE)
        bad = [c for c in calls if c[1] != complement_fills_padding]
        good = [c for c in calls if c[1] == complement_fills_padding]
        for line, complemented, text in bad:
            other = good[0]
            out.append({"line": line, "text": text, "name": name, "complemented": complemented,
                        "other_line": other[0], "other_text": other[2]})
    return sorted(out, key=lambda f: f["line"])
