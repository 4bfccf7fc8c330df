from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

# the calls that give a tensor one value everywhere, searched in the script for the line to change
_CONSTANT_INITS = ("constant_", "zeros_", "ones_", "fill_", "zero_", "full", "ones", "zeros",
                   "full_like", "ones_like", "zeros_like")


class SymmetricUnits(Rule):
    """
    ## What it does
    Finds a layer whose units are copies of each other: after the third update, every row of a
    stepped weight (a Linear's or a convolution's output units) is still identical, and so is
    every row of its gradient. It happens when a layer's weights start at one constant (an
    all-zero or `nn.init.constant_` initialisation) and the layers after it treat its units
    alike (they start constant too).

    ## Why is this bad?
    Each unit sees the same input, so units with equal weights compute the same value and get
    the same gradient: they stay equal at every update, and the layer learns what one unit
    could. Nothing fails and the loss goes down a little, so the model just underfits. Random
    initialisation exists to break this symmetry.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.weight, 0.05)
    ```

    ## Use instead
    ```python
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)  # a constant is fine for biases
    ```

    ## Stays silent on
    Constant biases; a constant layer followed by a randomly initialised one (its units'
    gradients differ, so they move apart at the first update); zero-initialised output layers,
    LoRA's B and residual branches (their rows get different gradients); weights whose
    gradient is zero (`grads-always-zero`); parameters with a single row; tensors on an
    accelerator (not read).
    """

    code = "GD126"
    slug = "symmetric-units"
    severity = Severity.WARNING
    summary = ("a layer's units stay identical: equal weight rows get equal gradients at every "
               "update (a constant initialisation never breaks the symmetry)")
    fix = ("initialise weights randomly (the layer's default initialisation, or "
           "nn.init.kaiming_uniform_ / xavier_uniform_); a constant is fine for biases")

    def check(self, a):
        for event in a.by_kind.get("symmetric_units", ()):
            # a bias starts constant by design: LayerNorm([T, C])'s (T, C) bias before a mean over
            # T gets one gradient per row without any weight being symmetric
            pids = [p for p in event.get("params") or ()
                    if not (a.param_name(p) or "").split(" ")[0].endswith("bias")]
            if not pids:
                continue
            loc, call_text = self._init_site(a, event, pids)
            cls = a.optimizer_class(event.get("opt")) or "the optimizer"
            rows = "every row" if len(pids) == 1 else "in each, every row"
            where = f" (set by `{call_text}`)" if call_text else ""
            units = event.get("rows") or ()
            count = f"the {units[0]} units" if len(set(units)) == 1 else "the units"
            yield self.finding(
                f"{count} of {a.names(pids)} are copies of each other: after "
                f"{event.get('step')} updates of {cls}, {rows} of the weight is the same{where}, "
                f"and so is every row of its gradient. Units that start equal and are treated "
                f"alike get equal gradients forever: the layer learns what a single unit could",
                loc or event.loc,
                step=event.get("step"),
                evidence={"params": a.param_names(sorted(pids)), "after_updates": event.get("step")})

    @staticmethod
    def _init_site(a, event, pids) -> tuple[Location | None, str | None]:
        """The script's call that gave the weights one value, found by name in the file of the
        step: among several, the first whose text names a weight or the layer's attribute."""
        if event.loc is None:
            return None, None
        found = [c for c in a.source.calls_named(event.loc.path, _CONSTANT_INITS) if not c[2]]
        if not found:
            return None, None
        hints = ["weight"] + [a.param_name(p).split(" ")[0].split(".")[-2]
                              for p in pids if "." in a.param_name(p).split(" ")[0]]
        named = [c for c in found if any(h and h in c[1] for h in hints) and "bias" not in c[1]]
        line, text, _ = (named or [c for c in found if "bias" not in c[1]] or found)[0]
        return Location(event.loc.path, line), text
