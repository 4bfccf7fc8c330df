from __future__ import annotations

import ast

from ..analysis.source import walk
from ..findings import Severity
from ..trace import Location
from .base import Rule


class DiscardedModuleOutput(Rule):
    """
    ## What it does
    Finds a module call inside the model's forward whose output never reaches the loss and
    that the script throws away: it is assigned to a name that the function never reads
    (`hypo = self.encode(hypothesis)` followed by `torch.cat([prem, prem], 1)`), or the call
    is a statement of its own (`self.dropout(x)` without `x =`). graddoctor sees, at the first
    backwards, which module outputs the loss's graph never reaches, and reads in the script
    the line that made the call (and, through helpers such as `forward_once`, the lines that
    called it) for where the value was dropped. It points at that line.

    ## Why is this bad?
    The module ran, and what it computed was meant for the rest of the forward: a second
    input's encoding, a second view's projection, the attention weights, the dropout that
    regularises a layer. Dropped, the model trains on less than it was written to see (a pair
    classifier that never looks at the hypothesis, a siamese network that compares an image
    with itself, pooling with raw scores instead of their softmax, no dropout at all). Nothing
    fails, the loss goes down, and where the dropped tensor was meant another one (usually a
    copy-pasted name) stands in.

    ## Example
    ```python
    def forward(self, input1, input2):
        output1 = self.forward_once(input1)
        output2 = self.forward_once(input2)
        return self.fc(torch.cat((output1, output1), 1))
    ```

    ## Use instead
    ```python
    def forward(self, input1, input2):
        output1 = self.forward_once(input1)
        output2 = self.forward_once(input2)
        return self.fc(torch.cat((output1, output2), 1))
    ```

    ## Stays silent on
    An output the script reads, whatever it does with it: a detached target
    (`self.encoder(x2).detach()`), probabilities returned next to the logits the loss reads, an
    argmax that picks an action, a hidden state carried to the next batch; a value assigned to
    `_` (a backbone run for the features its forward hooks take); a model's call from the
    training loop (an evaluation forward under grad: not inside another module's forward); a
    bare call of a module with child modules (run for its hooks or its side effects); an output
    appended to a container (`outs.append(head(h))`: kept, and if the loss never reads it,
    `param-without-grad` names the idle module); modules
    called by torch's containers or by a library's model; calls made under `no_grad`.
    """

    code = "GD249"
    slug = "discarded-module-output"
    severity = Severity.WARNING
    summary = ("a module call inside the model's forward is thrown away (assigned to a name never "
               "read, or a bare call): its output never reaches the loss, and another tensor "
               "stands where it was meant")
    fix = "use the module's output where it was meant (a copy-pasted name reads another tensor), or remove the call"

    def check(self, a):
        seen = set()
        for event in a.by_kind.get("output_discarded", ()):
            found = _thrown_away(a, event.get("frames") or (), bool(event.get("leaf")))
            if found is None:
                continue
            path, line, text, names = found
            if (path, line) in seen:
                continue
            seen.add((path, line))
            cls = event.get("module") or "module"
            if names:
                shown = ", ".join(f"`{n}`" for n in names)
                article = "an" if cls[:1].lower() in "aeiou" else "a"
                message = (f"`{text}` computes {article} {cls} output inside the model's forward, but "
                           f"{shown} {'is' if len(names) == 1 else 'are'} never read afterwards: "
                           f"that output never reaches the loss (the graphs of the first "
                           f"backwards never use it), so the model trains without it")
                fix = (f"use {shown} where {'it was' if len(names) == 1 else 'they were'} meant "
                       f"(a copy-pasted name reads another tensor in its place), or remove the call")
            else:
                message = (f"`{text}` runs {cls} inside the model's forward and throws its output "
                           f"away (nothing is assigned): the forward goes on with the tensor as "
                           f"it was, so the {cls} has no effect on what the model trains")
                fix = f"assign the result (`x = {text}`) so the rest of the forward uses it"
            loc = Location(path, line, "")
            yield self.finding(message, loc, fix=fix,
                               evidence={"module": cls, "names": list(names)})


# methods that keep their argument in a container: a module output passed to one is stored
_KEEPING_METHODS = frozenset({"append", "extend", "insert", "add", "appendleft", "put", "put_nowait"})


def _thrown_away(a, frames, leaf: bool):
    """``(path, line, text, names)`` of the first of ``frames`` (innermost first) whose
    statement throws the call's value away: assigned to names the function never reads, or a
    bare call of a module without children; None when a frame passes it on to a use."""
    for frame in frames:
        if not isinstance(frame, (list, tuple)) or len(frame) < 2:
            return None
        path, line = frame[0], frame[1]
        tree = a.source.tree(path)
        if tree is None:
            return None
        statement, function = _statement_at(tree, line)
        if statement is None or function is None:
            return None
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            func = statement.value.func
            if isinstance(func, ast.Attribute) and func.attr in _KEEPING_METHODS:
                return None  # `outs.append(head(h))`: kept in a container, not thrown away
            if leaf:
                return path, statement.lineno, ast.unparse(statement.value), ()
            return None
        if isinstance(statement, ast.Assign):
            names = _target_names(statement.targets)
            if names is None:
                return None  # an attribute, a subscript: kept somewhere
            names = [n for n in names if not n.startswith("_")]
            if not names:
                return None  # `_ = ...`: thrown away on purpose
            read = {n.id for n in walk(function)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if not any(n in read for n in names):
                return path, statement.lineno, ast.unparse(statement), tuple(names)
            continue  # passed on through a name: an outer frame may drop it
        if isinstance(statement, ast.Return):
            continue
        return None
    return None


def _target_names(targets) -> list[str] | None:
    names: list[str] = []
    for target in targets:
        items = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        for item in items:
            if isinstance(item, ast.Starred):
                item = item.value
            if not isinstance(item, ast.Name):
                return None
            names.append(item.id)
    return names


def _statement_at(tree, line: int):
    """The innermost simple statement spanning ``line`` and the function holding it."""
    best, function = None, None
    for node in walk(tree):  # the file's nodes, listed once per check
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if function is None or node.lineno >= function.lineno:
                function = node
        if isinstance(node, (ast.Expr, ast.Assign, ast.Return, ast.AugAssign, ast.AnnAssign)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best, function
