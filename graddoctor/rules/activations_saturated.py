from __future__ import annotations

from ..findings import Severity
from .base import Rule


class ActivationsSaturated(Rule):
    """
    ## What it does
    Finds `tanh` and `sigmoid` layers saturated from the start: at each of the first 3 training
    calls of a tanh or sigmoid (`nn.Tanh`, `nn.Sigmoid`, `torch.tanh`, `F.sigmoid`, ...) on the
    output of a layer whose weight is as this run initialised it, most of its inputs are
    beyond `|x| > 3` (tanh) or `|x| > 6` (sigmoid), where the derivative is below 1% of its
    largest. It points at the `nn.init` call that last set the layer's weight, else at the line
    that built the layer. The first 3 optimizer steps only, CPU tensors.

    ## Why is this bad?
    The gradient through a saturated unit is about 0, so the layer before it, and every layer
    before that, barely learns: the loss stalls or creeps down while nothing fails. It comes
    from an initialisation too wide for the layer (`nn.init.normal_(w, std=1.0)` over 256
    inputs gives outputs with a std of 16, where Xavier's would be about 1) or from inputs
    that were never scaled (incomes, raw counts fed to a default-initialised layer).

    ## Example
    ```python
    layer = nn.Linear(512, 512)
    nn.init.normal_(layer.weight, std=1.0)
    h = torch.tanh(layer(x))
    ```

    ## Use instead
    ```python
    layer = nn.Linear(512, 512)
    nn.init.xavier_uniform_(layer.weight, gain=nn.init.calculate_gain("tanh"))
    h = torch.tanh(layer(x))
    ```

    ## Stays silent on
    Default and Xavier/Kaiming initialisations over standardised inputs; a narrow layer with a
    std of 1; a gate's bias set on purpose (a highway gate at -3 is well inside sigmoid's
    range); gates that saturate later in training (only the first steps are judged); weights
    loaded from a checkpoint or set by hand (saturation may be what they learned); a final
    sigmoid for 0/1 targets, also a saturated one that `binary_cross_entropy` takes (its log
    cancels the sigmoid's flat tails: the gradient to the logits is `p - y`); the tanh and sigmoid inside `nn.LSTM`/`nn.GRU`; GELU, SiLU and
    other activations; a tanh applied to the data itself (no layer before it); raw pixels,
    which `pixels-not-scaled` reports.
    """

    code = "GD177"
    slug = "activations-saturated"
    severity = Severity.WARNING
    summary = ("a tanh/sigmoid layer is saturated from initialisation: most inputs beyond |x| > 3 "
               "(tanh) or 6 (sigmoid) at the first steps, so the layers before it barely train")
    fix = ("initialise the layer for its width (Xavier: std ≈ 1/sqrt(fan_in)) or standardise its "
           "inputs")

    def check(self, a):
        raw_pixels = bool(a.of_kind("pixels_unscaled"))
        by_loc: dict = {}
        for e in a.of_kind("activation_saturated"):
            if e.get("data_input") and raw_pixels:
                continue  # pixels-not-scaled names the cause
            by_loc.setdefault(e.loc, []).append(e)
        for loc, events in by_loc.items():
            yield self._finding(a, loc, events)

    def _finding(self, a, loc, events):
        first = events[0]
        fns = sorted({e["fn"] for e in events})
        layers = sorted({e["module"] for e in events})
        names = [e["layer"] for e in events if e.get("layer")]
        shares = [s for e in events for s in e.get("shares") or ()]
        count = len(events)
        what = (f"{count} {'/'.join(layers)} layers" if count > 1 else f"a {layers[0]}")
        if names:
            what += f" ({', '.join(f'`{n}`' for n in names)})"
        bounds = " / ".join(f"|x| > {e_t:g} ({fn})" for fn, e_t in
                            sorted({(e["fn"], e["threshold"]) for e in events}))
        if first.get("init"):
            where = "this initialisation leaves"
            fix = ("initialise for the layer's width: nn.init.xavier_uniform_(w, gain=nn.init."
                   "calculate_gain('tanh')) or nn.init.normal_(w, std=1 / sqrt(fan_in))")
        elif first.get("data_input"):
            where = "the layer built here, fed the data as it is, leaves"
            fix = ("standardise the inputs ((x - mean) / std per feature, computed on the "
                   "training data) before this layer, or put a normalisation layer before "
                   "the activation")
        else:
            where = "the layer built here leaves"
            fix = ("scale what this layer takes (a normalisation layer before the activation) "
                   "or initialise it for its width (Xavier)")
        lo, hi = f"{min(shares):.0%}", f"{max(shares):.0%}"
        return self.finding(
            f"{where} {what} feeding {' and '.join(fns)} saturated at the first steps: "
            f"{lo if lo == hi else f'{lo} to {hi}'} of the inputs were beyond {bounds} at each "
            f"call, where the gradient through {' and '.join(fns)} is below 1% of its largest, "
            f"so the layers before it barely train",
            loc, step=1, fix=fix,
            evidence={"fn": fns, "modules": layers, "names": names, "shares": shares,
                      "layers": count,
                      "init": bool(first.get("init"))})
