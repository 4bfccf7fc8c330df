from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..location import Location
from .base import Related, Rule
from ..analysis.source import walk

# what a gradient-reversal layer is called: ReverseLayerF, GradReverse, GradientReversal, GRL,
# RevGrad, grad_reverse, reverse_gradient, "reverse the gradient" in a docstring or comment;
# not a reversible (invertible) block, which is another thing
_REVERSAL = re.compile(r"revers(?!ib)|revgrad|gradrev|grl|gradflip|flipgrad")


def _ordinal(i: int) -> str:
    return {0: "first", 1: "second", 2: "third", 3: "fourth"}.get(i, f"#{i + 1}")


def _reversal_word(names) -> str | None:
    for name in names or ():
        if _REVERSAL.search(str(name).lower().replace("_", "")):
            return str(name)
    return None


def _returns(tree: ast.AST | None, def_line: int) -> list[ast.Return]:
    """The return statements with a value of the function defined at ``def_line`` (not those of
    functions nested in it)."""
    if tree is None:
        return []
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == def_line:
            found: list[ast.Return] = []
            stack = list(node.body)
            while stack:
                inner = stack.pop()
                if isinstance(inner, ast.Return) and inner.value is not None:
                    found.append(inner)
                elif not isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                            ast.ClassDef)):
                    stack.extend(ast.iter_child_nodes(inner))
            return sorted(found, key=lambda r: r.lineno)
    return []


def _negated(expr: ast.expr) -> str:
    text = ast.unparse(expr)
    if isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) or (
            isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div))):
        return f"-{text}"
    return f"-({text})"


def _reversal_fix(tree: ast.AST | None, def_line: int, index: int) -> tuple[int, str] | None:
    """(the line to change, the negated statement) for a pass-through backward: the return
    that hands back the gradient of input ``index``, or, when what it returns is a name the
    backward also sets to None (computed only if ``ctx.needs_input_grad``), the assignment
    that computes it."""
    returns = _returns(tree, def_line)
    if not returns:
        return None
    ret = returns[-1]
    elts = list(ret.value.elts) if isinstance(ret.value, ast.Tuple) else [ret.value]
    if index >= len(elts):
        return None
    target = elts[index]
    if isinstance(target, ast.Name):
        function = next(n for n in walk(tree)
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.lineno == def_line)
        assigned = [n for n in walk(function) if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == target.id for t in n.targets)]
        nones = [n for n in assigned if isinstance(n.value, ast.Constant) and n.value.value is None]
        computed = [n for n in assigned if n not in nones]
        if nones and len(computed) == 1:
            value = computed[0].value
            return computed[0].lineno, f"{target.id} = {_negated(value)}"
    elts[index] = ast.Name(id=_negated(target))
    shown = ", ".join(ast.unparse(e) for e in elts) if isinstance(ret.value, ast.Tuple) \
        else elts[0].id
    return ret.lineno, f"return {shown}"



def _swapped_return(tree, def_line: int, needed: int, given: int) -> tuple[int, str] | None:
    """(line, statement) of the backward's last return with its values at ``needed`` and
    ``given`` swapped."""
    returns = _returns(tree, def_line)
    if not returns or not isinstance(returns[-1].value, ast.Tuple):
        return None
    elts = list(returns[-1].value.elts)
    if max(needed, given) >= len(elts) or any(isinstance(e, ast.Starred) for e in elts):
        return None
    elts[needed], elts[given] = elts[given], elts[needed]
    return returns[-1].lineno, "return " + ", ".join(ast.unparse(e) for e in elts)


def _backward_return(tree, line: int) -> tuple[int | None, str | None]:
    """``(line of the backward's one return, its gradient parameter's name when the body never
    reads it)`` for the ``backward`` defined at (or holding) ``line``."""
    if tree is None:
        return None, None
    best = None
    for node in walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "backward" \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            best = node
    if best is None:
        return None, None
    returns = [n for n in walk(best) if isinstance(n, ast.Return) and n.value is not None]
    params = [arg.arg for arg in best.args.args]
    grad = params[1] if len(params) > 1 else (best.args.vararg.arg if best.args.vararg else None)
    # a read of its dtype, device or shape alone (``mask.to(grad_output.dtype)``) is no read
    meta = {id(n.value) for n in walk(best) if isinstance(n, ast.Attribute)
            and n.attr in ("dtype", "device", "shape", "ndim", "size", "dim", "new_zeros",
                           "new_ones", "new_empty")}
    used = {n.id for n in walk(best) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and id(n) not in meta}
    unread = grad if grad is not None and not best.args.vararg and grad not in used else None
    return (returns[0].lineno if len(returns) == 1 else None), unread

class CustomBackwardWrong(Rule):
    """
    ## What it does
    Checks the backward of every custom `torch.autograd.Function` the script defines and uses
    with a gradient flowing: once per class, on float64 copies of the inputs it really got, the
    gradient its `backward` returns is compared with finite differences of its `forward` along
    random directions. A backward that disagrees (the wrong sign, a missing or extra factor, a
    wrong transpose or term) is reported at its `def backward`, with the factor when the two
    are proportional; a backward that never reads its incoming gradient (`grad_output` used for
    its dtype at most: the local derivative returned alone) is reported at its `return`. Every
    backward, a straight-through estimator's too, is also run with two different incoming
    gradients: returning the same values for both means it ignores the gradient from the loss.

    A backward that returns None for an input that needs a gradient and a gradient for one
    that needs none (`return None, grad, None` for `forward(ctx, x, scale, clip)`) has its return
    values out of order with forward's arguments; autograd silently drops a gradient given to
    an input without one, so this is checked whatever the forward (a straight-through
    estimator's too) and reported at the `return`.

    A forward that is one elementwise step (a spike `(v > 0).float()`, a `sign`) has no
    derivative to compare with: its backward is a surrogate gradient, and that is read along a
    line through the range of the input it got. A surrogate is a bump at the step (a fast
    sigmoid `1 / (k * |v| + 1) ** 2`, an arctan, a triangle, a box, a Gaussian of the distance
    to the threshold) or flat (straight through); one with a value of the wrong sign, a pole,
    or a largest value more than 4 times its value at the step (`abs` missing, a bump around 0
    while the spike fires at the threshold) is reported at the backward's `return`.

    An identity Function (a gradient reversal or scaling) applied, with gradients on, to a
    tensor that needs no gradient (`grad_reverse(features.detach())`) does nothing at all: its
    backward never runs. Reported at the line that cut the graph (`.detach()`, `.data`) above
    the call, when the second such call comes before any call with a gradient; an identity
    Function applied to data that never had a gradient (no line above it cuts one) is left
    alone.

    A forward that returns its input unchanged is a gradient-reversal or gradient-scaling layer,
    whose backward is meant not to be its derivative. For those, what the backward really hands
    back is read at the Function's first calls with a nonzero gradient (a hook on its node in
    the script's own backward): when it passes the gradient through unchanged or times a
    positive factor while the script calls the Function a reversal (`ReverseLayerF`,
    `GradReverse`, `GRL`, `RevGrad`, `grad_reverse`, "reverse" in its docstring or at the
    call), the minus sign is missing; reported at the line that computes the returned gradient.

    ## Why is this bad?
    Autograd trusts a hand-written backward completely. A backward with the wrong sign climbs
    the loss through that layer; a factor of 2 missing scales that path's learning rate; a
    gradient that is simply wrong trains towards nothing in particular. No error, no NaN: the
    loss just falls slower, or rises.

    ## Example
    ```python
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * x            # d(x²)/dx is 2x
    ```

    ## Use instead
    ```python
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * grad * x
    ```
    Check it yourself with `torch.autograd.gradcheck(Square.apply, (torch.randn(4, dtype=torch.double, requires_grad=True),))`.

    A gradient-reversal layer (DANN) whose backward lost its sign trains the features to help
    the domain classifier instead of fooling it:
    ```python
    class ReverseLayerF(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.alpha = alpha
            return x.view_as(x)
        @staticmethod
        def backward(ctx, grad_output):
            return grad_output * ctx.alpha, None       # should be -grad_output * ctx.alpha
    ```

    ## Stays silent on
    A correct backward; a gradient-reversal layer that negates (`-alpha * grad`,
    `grad.neg() * alpha`, or a coefficient the caller passes negated), also while a scheduled
    alpha is still 0; an identity forward whose backward scales the gradient by a positive
    factor when nothing calls it a reversal (a gradient-scaling layer such as fairseq's
    `GradMultiply` or a `ScaleGrad`, which scale on purpose; a Function that only records or
    inspects the gradient; model-parallel copy regions at one rank); a piecewise-constant
    forward with a surrogate backward (a straight-through estimator); inputs where the forward
    is not smooth; Functions defined outside the script's files (`torch.utils.checkpoint`); a
    Function that cannot run in float64; a backward whose return tuple lists an input that
    needs no gradient first (`forward(ctx, scale, x)` returning `None, grad`), or that returns
    a gradient for an input that needs none while every input that needs one gets one; a
    gradient reversal applied to features with their gradient, or under `torch.no_grad()`.
    """

    code = "GD234"
    slug = "custom-backward-wrong"
    severity = Severity.WARNING
    summary = "a custom autograd.Function's backward is not the gradient of its forward"
    fix = "fix the backward (check it with torch.autograd.gradcheck on float64 inputs)"

    def check(self, a):
        seen = set()
        for e in a.of_kind("custom_backward"):
            cls, index, ratio = e.get("cls"), e.get("input"), e.get("ratio")
            if cls in seen:
                continue
            seen.add(cls)
            if e.get("input_cut"):
                yield self._identity_on_cut_input(a, e)
                continue
            if e.get("identity"):
                finding = self._reversal_without_minus(a, e)
                if finding is not None:
                    yield finding
                continue
            if e.get("given_to") is not None:
                yield self._misrouted(a, e)
                continue
            if e.get("surrogate"):
                yield self._surrogate(a, e)
                continue
            if ratio is not None and abs(ratio + 1) < 1e-3:
                how = "the true gradient with the opposite sign (training climbs the loss through it)"
            elif ratio is not None and ratio > 0:
                how = f"{ratio:.3g} times the true gradient (a wrong factor)"
            elif ratio is not None:
                how = f"{ratio:.3g} times the true gradient (the wrong sign and a wrong factor)"
            else:
                how = "a gradient that is not proportional to the true one"
            forward = e.get("forward")
            rel = ()
            if forward:
                rel = (Related(Location(str(forward[0]), int(forward[1])), f"{cls}.apply, checked here"),)
            where, unread = e.loc, None
            if where is not None:
                try:
                    returned, unread = _backward_return(a.source.tree(where.path), where.line)
                except Exception:
                    returned = None
                if returned is not None and unread:  # the return is what drops the chain rule
                    where = Location(where.path, returned, where.function)
            chain = (f"; it never reads `{unread}`, the gradient arriving from the loss, so the "
                     f"chain rule is cut and every layer before it gets a gradient that does not "
                     f"depend on the loss" if unread else "")
            if e.get("ignores_grad"):
                how = ("the same gradient whatever gradient arrives from the loss (run twice with "
                       "two different incoming gradients)")
                chain = chain or (": the chain rule is cut, and every layer before it gets a "
                                  "gradient that does not depend on the loss")
            yield self.finding(
                (f"{cls}.backward returns, for its {_ordinal(index)} input, {how}{chain}"
                 if e.get("ignores_grad") else
                 f"{cls}.backward returns, for its {_ordinal(index)} input, {how}; compared with "
                 f"finite differences of {cls}.forward on float64 copies of the inputs it got{chain}"),
                where, related=rel,
                fix=(f"multiply the local derivative by `{unread}` (return {unread} * ...; a "
                     f"straight-through estimator returns `{unread}` itself), and check it with "
                     f"torch.autograd.gradcheck on float64 inputs") if unread else None,
                evidence={"cls": cls, "input": index, "ratio": ratio},
            )

    def _surrogate(self, a, e):
        """A step forward whose surrogate backward is no bump at the step."""
        cls, info = e.get("cls"), e["surrogate"]
        where = e.loc
        if where is not None:
            try:
                returned, _unread = _backward_return(a.source.tree(where.path), where.line)
            except Exception:
                returned = None
            if returned is not None:
                where = Location(where.path, returned, where.function)
        forward = e.get("forward")
        rel = (Related(Location(str(forward[0]), int(forward[1])), f"{cls}.apply, read here"),) \
            if forward else ()
        step, peak = info.get("step"), info.get("peak")
        if not info.get("finite"):
            how = f"an infinite value at input {peak:.3g} (a pole)"
        elif info.get("wrong_sign"):
            how = "values of the opposite sign to the step's (training pushes the other way there)"
        else:
            how = (f"its largest value at input {peak:.3g}, {info['largest'] / max(info['at_step'], 1e-300):.3g} "
                   f"times its value at the step")
        return self.finding(
            f"{cls}.forward is a step at input {step:.3g} (a spike, a sign) and its backward is the "
            f"surrogate gradient every layer before it trains through, but read along the input's "
            f"range it has {how}: a surrogate is a bump centred at the step (a fast sigmoid "
            f"1 / (k * |v| + 1) ** 2, a triangle, a box), and this one sends the largest "
            f"gradients to inputs far from firing",
            where, related=rel,
            fix="centre the pseudo-derivative at the step and keep it non-negative and bounded: "
                "the input's distance to the threshold goes through abs() (`1 / (k * v.abs() + "
                "1) ** 2`), and the backward reads the same shifted input the forward compares",
            evidence={"cls": cls, "input": e.get("input"), "surrogate": info})

    def _identity_on_cut_input(self, a, e):
        """An identity Function (a gradient reversal or scaling) applied to tensors without
        gradient: its backward never runs."""
        cls, index = e.get("cls"), int(e.get("input") or 0)
        word = _reversal_word(e.get("names"))
        where, fix = e.loc, None
        text = a.source.line_text(where.path, where.line) if where is not None else None
        text = text.split("  #", 1)[0] if text else text  # its trailing comment left out
        if text and text.count(".detach()") == 1:
            fix = f"hand it the tensor with its gradient: `{text.strip().replace('.detach()', '')}`"
        forward = e.get("forward")
        rel = ()
        if forward and (where is None or [where.path, where.line] != list(forward)):
            rel = (Related(Location(str(forward[0]), int(forward[1])), f"{cls}.apply"),)
        kind = (f"a gradient reversal ('{word}')" if word else
                "an identity in its forward (a layer whose whole effect is its backward)")
        return self.finding(
            f"{cls} is {kind}, but it is applied to a tensor that needs no gradient (its "
            f"{_ordinal(index)} input, cut from the graph before it): its backward never runs, "
            f"so it does nothing, and the layers that made that tensor never get the gradient "
            f"it was meant to {'reverse' if word else 'shape'}",
            where, related=rel,
            fix=fix or "apply it to the tensor with its gradient (no .detach() or .data before it)",
            evidence={"cls": cls, "input": index, "input_cut": True, "named": word},
        )

    def _misrouted(self, a, e):
        """A backward that returns None for an input that needs a gradient and a gradient for
        one that needs none: the return tuple is out of forward's argument order."""
        cls, needed, given = e.get("cls"), int(e.get("input") or 0), int(e.get("given_to"))
        where, fix = e.loc, None
        if where is not None:
            try:
                swapped = _swapped_return(a.source.tree(where.path), where.line, needed, given)
            except Exception:
                swapped = None
            if swapped is not None:
                where = Location(where.path, swapped[0], where.function)
                fix = (f"return one value per forward argument, in forward's order: "
                       f"`{swapped[1]}`")
        forward = e.get("forward")
        rel = ()
        if forward:
            rel = (Related(Location(str(forward[0]), int(forward[1])), f"{cls}.apply, checked here"),)
        return self.finding(
            f"{cls}.backward returns None for its {_ordinal(needed)} input, which needs a "
            f"gradient, and a gradient for its {_ordinal(given)} input, which needs none: its "
            f"return values are out of order with forward's arguments, so autograd drops the "
            f"gradient and nothing before {cls} trains through it",
            where, related=rel,
            fix=fix or ("return one gradient per forward argument, in forward's order (None for "
                        "the arguments that take no gradient)"),
            evidence={"cls": cls, "input": needed, "given_to": given},
        )

    def _reversal_without_minus(self, a, e):
        """An identity forward whose backward passes the gradient through times a positive
        factor, in a Function the script calls a reversal: the minus sign is missing."""
        cls, index, ratio = e.get("cls"), e.get("input"), e.get("ratio")
        word = _reversal_word(e.get("names"))
        if word is None or ratio is None or ratio <= 0:
            return None  # a gradient-scaling layer, or one that only looks at the gradient
        where = e.loc
        fix_line = None
        if where is not None:
            try:
                fix_line = _reversal_fix(a.source.tree(where.path), where.line, index or 0)
            except Exception:
                fix_line = None
        if fix_line is not None:
            where = Location(where.path, fix_line[0], where.function)
            fix = f"negate the gradient: {fix_line[1]}"
        else:
            fix = "negate the gradient: return -ctx.alpha * grad_output, None"
        how = "unchanged" if abs(ratio - 1) < 1e-6 else f"times {ratio:.3g}"
        forward = e.get("forward")
        rel = ()
        if forward:
            rel = (Related(Location(str(forward[0]), int(forward[1])), f"{cls}.apply, read here"),)
        return self.finding(
            f"{cls} is a gradient reversal ('{word}') whose minus sign is missing: its forward "
            f"returns its {_ordinal(index or 0)} input unchanged and its backward passes the "
            f"gradient back {how}, so what is trained through it helps the loss after it "
            f"(a domain classifier) instead of working against it",
            where, related=rel, fix=fix,
            evidence={"cls": cls, "input": index, "ratio": ratio, "identity": True,
                      "named": word},
        )
