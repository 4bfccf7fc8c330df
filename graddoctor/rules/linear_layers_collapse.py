from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule

_SHOWN = {"NativeDropout": "dropout", "View": "a view", "UnsafeView": "a view",
          "ReshapeAlias": "a reshape", "Transpose": "a transpose", "T": "a transpose",
          "Permute": "a permute", "Clone": "a copy", "ToCopy": "a cast", "Flatten": "a flatten"}


class LinearLayersCollapse(Rule):
    """
    ## What it does
    Finds two `nn.Linear` layers where the second reads the first one's output with nothing
    nonlinear between them (only dropout, views, reshapes or transposes), and the hidden width
    is no bottleneck (at least the smaller of the pair's input and output widths): the
    activation between them is missing (`nn.ReLU()` left out of an `nn.Sequential`,
    `self.fc2(self.fc1(x))`), where an activation was evidently meant: the `nn.Sequential`
    listing both lists an activation elsewhere; or the second layer's output is what a loss
    function (`cross_entropy`, `mse_loss`...) compares with the targets and the model uses
    activations elsewhere (a module, or a call in the `forward` that runs the pair) or is three
    or more linear layers deep. Both layers are children of the
    module that calls the second. Read at the forwards of the first 3 backwards. It points at the
    second layer's call in `forward`, or at its line in the `nn.Sequential` that lists it.

    ## Why is this bad?
    `W2 (W1 x + b1) + b2` is one linear map of `x`: the pair can represent nothing a single
    `nn.Linear` could not, so the extra layer adds parameters and compute but no capacity. An
    MLP whose activations are all missing is a linear model, whatever its depth, and cannot fit
    anything a linear model cannot; the loss plateaus where a linear fit stops. Nothing fails.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(20, 64), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    ```

    ## Use instead
    ```python
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    ```

    ## Stays silent on
    An activation, a normalisation (LayerNorm, BatchNorm), a residual sum, a product or a
    concatenation between the layers; a low-rank factorisation (`Linear(512, 64)` then
    `Linear(64, 512)`, LoRA's A and B); a linear head on a frozen layer's output (a probe); a
    layer of one model reading another model's output (a predictor head on an encoder's last
    layer: the two layers are not children of one module);
    layers a library's model places (transformers, timm); layers built from `F.linear` by hand;
    one output read by several linear layers (q, k, v; a gate and its value); an activation
    followed by a dropout with p=0 (a ViT's default: it hands back its input); a stack where no
    activation was evidently meant (a demo's `model(x).sum().backward()`; two linear layers
    before a loss in a model with no activation anywhere: a toy, or linear on purpose).
    """

    code = "GD178"
    slug = "linear-layers-collapse"
    severity = Severity.WARNING
    summary = ("two nn.Linear layers follow each other with no nonlinearity between them: "
               "they compose to one linear map (a missing activation)")
    fix = "put an activation between the two layers (nn.ReLU(), nn.GELU(), F.relu(...))"

    def check(self, a):
        for e in a.of_kind("linear_stack"):
            if not self._meant(a, e):
                continue
            a_in, hidden, out = e["widths"]
            shown = [_SHOWN.get(op, op) for op in e.get("between") or ()]
            between = (f"only {', '.join(dict.fromkeys(shown))} between them" if shown
                       else "nothing between them")
            notes = ()
            first = e.get("first_at")
            if first:
                notes = (Related(Location(str(first[0]), int(first[1]), str(first[2])),
                                 f"the first layer, Linear({a_in}, {hidden})", ()),)
            container = e.get("called_by") == "container"
            fix = (f"add an activation after the Linear({a_in}, {hidden}) in the nn.Sequential: "
                   f"nn.Linear({a_in}, {hidden}), nn.ReLU(), nn.Linear({hidden}, {out})"
                   if container else
                   f"apply an activation to the first layer's output before this layer: "
                   f"e.g. F.relu(...) around the Linear({a_in}, {hidden})'s output")
            yield self.finding(
                f"Linear({hidden}, {out}) reads the output of Linear({a_in}, {hidden}) with "
                f"{between}: the two compose to a single linear map of width {a_in} → {out}, so "
                f"the second adds parameters but no capacity. The activation between them is "
                f"missing (an MLP without activations is a linear model)",
                e.loc, related=notes, step=a.next_step_number(e.seq),
                evidence={"widths": [a_in, hidden, out], "between": e.get("between") or [],
                          "called_by": e.get("called_by"), "chain": e.get("chain")},
                fix=fix)

    @staticmethod
    def _meant(a, e) -> bool:
        """Was an activation evidently meant between the two layers? Their nn.Sequential lists
        one elsewhere; or the pair ends in the loss's prediction and the model uses activations
        elsewhere (a module in it, a call in the forward that runs the pair) or is three or
        more linear layers deep (a deep model with none at all). Two linear layers alone before
        a loss, in a model with no activation anywhere, may be a toy or linear on purpose."""
        if e.get("listed"):
            return True
        if not e.get("ends_in_loss"):
            return False
        if e.get("activations_in_model") or (e.get("chain") or 0) >= 3:
            return True
        return e.get("called_by") == "user" and e.loc is not None \
            and a.source.function_calls_any(e.loc.path, e.loc.line, _ACTIVATION_CALLS)


_ACTIVATION_CALLS = frozenset({
    "relu", "relu_", "relu6", "gelu", "tanh", "sigmoid", "silu", "elu", "selu", "celu",
    "leaky_relu", "softplus", "mish", "hardswish", "hardtanh", "hardsigmoid", "logsigmoid",
    "prelu", "rrelu", "glu", "softsign", "tanhshrink"})
