from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_FLIPPED = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_FLIPPED_METHODS = {"lt": "ge", "ge": "lt", "gt": "le", "le": "gt", "eq": "ne", "ne": "eq"}
_PADDING_WORDS = ("len", "pad", "mask", "valid", "seq")


def _comparison(node: ast.AST) -> ast.AST | None:
    """The first comparison of one operator (``a < b``, ``a.eq(b)``) inside ``node``."""
    for sub in walk(node):
        if isinstance(sub, ast.Compare) and len(sub.ops) == 1 and type(sub.ops[0]) in _FLIPPED:
            return sub
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr in _FLIPPED_METHODS and len(sub.args) == 1:
            return sub
    return None


def _root_name(node: ast.AST) -> str | None:
    """``mask`` of ``mask``, ``mask.unsqueeze(-1)``, ``mask[..., None]``, ``mask.float()``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return None


def _uses(tree: ast.AST, op: str) -> tuple[set[str], list[ast.AST]]:
    """The names used as a product's operand (``op == "mul"``) or as a ``masked_fill`` mask, and
    those operands or masks written inline as a comparison."""
    names: set[str] = set()
    inline: list[ast.AST] = []
    for node in walk(tree):
        if op == "mul" and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            operands = [node.left, node.right]
        elif op == "masked_fill" and isinstance(node, ast.Call) \
                and isinstance(node.func, ast.Attribute) and node.func.attr in ("masked_fill", "masked_fill_") \
                and node.args:
            operands = [node.args[0]]
        else:
            continue
        for operand in operands:
            name = _root_name(operand)
            if name is not None:
                names.add(name)
            if _comparison(operand) is not None:
                inline.append(operand)
    return names, inline


def padding_comparisons(tree: ast.AST, op: str) -> list[tuple[int, str, ast.AST]]:
    """``(line, statement text, comparison)`` of the comparisons that make a mask the script
    multiplies by (``op == "mul"``) or fills with (``"masked_fill"``): an assignment of a
    comparison to a name used that way, or the comparison written inline in the product or the
    fill."""
    names, inline = _uses(tree, op)
    out = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            compare = _comparison(node.value)
            if compare is not None:
                out.append((node.lineno, ast.unparse(node).strip(), compare))
    for operand in inline:
        out.append((operand.lineno, ast.unparse(operand).strip(), _comparison(operand)))
    return sorted(out, key=lambda item: item[0])


def _padding_words(compare: ast.AST) -> bool:
    return any(word in (sub.id if isinstance(sub, ast.Name) else sub.attr).lower()
               for sub in walk(compare) if isinstance(sub, (ast.Name, ast.Attribute))
               for word in _PADDING_WORDS)


def flipped(compare: ast.AST) -> str:
    """The comparison's text with its operator turned round (``<`` -> ``>=``, ``==`` -> ``!=``)."""
    node = ast.parse(ast.unparse(compare), mode="eval").body
    if isinstance(node, ast.Compare):
        node.ops = [_FLIPPED[type(node.ops[0])]()]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node.func.attr = _FLIPPED_METHODS[node.func.attr]
    return ast.unparse(node)


class MaskKeepsPadding(Rule):
    """
    ## What it does
    Finds a padding mask that keeps exactly the padded positions of a token batch and leaves out
    every real token: a masked mean pooling or a masked per-token loss multiplied by
    `arange(T) >= lengths[:, None]` or `tokens == PAD` where `<` or `!=` was meant, or a
    `masked_fill(mask, 0)` whose mask is True at the real tokens. Seen in the graph of the first
    3 backwards: a product with (or a fill by) a 0/1 tensor without graph whose (batch, length)
    positions are exactly the pad id's positions of a token batch embedded just before (CPU
    token batches with padding in two rows or more). Reported at the comparison that makes the
    mask when the script's source shows one, else at the backward.

    ## Why is this bad?
    The mask is meant to leave the padding out of a sum or a mean. Kept the other way round,
    each sequence's pooled vector is the average of its padding's features (an embedding's
    `padding_idx` row, whatever the layers make of it), the same for every sequence of a given
    length, and a masked loss trains only the padded positions. The model still learns a
    little from the lengths, so the loss falls, and it ends far below what the tokens allow.
    No error: the shapes agree either way.

    ## Example
    ```python
    mask = torch.arange(tokens.size(1))[None, :] >= lengths[:, None]
    pooled = (h * mask.unsqueeze(-1)).sum(1) / lengths.unsqueeze(-1)
    ```

    ## Use instead
    ```python
    mask = torch.arange(tokens.size(1))[None, :] < lengths[:, None]   # the real tokens
    pooled = (h * mask.unsqueeze(-1)).sum(1) / lengths.unsqueeze(-1)
    ```

    ## Stays silent on
    A mask of the real tokens (`<`, `!=`, `lengths > arange`) multiplied in; `masked_fill` of
    the padding (`h.masked_fill(tokens == PAD, 0)`); a mask that differs from the padding
    anywhere (a causal mask, dropout, a random span mask); token batches with padding in fewer
    than two rows; tensors on a GPU (read on the CPU only, or under `--emulate-cuda`).
    """

    code = "GD332"
    slug = "mask-keeps-padding"
    severity = Severity.WARNING
    summary = ("a 0/1 padding mask multiplied into the loss's graph keeps exactly the padded "
               "positions and leaves out every real token")
    fix = "turn the mask's comparison round so that it keeps the real tokens (`<` for `>=`, `!=` for `==`)"

    def check(self, a):
        for e in a.of_kind("padding_kept"):
            loc, related, found = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                candidates = padding_comparisons(tree, e["op"]) if tree is not None else []
                if len(candidates) > 1:
                    candidates = [c for c in candidates if _padding_words(c[2])] or candidates
                if len(candidates) == 1:
                    found = candidates[0]
                    loc = Location(e.loc.path, found[0])
                    related = (Related(e.loc, "the backward whose graph holds it"),)
            rows, length = e["shape"]
            how = ("multiplied into" if e["op"] == "mul" else "filled with masked_fill into")
            written = f"`{found[1]}` makes a mask that" if found else "A 0/1 mask"
            keeps = ("keeps" if e["op"] == "mul" else "leaves unfilled")
            yield self.finding(
                f"{written} {keeps} exactly the padded positions (pad id {e['fill']}) of the "
                f"{rows}×{length} token batch, {e['kept']:.0%} of its positions, and is {how} "
                f"the graph of the loss: every real token is left out and only the padding is "
                f"pooled or trained — the mask is inverted",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=(f"keep the real tokens: `{flipped(found[2])}`" if found else self.fix),
                evidence={"op": e["op"], "fill": e["fill"], "shape": list(e["shape"]),
                          "kept": e["kept"]})
