from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _constants(tree: ast.AST) -> dict[str, object]:
    """Module-level names bound to a literal (``IGNORE = 255``)."""
    out: dict[str, object] = {}
    for node in getattr(tree, "body", ()):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _is_ignore(side: ast.AST, value: int, constants: dict) -> bool:
    if isinstance(side, ast.Constant):
        return side.value == value and not isinstance(side.value, bool)
    if isinstance(side, ast.UnaryOp) and isinstance(side.op, ast.USub) \
            and isinstance(side.operand, ast.Constant):
        return -side.operand.value == value
    if isinstance(side, ast.Name):
        return constants.get(side.id) == value or "ignore" in side.id.lower()
    if isinstance(side, ast.Attribute):
        return "ignore" in side.attr.lower()
    return False


def ignored_comparisons(tree: ast.AST, value: int) -> list[tuple[int, str]]:
    """``(line, text)`` of the comparisons ``x == <ignore value>`` (or ``x.eq(...)``) in the
    script: the literal, a module constant bound to it, or a name saying ``ignore``."""
    constants = _constants(tree)
    out = []
    for node in walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            sides = (node.left, node.comparators[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "eq" and len(node.args) == 1:
            sides = (node.func.value, node.args[0])
        else:
            continue
        if any(_is_ignore(s, value, constants) for s in sides):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(set(out))


class LossOnIgnoredPixels(Rule):
    """
    ## What it does
    Finds a dice, IoU or Tversky-style term written by hand whose mask keeps exactly the pixels
    the cross-entropy of the same loss ignores: the softmax's (or sigmoid's) probabilities
    multiplied by `target == ignore_index` where `target != ignore_index` was meant. Seen in the
    graph of the first 3 backwards: a `cross_entropy`/`nll_loss` whose target holds its
    `ignore_index` at some pixels (at most half), and a multiplication of probabilities by a
    0/1 tensor without graph that is 1 at exactly those pixels. Reported at the comparison with
    the ignore value in the script when the source shows one, else at the backward.

    ## Why is this bad?
    The ignored pixels are the ones without a label: an annotation border, a void region. A
    hand-written dice term must leave them out itself, and the inverted mask does the
    opposite: the term sees only the unlabeled pixels, compared with whatever class the clamped
    void label turns into, and none of the labeled ones. The cross-entropy still trains, so the
    loss falls; the dice term, meant to fight class imbalance on the objects, pulls the border's
    predictions toward an arbitrary class and never reads an object.

    ## Example
    ```python
    ce = nn.CrossEntropyLoss(ignore_index=255)
    valid = (target == 255).unsqueeze(1).float()     # the unlabeled pixels
    probs = logits.softmax(dim=1) * valid
    ```

    ## Use instead
    ```python
    valid = (target != 255).unsqueeze(1).float()     # the labeled pixels
    ```

    ## Stays silent on
    The mask of the labeled pixels (`!=`, `1 - ignored`, `target < num_classes`); a term over
    the unlabeled pixels that goes through a log (an entropy-minimisation or pseudo-label loss
    on them is meant to read exactly those pixels); a mask that differs from the ignored pixels
    anywhere; a target without ignored pixels.
    """

    code = "GD267"
    slug = "loss-on-ignored-pixels"
    severity = Severity.WARNING
    summary = ("a hand-written dice/IoU term is masked to exactly the pixels the cross-entropy "
               "ignores: it reads only the unlabeled pixels and none of the labeled ones")
    fix = "mask with the labeled pixels: (target != ignore_index)"

    def check(self, a):
        for e in a.of_kind("ignored_mask"):
            ignore = e["ignore_index"]
            loc, related, text = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                lines = ignored_comparisons(tree, ignore) if tree is not None else []
                if len(lines) == 1:
                    loc = Location(e.loc.path, lines[0][0])
                    text = lines[0][1]
                    related = (Related(e.loc, "the backward whose graph holds it"),)
            written = f"`{text}`" if text else f"a mask equal to target == {ignore}"
            share = e["ignored"] / max(1, e["pixels"])
            yield self.finding(
                f"{written} keeps the pixels the cross-entropy ignores (ignore_index={ignore}: "
                f"{e['ignored']} of {e['pixels']} pixels, {share:.0%}), and the probabilities "
                f"multiplied by it feed a hand-written term: that term reads only the unlabeled "
                f"pixels and none of the labeled ones — the mask is inverted",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=(f"mask with the labeled pixels instead: (target != {ignore})"
                     + (f", i.e. `{text.replace('==', '!=')}`" if text and "==" in text else "")),
                evidence={"ignore_index": ignore, "shape": list(e["shape"]),
                          "ignored": e["ignored"], "pixels": e["pixels"]})
