from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_DROPOUTS = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                       "FeatureAlphaDropout"})


def _rate(call: str) -> float | None:
    """The rate a dropout's construction gives as a number (``nn.Dropout(0.5)``,
    ``nn.Dropout(p=0.3)``), or None."""
    found = re.fullmatch(r"[\w.]+\(\s*(?:p\s*=\s*)?([0-9.eE+-]+)\s*(?:,.*)?\)", call, re.S)
    try:
        return float(found.group(1)) if found else None
    except ValueError:
        return None


class DropoutOnOutput(Rule):
    """
    ## What it does
    Finds a loss whose prediction is the output of a dropout layer: at one of the first 4
    backwards, the logits or values that `cross_entropy`, `nll_loss`, `mse_loss`, `l1_loss`,
    `smooth_l1_loss`, `huber_loss`, `kl_div`, `poisson_nll_loss` or
    `binary_cross_entropy(_with_logits)` reads come straight
    out of an `nn.Dropout` (or `Dropout1d/2d/3d`, `AlphaDropout`) run in training mode, past
    reshapes, slices and `log_softmax` only. Read from the loss's autograd graph; it points at
    the line that called the dropout module, or, when a container (`nn.Sequential`) ran it, at
    the one construction of a dropout with that rate.

    ## Why is this bad?
    Dropout after the last layer zeroes a share p of the logits or predictions at every step and
    scales the others by 1 / (1 - p): a logit set to 0 or a regression output set to 0 is an
    error the model is punished for at random, so the gradient is mostly noise the model cannot
    learn from, and at evaluation (dropout off) the outputs are on another scale than in
    training. It trains without an error, to a worse model.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5), nn.Dropout(0.5))
    loss = F.cross_entropy(model(x), y)
    ```

    ## Use instead
    ```python
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 5))
    ```

    ## Stays silent on
    Dropout before the last layer; dropout inside an encoder whose output is normalised, pooled
    or projected before the loss (SimCSE's dropout as augmentation, R-Drop); a dropout's output
    used as a target under `no_grad`; `F.dropout` called by hand; a dropout a library's model
    places (T5's after its final norm, read by a feature loss); Monte Carlo dropout at
    evaluation (no backward); dropout with p=0.
    """

    code = "GD160"
    slug = "dropout-on-output"
    severity = Severity.WARNING
    summary = ("a loss reads a dropout layer's output directly: dropout after the last layer "
               "zeroes part of the logits or predictions at every step")
    fix = "move the dropout before the last layer (the head learns from what it lets through)"

    def check(self, a):
        for e in a.of_kind("dropout_on_output"):
            loc, text = e.loc, None
            if loc is not None and not e.get("direct"):
                # run by a container (nn.Sequential) from this line: the dropout's place in it,
                # its construction, is where the fix goes
                made = [(line, call) for line, call, _ in a.source.calls_named(loc.path, _DROPOUTS)
                        if _rate(call) == e["p"]]
                if len(made) == 1:
                    loc, text = Location(loc.path, made[0][0]), made[0][1]
            what = f"`{text}`" if text else f"a {e['module']}(p={e['p']:g})"
            yield self.finding(
                f"{e['fn']} reads the output of {what} directly: in training the dropout zeroes "
                f"{e['p']:.0%} of the {'logits' if 'entropy' in e['fn'] else 'predictions'} the "
                f"loss compares with the targets and scales the rest by {1 / (1 - e['p']):.3g}, "
                f"so every step punishes the model for values it never produced, and "
                f"evaluation (dropout off) sees outputs on another scale",
                loc, step=a.next_step_number(e.seq),
                evidence={"module": e["module"], "p": e["p"], "fn": e["fn"]})
