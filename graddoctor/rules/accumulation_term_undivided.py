from __future__ import annotations

import ast

from ..analysis.basics import written
from ..analysis.windows import typical
from ..findings import Role, Severity
from .base import Rule, related
from ..analysis.source import walk


class AccumulationTermUndivided(Rule):
    """
    ## What it does
    Finds a loss term backpropagated with a plain `.backward()` once per micro-batch next to
    `accelerator.backward(loss)` inside the same accumulation window: both add to the gradients
    one optimizer step applies, but only `accelerator.backward` divides its loss by
    `gradient_accumulation_steps`. Seen in the trace: in every window of k ≥ 2 micro-batches,
    the backward calls accelerate made run k times at one line, and another line of the user's
    own inside `with accelerator.accumulate(...)`, writing gradients of the same optimizer's
    parameters, runs k times as well.

    ## Why is this bad?
    The plain term's gradient is summed over the k micro-batches undivided while the main loss
    is averaged: the term weighs k times more than the coefficient written in the script, and
    changing `gradient_accumulation_steps` silently changes the loss's balance. Adam-like
    optimizers do not cancel this (it is one term's share of the update, not a constant factor).

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    for x, y in loader:
        with accelerator.accumulate(model):
            logits = model(x)
            accelerator.backward(loss_fn(logits, y), retain_graph=True)
            aux = 1e-2 * logits.pow(2).mean()
            aux.backward()                    # not divided by 4
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
            accelerator.backward(loss_fn(logits, y), retain_graph=True)
            accelerator.backward(1e-2 * logits.pow(2).mean())
    ```

    ## Stays silent on
    Every term through `accelerator.backward` (one call per term, or their sum); a plain
    backward that runs once per update (a regulariser applied at the window's end, under
    `if accelerator.sync_gradients:`); a plain backward into another model's parameters with its
    own optimizer (a linear probe on detached features); accumulation without accelerate (a
    hand-written loop divides as it likes: `unscaled-accumulation` judges that), also a loop
    that accumulates by hand around `accelerator.backward(loss / k)` outside `accumulate()`.
    """

    code = "GD151"
    slug = "accumulation-term-undivided"
    severity = Severity.WARNING
    summary = ("a loss term is backpropagated with a plain .backward() beside accelerator.backward: "
               "only the latter is divided by gradient_accumulation_steps")
    fix = ("backpropagate every term with accelerator.backward(...) (it divides by "
           "gradient_accumulation_steps), or add the term to the loss you pass to it")

    def check(self, a):
        for opt, windows in a.windows.items():
            k = typical([w.k for w in windows], [a.weight(w.step) for w in windows])
            if k is None or k < 2:
                continue
            owned = set(a.opt_params.get(opt, ()))
            judged = [w for w in windows if w.k == k and _through_accelerate(w.group)]
            if not judged:
                continue
            # the user's own backward lines that run once per micro-batch in every judged window
            lines: dict[tuple, list] = {}
            for w in judged:
                per_line: dict[tuple, list] = {}
                for b in w.backwards:
                    if b in w.group or b.loc is None or b.loc.via or not owned.intersection(written(b)):
                        continue
                    per_line.setdefault((b.loc.path, b.loc.line), []).append(b)
                for key, found in per_line.items():
                    if len(found) == k:
                        lines.setdefault(key, []).append((w, found[0]))
            for key, seen in lines.items():
                if len(seen) != len(judged):
                    continue  # not in every window: once per update, or another loop's
                if not inside_accumulate(a.source.tree(key[0]), key[1]):
                    continue  # accumulated by hand around accelerator.backward: the script divides
                w, first = seen[0]
                main = w.group[0]
                yield self.finding(
                    f"this backward() adds its loss to the {k} micro-batches accumulated for each "
                    f"{a.optimizer_name(opt)} step, next to accelerator.backward() at line "
                    f"{main.loc.line}, which divides its loss by gradient_accumulation_steps "
                    f"({k}); this one is not divided, so its term weighs {k}x more than written "
                    f"in every update",
                    first.loc, step=w.index,
                    related=(related(main, "the accelerator.backward() that divides by "
                                           "gradient_accumulation_steps"),
                             related(w.step, "the step that applies the accumulated sum", Role.STEP)),
                    evidence={"k": k, "optimizer": opt, "main_line": main.loc.line,
                              "windows": a.count(x.step for x, _ in seen)},
                )


def inside_accumulate(tree, line: int) -> bool:
    """Whether ``line`` sits in the body of a ``with x.accumulate(...):`` block, where
    accelerator.backward divides by gradient_accumulation_steps (a loop that accumulates by
    hand with gradient_accumulation_steps=1 divides its losses itself)."""
    if tree is None:
        return False
    for node in walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.body and any(
                isinstance(item.context_expr, ast.Call)
                and isinstance(item.context_expr.func, ast.Attribute)
                and item.context_expr.func.attr == "accumulate" for item in node.items):
            if node.body[0].lineno <= line <= (node.end_lineno or node.lineno):
                return True
    return False


def _through_accelerate(group) -> bool:
    return all(b.loc is not None and b.loc.via == "accelerate" for b in group)
