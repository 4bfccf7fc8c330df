from __future__ import annotations

from ..findings import Severity
from .base import Rule

# schedulers that multiply the optimizer's lr by what their function returns
_FACTOR = frozenset({"LambdaLR", "MultiplicativeLR"})


class ScheduleFactorIsLr(Rule):
    """
    ## What it does
    Finds a `LambdaLR` or `MultiplicativeLR` whose `lr_lambda` returns a learning rate where
    the scheduler wants a factor: its body uses the optimizer's own lr (the same variable, or
    the same number), and the factors it returned in the run never went above that lr. It
    points at the scheduler's construction.

    ## Why is this bad?
    `LambdaLR` sets each group's lr to `base_lr × lr_lambda(step)`. A function written as the
    schedule itself (`lambda step: lr * 0.95 ** step`) makes the lr `lr × lr × 0.95 ** step`:
    lr 1e-2 becomes 1e-4, 100 times too small, and the model barely trains although the loss
    curve looks smooth. `MultiplicativeLR` multiplies the lr by it at every step: the lr
    collapses to zero within a few epochs.

    ## Example
    ```python
    lr = 1e-2
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = LambdaLR(optimizer, lambda step: lr * 0.95 ** step)
    ```

    ## Use instead
    ```python
    scheduler = LambdaLR(optimizer, lambda step: 0.95 ** step)
    ```

    ## Stays silent on
    A factor (warm-up `min(1, step / warmup)`, decay `0.95 ** step`); the optimizer built with
    lr=1.0 and a lambda that returns the lr (the factor is then the lr); a lambda that divides by
    the lr (`schedule(step) / lr`: a factor again); a warm-up whose first factor happens to equal
    the lr (`(step + 1) / 1000` with lr 1e-3): the numbers alone are not judged.
    """

    code = "GD132"
    slug = "schedule-factor-is-lr"
    severity = Severity.WARNING
    summary = ("a LambdaLR's lr_lambda returns a learning rate, not a factor: the lr applied is "
               "the lr squared")
    fix = "return a factor from lr_lambda (`lambda step: 0.95 ** step`): LambdaLR multiplies the optimizer's lr by it"

    def check(self, a):
        for s in a.schedulers.values():
            init = s.init
            if s.cls not in _FACTOR or init is None or init.loc is None or s.opt is None:
                continue
            base = init.get("base_lrs") or []
            if not base or any(b is None or not 0 < b < 1 for b in base):
                continue
            factors = self._factors(s, base)
            if not factors or any(f > b * (1 + 1e-6) for f, b in factors):
                continue
            opt = a.optimizers.get(s.opt)
            if opt is None or opt.loc is None:
                continue
            lr_text = a.source.call_argument(opt.loc.path, opt.loc.line, opt.get("cls"), 1, "lr") \
                if opt.loc.path == init.loc.path else None
            given = a.source.factor_mentions(init.loc.path, init.loc.line, s.cls, lr_text, base[0])
            if given is None:
                continue
            yield self._finding(s, base, factors, given, lr_text)

    @staticmethod
    def _factors(s, base) -> list[tuple[float, float]]:
        """(factor, base lr) of each group at construction and after each step; for
        MultiplicativeLR the factor of each step (the ratio of two lrs)."""
        out = []
        points = [s.init.get("lrs")] + [e.get("lrs") for e in s.steps]
        points = [p for p in points if p and len(p) == len(base) and None not in p]
        if s.cls == "LambdaLR":
            for lrs in points:
                out += [(lr / b, b) for lr, b in zip(lrs, base)]
        else:
            for before, after in zip(points, points[1:]):
                out += [(x / y, b) for x, y, b in zip(after, before, base) if y]
        return out

    def _finding(self, s, base, factors, given, lr_text):
        lr = base[0]
        first = factors[0][0]
        shown = f"`{lr_text}`" if lr_text else f"{lr:g}"
        if s.cls == "LambdaLR":
            effect = (f"the lr applied starts at {lr:g} × {first:g} = {lr * first:.3g} instead of "
                      f"{first:g} ({1 / lr:,.0f}× too small) and stays that much too small")
        else:
            effect = (f"each step multiplies the lr by about {first:.3g}: it collapses toward 0 "
                      f"within a few steps")
        return self.finding(
            f"{s.cls}'s lr_lambda `{given}` computes a learning rate from the optimizer's lr "
            f"({shown}), but {s.cls} multiplies the optimizer's lr by what it returns: {effect}",
            s.init.loc, step=1,
            evidence={"scheduler": s.cls, "lr_lambda": given, "base_lr": lr,
                      "first_factor": first},
            fix=f"return a factor from lr_lambda, without {shown} in it "
                f"(`lambda step: 0.95 ** step`): {s.cls} multiplies the optimizer's lr by it")
