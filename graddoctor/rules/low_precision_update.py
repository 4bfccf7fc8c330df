from __future__ import annotations

from ..findings import Severity
from .base import Related, Rule

_FROZEN_SHARE = 0.9  # share of the weights with a gradient that kept their value


class LowPrecisionUpdate(Rule):
    """
    ## What it does
    Finds optimizers stepping half-precision parameters (`model.half()`,
    `model.to(torch.bfloat16)`) whose update cannot survive that dtype: an `eps` that rounds to
    0 in it (Adam's default `eps=1e-8` in float16), or updates so small against the weights
    that almost no weight changes (bfloat16 weights with a small learning rate). The second
    holds for float32 weights too, where it takes a learning rate typed orders of magnitude too
    small (`lr=1e-10`); there it is judged only for learning rates below 1e-6 that stay the
    same over the compared updates.

    ## Why is this bad?
    Optimizer state and arithmetic follow the parameters' dtype. float16's smallest number is
    about 6e-8, so `eps=1e-8` becomes 0: wherever the second moment underflows (small
    gradients squared), Adam divides by zero and the weights turn inf/NaN. bfloat16 keeps 8
    bits of mantissa: a weight of 1.0 moves in steps of 0.0039, so an update of 1e-5 is rounded
    away and the weights never change — training runs, the loss stays flat.

    ## Example
    ```python
    model = Net().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    ```

    ## Use instead
    ```python
    model = Net()                                      # fp32 master weights
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # low precision for the compute only
        loss = criterion(model(x), y)
    ```

    ## Stays silent on
    fp32 parameters whose updates change them (under autocast or not, small learning rates
    such as 1e-6 with Adam included); half-precision parameters whose optimizer's eps survives
    the dtype and whose updates change the weights; float32 weights that keep their values
    under an lr of 1e-6 or more (vanishing gradients of a deep net from a tiny
    initialisation); steps with a learning rate of 0; a
    warm-up that starts from a tiny lr (the lr moves over the compared updates); sparse
    gradients and sharded (DTensor) parameters, which are not compared.
    """

    code = "GD236"
    slug = "low-precision-update"
    severity = Severity.WARNING
    summary = ("the optimizer's updates are below the parameters' resolution (a tiny lr, or "
               "half precision) and are rounded away, or its eps rounds to 0 in half precision")
    fix = ("keep the parameters in float32 and use torch.autocast for half-precision compute "
           "(or an eps the dtype can hold)")

    def check(self, a):
        inits = {e.get("opt"): e for e in a.of_kind("optimizer_init")}
        seen = set()
        for e in a.of_kind("low_precision"):
            opt, what, dtype = e.get("opt"), e.get("what"), e.get("dtype")
            if (opt, what) in seen:
                continue
            init = inits.get(opt)
            loc = init.loc if init is not None and init.loc is not None else e.loc
            name = a.optimizer_name(opt)
            if what == "eps":
                seen.add((opt, what))
                yield self.finding(
                    f"{name} ({e.get('cls')}) steps {dtype} parameters with eps={e.get('eps'):g}, "
                    f"which rounds to 0 in {dtype}: where the second moment underflows, the update "
                    "divides by zero and the weights turn inf/NaN",
                    loc, related=(Related(e.loc, "its first step"),) if e.loc and e.loc != loc else (),
                    fix=f"keep float32 parameters (torch.autocast for the compute), or pass an eps "
                        f"{dtype} can hold (eps=1e-4)",
                    evidence={"dtype": dtype, "eps": e.get("eps")})
            elif what == "frozen":
                share = e.get("unchanged")
                if not isinstance(share, float) or share < _FROZEN_SHARE:
                    continue
                seen.add((opt, what))
                lr = e.get("lr")
                single = dtype == "float32"
                yield self.finding(
                    f"{share:.0%} of the {dtype} weights that had a non-zero gradient kept their "
                    f"exact value through updates 2-4 of {name}"
                    f"{f' (lr={lr:g})' if lr is not None else ''}: its updates are below {dtype}'s "
                    "resolution and are rounded away, so those weights do not train"
                    + (" — even in float32: the learning rate is orders of magnitude too small"
                       if single else ""),
                    loc, evidence={"dtype": dtype, "unchanged": share, "lr": lr},
                    fix=(f"raise the learning rate{f' (lr={lr:g} looks like a typo)' if lr is not None else ''}: "
                         "an update must be at least about 1e-7 of the weight it changes to "
                         "survive float32" if single else None))
