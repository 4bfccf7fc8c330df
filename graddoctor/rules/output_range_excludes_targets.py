from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from .model_end import model_end_line

_RANGES = {"sigmoid": "(0, 1)", "softmax": "(0, 1)", "tanh": "(-1, 1)", "relu": "[0, inf)",
           "softplus": "(0, inf)", "exp": "(0, inf)"}

_EFFECT = {
    "sigmoid": "the gradient drives the {} into saturation, where it vanishes",
    "relu": "each negative target pulls its output to 0, where the ReLU passes no gradient",
    "softplus": "the negative targets pull the output towards 0 without reaching it",
}
_EFFECT["tanh"] = _EFFECT["softmax"] = _EFFECT["sigmoid"]
_EFFECT["exp"] = _EFFECT["softplus"]
# activations whose range has no upper bound to scale the targets into: the activation itself
# is the line to change, when it is the model's own last operation
_AT_MODEL_END = ("relu", "softplus")


class OutputRangeExcludesTargets(Rule):
    """
    ## What it does
    Finds a regression loss (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss` or their
    `nn` modules) whose prediction comes straight out of a bounded activation — sigmoid,
    softmax or tanh, or relu / softplus / exp, which never go below 0 — while a quarter or more
    of its targets lie outside that range (prices in the tens through a sigmoid; standardised
    targets, half of them negative, through a final ReLU). Judged on the first calls, from the
    prediction's autograd graph and one small reduction over the targets.

    ## Why is this bad?
    The model cannot output those targets whatever its weights: the loss has a floor above
    zero, and the gradient keeps pushing the activation into saturation (a sigmoid's gradient
    vanishes there, a ReLU's dies), so training stalls on a model that is wrong by
    construction.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    loss = F.mse_loss(model(x), price)  # prices around 50
    ```

    ## Use instead
    ```python
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))  # a linear output
    loss = F.mse_loss(model(x), price)  # or scale the targets into the activation's range
    ```

    ## Stays silent on
    Targets inside the range (an autoencoder's [0, 1] pixels through a sigmoid, a GAN's [-1, 1]
    images through tanh, counts through a ReLU); an activation scaled or shifted after it
    (`255 * sigmoid(x)`), or clamped; fewer than a quarter of the targets outside (outliers);
    losses with no gradient. A final ReLU or softplus that is the model's own last operation
    (the last element of its `nn.Sequential`, the `return` of its `forward`, one such place in
    the file) is the line shown, with the loss call related.
    """

    code = "GD228"
    slug = "output-range-excludes-targets"
    severity = Severity.WARNING
    summary = "a regression loss compares a bounded activation's output with targets outside its range"
    fix = ("end the model with a linear output (no activation), or scale the targets into the "
           "activation's range")

    def check(self, a):
        for e in a.of_kind("output_range"):
            activation = e["activation"]
            span = _RANGES.get(activation, f"[{e['low']}, {e['high']}]")
            loc, related = e.loc, ()
            if activation in _AT_MODEL_END and loc is not None:
                line = model_end_line(a.source.tree(loc.path), activation)
                text = a.source.line_text(loc.path, loc.line)
                if line is not None and line != loc.line and activation not in text.split("#")[0]:
                    related = (Related(loc, "the loss that compares its output with the targets"),)
                    loc = Location(loc.path, line)
            yield self.finding(
                f"{e['fn']} compares a prediction that comes out of {activation} (always in "
                f"{span}) with targets from {e['target_low']:.3g} to {e['target_high']:.3g}: "
                f"{e['outside']:.0%} of them lie outside what the model can output, so the loss "
                f"cannot reach 0 and {_EFFECT.get(activation, _EFFECT['sigmoid']).format(activation)}",
                loc, related=related,
                fix=(f"remove the final {activation} (a linear output) for these targets, or "
                     f"scale the targets into {span}"),
                evidence={"fn": e["fn"], "activation": activation, "outside": e["outside"],
                          "target_low": e["target_low"], "target_high": e["target_high"]})
