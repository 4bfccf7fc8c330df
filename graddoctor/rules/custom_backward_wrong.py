from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Related, Rule


def _ordinal(i: int) -> str:
    return {0: "first", 1: "second", 2: "third", 3: "fourth"}.get(i, f"#{i + 1}")


class CustomBackwardWrong(Rule):
    """
    ## What it does
    Checks the backward of every custom `torch.autograd.Function` the script defines and uses
    with a gradient flowing: once per class, on float64 copies of the inputs it really got, the
    gradient its `backward` returns is compared with finite differences of its `forward` along
    random directions. A backward that disagrees (the wrong sign, a missing or extra factor, a
    wrong transpose or term) is reported at its `def backward`, with the factor when the two
    are proportional.

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

    ## Stays silent on
    A correct backward; a forward that is the identity whose backward reverses or scales the
    gradient on purpose (a gradient-reversal layer); a piecewise-constant forward with a
    surrogate backward (a straight-through estimator); inputs where the forward is not smooth;
    Functions defined outside the script's files; a Function that cannot run in float64.
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
            yield self.finding(
                f"{cls}.backward returns, for its {_ordinal(index)} input, {how}; compared with "
                f"finite differences of {cls}.forward on float64 copies of the inputs it got",
                e.loc, related=rel,
                evidence={"cls": cls, "input": index, "ratio": ratio},
            )
