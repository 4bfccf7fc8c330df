from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

# in-place writes that put a mask into a weight (``w.mul_(mask)``, ``w.masked_fill_(~m, 0)``)
_WRITES = frozenset({"mul_", "masked_fill_", "copy_", "masked_scatter_", "where_"})


def _mentions(node: ast.AST, name: str) -> bool:
    """Whether ``node`` names ``name`` (a variable or an attribute)."""
    for sub in walk(node):
        if isinstance(sub, ast.Name) and sub.id == name:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == name:
            return True
    return False


def _writes_with_mask(stmt: ast.stmt, param: str, mask: str) -> bool:
    """``stmt`` writes the weight in place with the mask: ``w *= mask``, ``w.mul_(mask)``,
    ``w.masked_fill_(mask == 0, 0)``, ``w[mask == 0] = 0``."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Mult):
        return _mentions(stmt.target, param) and _mentions(stmt.value, mask)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Subscript):
        target = stmt.targets[0]
        return _mentions(target.value, param) and _mentions(target.slice, mask)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in _WRITES:
        call = stmt.value
        return _mentions(call.func.value, param) and any(_mentions(arg, mask) for arg in call.args)
    return False


def _statements(tree: ast.AST, first: int, last: int):
    """The statements of ``tree`` between those lines, each with the function it is in."""
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.stmt) and first <= child.lineno <= last:
                yield child, function
            yield from visit(child, inner)
    yield from visit(tree, "")


class MaskAppliedOnce(Rule):
    """
    ## What it does
    Finds a weight that was multiplied by a 0/1 mask of its module once (in `__init__`, or
    before the loop) and never again: at its first forward the weight is exactly zero wherever
    the mask (a buffer or a tensor attribute of the same module: PixelCNN's and MADE's
    autoregressive masks, a causal convolution's masked taps, a block-sparse connectivity, a
    pruning mask) is 0, and after an update those entries are no longer zero when the module's
    forward has run. It points at the line that applied the mask, when the script has one, else
    at the forward that uses the weight.

    ## Why is this bad?
    The forward uses the weight as it is, so the masked entries get a gradient like every other
    entry, and the first optimizer step moves them off zero: the masked connections are live
    from the second step on. An autoregressive model (PixelCNN, MADE, WaveNet) then sees the
    value it is asked to predict, and its training loss falls fast while its samples are
    garbage; a pruned network grows its pruned weights back. Nothing fails.

    ## Example
    ```python
    class MaskedConv2d(nn.Conv2d):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("mask", make_mask(self.weight))
            self.weight.data *= self.mask
    ```

    ## Use instead
    ```python
    class MaskedConv2d(nn.Conv2d):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("mask", make_mask(self.weight))

        def forward(self, x):
            return self._conv_forward(x, self.weight * self.mask, self.bias)
    ```

    ## Stays silent on
    A mask multiplied in the forward (`F.linear(x, self.mask * self.weight)`: the masked entries
    get a zero gradient and stay zero); a mask re-applied in place at the start of each forward,
    by a forward pre-hook or after every `optimizer.step()`; `torch.nn.utils.prune` (its
    `weight_orig` is not zeroed); masks the script keeps outside the module (a dict of pruning
    masks: not seen); weights whose zeros have no 0/1 tensor beside them (an identity or a
    zero-channel initialisation meant to train); weights a mask does not zero (dropout-connect);
    tensors on an accelerator (not read). A mask re-applied at every update but between
    `backward()` and `step()` is `constraint-before-step`'s (the line to move is that one).
    """

    code = "GD180"
    slug = "mask-applied-once"
    severity = Severity.WARNING
    summary = ("a weight was multiplied by its module's 0/1 mask once, before training: the "
               "updates move the masked entries off zero and the masked connections come back")
    fix = ("apply the mask in forward, to the weight the layer uses (F.linear(x, self.weight * "
           "self.mask, self.bias), self._conv_forward(x, self.weight * self.mask, self.bias)), or "
           "multiply it in again after every optimizer.step()")

    def check(self, a):
        told: set = set()
        # a mask written again between backward and step: not applied once, applied at the wrong
        # point of the update (constraint-before-step's)
        rewritten = {pid for e in a.by_kind.get("constraint_broken", ()) if "zero" in e["kinds"]
                     for pid in e["params"]}
        for event in a.by_kind.get("mask_regrown", ()):
            data = event.data
            if data.get("pid") is not None and data["pid"] in rewritten:
                continue
            cls, param, mask = data.get("cls"), data.get("param"), data.get("mask")
            applied = self._applied_at(a, event)
            loc = applied or self._forward_at(a, event) or event.loc
            if (loc, cls, param, mask) in told:
                continue  # several layers of one class masked by the same line
            told.add((loc, cls, param, mask))
            related = []
            if event.loc is not None and loc != event.loc:
                related.append(Related(event.loc, "the forward that found the masked entries nonzero"))
            fix = (f"multiply by the mask in {cls}.forward, on the weight the layer uses "
                   f"(`self.{param} * self.{mask}`), instead of once here; or multiply it in "
                   f"again after every optimizer.step()")
            yield self.finding(
                f"{cls}.{param} was zero wherever {cls}.{mask} is 0 at its first forward, but "
                f"after {data.get('steps')} update(s) {data.get('regrown')} of those "
                f"{data.get('masked')} masked entries are nonzero when the forward has run: the "
                f"mask was applied once, the forward uses the weight as it is, so the masked "
                f"entries get gradients and the updates bring the masked connections back (an "
                f"autoregressive model then sees what it predicts; pruned weights grow back)",
                loc, related=related, fix=fix,
                evidence={"module": cls, "param": param, "mask": mask,
                          "regrown": data.get("regrown"), "masked": data.get("masked")})

    @staticmethod
    def _spans(a, event) -> list[tuple[str, int, int]]:
        """Where to look for the line that applied the mask: the module's class, then the
        script file that ran the forward."""
        spans = []
        defined = event.get("defined_at")
        if defined:
            spans.append((str(defined[0]), int(defined[1]), int(defined[2])))
        if event.loc is not None:
            spans.append((event.loc.path, 1, 10 ** 9))
        return spans

    def _applied_at(self, a, event) -> Location | None:
        param, mask = event.get("param"), event.get("mask")
        for path, first, last in self._spans(a, event):
            tree = a.source.tree(path)
            if tree is None:
                continue
            for stmt, function in _statements(tree, first, last):
                if function != "forward" and _writes_with_mask(stmt, param, mask):
                    return Location(path, stmt.lineno)
        return None

    @staticmethod
    def _forward_at(a, event) -> Location | None:
        defined = event.get("defined_at")
        if not defined:
            return None
        tree = a.source.tree(str(defined[0]))
        if tree is None:
            return None
        for node in walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "forward" \
                    and int(defined[1]) <= node.lineno <= int(defined[2]):
                return Location(str(defined[0]), node.lineno, "forward")
        return None
