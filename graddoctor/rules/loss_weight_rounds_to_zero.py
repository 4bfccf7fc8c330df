from __future__ import annotations

import ast

from ..analysis.source import rounded_value, without_rounding
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


class LossWeightRoundsToZero(Rule):
    """
    ## What it does
    Finds a term of the backpropagated loss whose weight is exactly 0 at every backward seen
    and is computed with a rounding operation: integer division, `int()`, `round()`,
    `floor()` (`beta = min(1, step // warmup_steps)`, `int(step / 1000) * aux_weight`,
    `round(epoch / epochs) * lam`). The loss's graph shows a term multiplied by the number 0
    at each backward of the line, and the weight's variable is 0 each time. It points at the
    line that computes the weight.

    ## Why is this bad?
    A KL warm-up or an auxiliary-loss ramp written with `//` is 0 until the step reaches the
    divisor, then jumps to its full value: it never anneals, and until then the term it
    weights adds nothing to any gradient. A VAE trained so learns a plain autoencoder (its
    KL term trains nothing), an auxiliary head learns nothing. The loss looks normal, and
    nothing fails.

    ## Example
    ```python
    beta = min(1, step // warmup_steps)
    loss = recon + beta * kl
    ```

    ## Use instead
    ```python
    beta = min(1.0, step / warmup_steps)
    loss = recon + beta * kl
    ```

    ## Stays silent on
    A weight written as 0 (`beta = 0.0`, an ablation) or read from a setting; a warm-up
    with true division (`min(1.0, step / warmup)`), 0 only at its first step; a cyclical
    anneal (`(step % cycle) / cycle`, or one with `//` inside a remainder); a rounded weight
    that becomes non-zero within the run; a loss multiplied by 0 as a whole (no gradient at
    all: grads-always-zero).
    """

    code = "GD155"
    slug = "loss-weight-rounds-to-zero"
    severity = Severity.WARNING
    summary = ("a loss term's weight rounds to 0 at every update (beta = min(1, step // warmup)): "
               "the term trains nothing")
    fix = "compute the weight without rounding: use true division, min(1.0, step / warmup)"

    def check(self, a):
        by_line: dict = {}
        for e in a.of_kind("zero_weight"):
            if e.loc is not None:
                by_line.setdefault(e.loc, []).append(e)
        told: set = set()
        for loc, events in by_line.items():
            last = events[-1]
            if not last["terms"]:
                continue  # a backward of that line had no term weighted by 0
            backwards = a.count(b for b in a.by_kind.get("backward", ()) if b.loc == loc)
            if backwards < 2:
                continue  # one backward cannot tell a weight that stays 0 from a warm-up's first
            for line, value, name in self._weights(a, loc.path, set(last["names"])):
                if (loc.path, line) in told:
                    continue
                told.add((loc.path, line))
                text = ast.unparse(value)
                fixed = without_rounding(value)
                shown = f"`{name} = {text}`" if name else f"`{text}`"
                how = ("use true division" if "//" in text
                       else "compute the weight without rounding")
                yield self.finding(
                    f"the loss weight {shown} is 0 at all {backwards} backwards seen: its "
                    f"rounding makes it 0 until the ratio reaches 1, then a jump (never an "
                    f"anneal), so the loss term it multiplies adds nothing to any gradient",
                    Location(loc.path, line), step=1,
                    fix=f"{how}: `{fixed}`" + ("" if "min(" in fixed else
                                               " (within min(1.0, ...) if it should stop growing)")
                        + "; if the term is meant to switch on at that step, say so with a "
                          "condition (`1.0 if step >= warmup else 0.0`)",
                    evidence={"weight": text, "name": name, "backwards": backwards,
                              "terms": last["terms"]})

    @staticmethod
    def _weights(a, path: str, zero_names: set) -> list[tuple[int, ast.AST, str | None]]:
        """The rounded weights of the file's products: (the line computing it, its expression,
        its variable or None). A variable counts when it is bound to 0 at every backward and
        assigned a rounded value; a rounded expression written in the product itself only when
        no other variable bound to 0, and no literal 0, multiplies anything there (one of those
        would explain the 0 the graph shows)."""
        tree = a.source.tree(path)
        if tree is None:
            return []
        assigned: dict[str, list] = {}
        for node in walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append(node)
        named, inline, explained = {}, {}, False
        for node in walk(tree):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
                continue
            for operand in (node.left, node.right):
                if isinstance(operand, ast.Name) and operand.id in zero_names:
                    rounded = [s for s in assigned.get(operand.id, ()) if rounded_value(s.value)]
                    if rounded:
                        for s in rounded:
                            named[s.lineno] = (s.lineno, s.value, operand.id)
                    else:
                        explained = True
                elif isinstance(operand, ast.Constant) and operand.value == 0 \
                        and type(operand.value) in (int, float):
                    explained = True
                elif rounded_value(operand):
                    inline.setdefault(operand.lineno, (operand.lineno, operand, None))
        if named:
            return sorted(named.values(), key=lambda w: w[0])
        if explained or len(inline) != 1:
            return []
        return list(inline.values())
